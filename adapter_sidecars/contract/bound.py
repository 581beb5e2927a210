"""The contract suite bound to the plugin's fixtures: the test module ``vidroute-contract`` runs.

Not named ``test_*.py`` on purpose: it is collected only when passed explicitly, so running
pytest over the source tree does not pick it up without an adapter to test.
"""

from adapter_sidecars.contract.load_contract import LoadContract
from adapter_sidecars.contract.suite import (
    CallbackContract,
    CancelContract,
    CompileContract,
    DescribeContract,
    FetchOutputContract,
    GoldenContract,
    JobLifecycleContract,
    RecoveryContract,
    RoutedCompileContract,
    SubmitBoundaryContract,
    UsageContract,
)


class TestDescribe(DescribeContract):
    """Describe agrees with the profile."""


class TestCompile(CompileContract):
    """Compile contract."""


class TestRoutedCompile(RoutedCompileContract):
    """Compile against the routed catalog entry."""


class TestGoldens(GoldenContract):
    """Golden native requests."""


class TestSubmitBoundaries(SubmitBoundaryContract):
    """Submit at every transport boundary."""


class TestRecovery(RecoveryContract):
    """Recovery of unknown submits."""


class TestJobLifecycle(JobLifecycleContract):
    """State mapping, failures, outputs."""


class TestCallbacks(CallbackContract):
    """Callback URLs reach the provider."""


class TestCancel(CancelContract):
    """Cancel semantics."""


class TestUsage(UsageContract):
    """Usage records."""


class TestFetchOutput(FetchOutputContract):
    """Outputs that need the provider's credentials."""


class TestLoad(LoadContract):
    """GetLoad answers (empty allowed)."""
