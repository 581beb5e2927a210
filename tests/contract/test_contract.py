"""The shared adapter contract suite (design 9.25) bound to runway, veo and selfhosted.

Each class inherits one abstract contract; the conftest parametrizes it over the providers and
the profiles' capability flags deselect the tests that do not apply to a provider.
"""

from adapter_sidecars.contract.suite import (
    CallbackContract,
    CancelContract,
    CompileContract,
    DescribeContract,
    GoldenContract,
    JobLifecycleContract,
    RecoveryContract,
    SubmitBoundaryContract,
    UsageContract,
)


class TestDescribe(DescribeContract):
    """Describe declares what each profile assumes."""


class TestCompile(CompileContract):
    """Compile: valid specs compile deterministically, invalid ones never reach a provider."""


class TestGoldens(GoldenContract):
    """Golden native requests of tests/testdata/<adapter>/ (rewrite with --update-goldens)."""


class TestSubmitBoundaries(SubmitBoundaryContract):
    """Submit outcomes at each transport boundary, checked against emulator truth."""


class TestRecovery(RecoveryContract):
    """Recovery of UNKNOWN submits and idempotent resubmits."""


class TestJobLifecycle(JobLifecycleContract):
    """State mapping, failure classes, terminal stability, outputs."""


class TestCallbacks(CallbackContract):
    """Callback URLs reach the provider (dedup and ordering are the control plane's)."""


class TestCancel(CancelContract):
    """Cancel: acknowledged, idempotent, never rewrites a real outcome."""


class TestUsage(UsageContract):
    """Usage records for reconciliation."""
