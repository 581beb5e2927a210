"""One adapter under test: its profile, the harness features around it, and its addresses."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapter_sidecars.contract.profile import CAPABILITY_FLAGS, AdapterProfile, ProfileError

#: Flags about the harness rather than the adapter. ``unresolvable_adapter``: a second instance
#: of the adapter whose provider host does not resolve (for the DNS boundary of design 9.25.3).
HARNESS_FEATURES = frozenset({"unresolvable_adapter"})


@dataclass(frozen=True)
class ContractTarget:
    """What the suite is run against; known at collection time, before anything starts."""

    profile: AdapterProfile
    harness_features: frozenset[str] = field(default_factory=frozenset)

    @property
    def id(self) -> str:
        return self.profile.name

    def has(self, flag: str) -> bool:
        if flag in HARNESS_FEATURES:
            return flag in self.harness_features
        if flag not in CAPABILITY_FLAGS:
            known = sorted(CAPABILITY_FLAGS | HARNESS_FEATURES)
            raise ProfileError(f"unknown contract flag {flag!r}; known: {known}")
        return self.profile.has(flag)


@dataclass(frozen=True)
class Endpoints:
    """Where the adapter under test and its emulator listen.

    adapter: gRPC ``host:port``. emulator: the emulator's base URL (admin API under
    ``/__emulator/``). unresolvable_adapter: gRPC ``host:port`` of the same adapter configured
    with an unresolvable provider host, when the harness provides one.
    """

    adapter: str
    emulator: str
    unresolvable_adapter: str | None = None
