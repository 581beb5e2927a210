"""Provider administration (ListProviders, GetProviderHealth, ForceBreaker), transport-neutral.

Reads come from the capability catalog (PostgreSQL) and the process's `HealthMonitor`; a forced
breaker goes through the monitor, which persists the override to ``provider_health_events`` and
publishes it to every replica. Bad input raises `InvalidSpec` (INVALID_ARGUMENT at the edge).
Every operation here needs the admin role (`PermissionDenied` otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from controlplane.capabilities.catalog import candidate_from_record
from controlplane.domain.breaker import BreakerKey, BreakerState, Operation
from controlplane.persistence.catalog import CatalogQueries
from controlplane.scheduling.health import BreakerStatus, HealthMonitor
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from vidroute_core.capabilities.loader import Capability
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.validation import IDENTIFIER_RE, MODEL_NAME_RE, FieldViolation

MAX_REASON_CHARS = 1000


@dataclass(frozen=True, slots=True)
class ProviderAccountView:
    provider: str
    account: str
    region: str
    adapter_address: str
    capabilities: tuple[Capability, ...]


@dataclass(frozen=True, slots=True)
class ForceBreakerInput:
    """`state` None releases an operator override (the breaker then probes, HALF_OPEN)."""

    provider: str
    account: str
    region: str
    model: str
    operation: str
    state: BreakerState | None
    reason: str


class ProviderAdminService:
    def __init__(
        self,
        catalog: CatalogQueries,
        monitor: HealthMonitor,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._catalog, self._monitor, self._clock = catalog, monitor, clock

    async def list_providers(self, caller: Caller = SYSTEM) -> list[ProviderAccountView]:
        """Every account with the capability versions effective now."""
        ensure_admin(caller, "ListProviders")
        records = await self._catalog.effective_capabilities(self._clock())
        caps: dict[int, list[Capability]] = {}
        for record in records:
            candidate = candidate_from_record(record)
            if candidate is not None:
                caps.setdefault(record.account.id, []).append(candidate.capability)
        return [
            ProviderAccountView(
                a.provider,
                a.account_name,
                a.region,
                str(a.config.get("adapter_address", "")),
                tuple(caps.get(a.id, ())),
            )
            for a in await self._catalog.accounts()
        ]

    async def provider_health(
        self, provider: str = "", caller: Caller = SYSTEM
    ) -> list[BreakerStatus]:
        """Breakers known to this replica, after adopting the shared state."""
        ensure_admin(caller, "GetProviderHealth")
        await self._monitor.sync()
        return self._monitor.statuses(provider or None)

    async def force_breaker(self, inp: ForceBreakerInput, caller: Caller = SYSTEM) -> BreakerStatus:
        ensure_admin(caller, "ForceBreaker")
        violations = [
            FieldViolation(name, "is required")
            for name in ("provider", "account", "region", "reason")
            if not getattr(inp, name).strip()
        ]
        violations += [
            FieldViolation(name, f"must match {IDENTIFIER_RE.pattern}")
            for name in ("provider", "account", "region")
            if getattr(inp, name).strip() and not IDENTIFIER_RE.fullmatch(getattr(inp, name))
        ]
        if inp.model and not MODEL_NAME_RE.fullmatch(inp.model):
            violations.append(FieldViolation("model", f"must match {MODEL_NAME_RE.pattern}"))
        if len(inp.reason) > MAX_REASON_CHARS or "\x00" in inp.reason:
            violations.append(
                FieldViolation("reason", f"at most {MAX_REASON_CHARS} characters, no NUL")
            )
        if inp.operation not in Operation.__members__:
            violations.append(
                FieldViolation("operation", f"must be one of {', '.join(Operation.__members__)}")
            )
        if inp.state is BreakerState.HALF_OPEN:
            violations.append(FieldViolation("state", "only OPEN or CLOSED can be forced"))
        if violations:
            raise InvalidSpec(violations)
        key = BreakerKey(inp.provider, inp.account, inp.region, inp.model, Operation(inp.operation))
        return await self._monitor.force(key, inp.state, inp.reason.strip())
