"""The shared adapter contract suite (design 9.25) bound to runway, veo and selfhosted.

The same bound classes `vidroute-contract` runs against a third-party adapter
(`adapter_sidecars.contract.bound`); here the conftest parametrizes them over our three
providers and the profiles' capability flags deselect the tests that do not apply.
"""

from adapter_sidecars.contract.bound import (
    TestCallbacks,
    TestCancel,
    TestCompile,
    TestDescribe,
    TestFetchOutput,
    TestGoldens,
    TestJobLifecycle,
    TestRecovery,
    TestRoutedCompile,
    TestSubmitBoundaries,
    TestUsage,
)

__all__ = [
    "TestCallbacks",
    "TestCancel",
    "TestCompile",
    "TestDescribe",
    "TestFetchOutput",
    "TestGoldens",
    "TestJobLifecycle",
    "TestRecovery",
    "TestRoutedCompile",
    "TestSubmitBoundaries",
    "TestUsage",
]
