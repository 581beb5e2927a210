"""The adapter contract suite: abstract test classes every provider adapter must pass.

Bind them to an adapter by subclassing with a ``Test`` name in a module that has the contract
plugin's fixtures (``adapter_stub``, ``emulator``, ``adapter_profile``, ...)::

    class TestSubmitBoundaries(SubmitBoundaryContract):
        pass

or run them without writing any code with ``vidroute-contract`` (see README.md).
Capability flags of the profile select which tests apply (``contract_requires`` markers).
"""

from adapter_sidecars.contract.compile_contract import (
    CompileContract,
    DescribeContract,
    GoldenContract,
    RoutedCompileContract,
)
from adapter_sidecars.contract.fetch_contract import FetchOutputContract
from adapter_sidecars.contract.lifecycle_contract import (
    CallbackContract,
    CancelContract,
    JobLifecycleContract,
    UsageContract,
)
from adapter_sidecars.contract.recovery_contract import RecoveryContract
from adapter_sidecars.contract.submit_contract import SubmitBoundaryContract

ALL_CONTRACTS = (
    DescribeContract,
    CompileContract,
    RoutedCompileContract,
    GoldenContract,
    SubmitBoundaryContract,
    RecoveryContract,
    JobLifecycleContract,
    CallbackContract,
    CancelContract,
    UsageContract,
    FetchOutputContract,
)

__all__ = [
    "ALL_CONTRACTS",
    "CallbackContract",
    "CancelContract",
    "CompileContract",
    "DescribeContract",
    "FetchOutputContract",
    "GoldenContract",
    "JobLifecycleContract",
    "RecoveryContract",
    "RoutedCompileContract",
    "SubmitBoundaryContract",
    "UsageContract",
]
