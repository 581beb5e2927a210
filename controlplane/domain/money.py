"""Money rules of design 9.23.1 / 9.16.4: estimates, reservations, settlement, platform loss.

Pure: integer micros of an ISO-4217 currency everywhere, never a float (a test scans this
module's AST for float literals, ``float()`` calls and true division).

* Estimate: a candidate's versioned price (``provider_price_versions``, micros per output
  second) times the output seconds rounded UP to whole seconds, times the samples
  (`controlplane.domain.routing.candidates.Price.estimate`).
* Reservation (`reservation_amount`): the HIGHEST estimate among the candidates that pass the
  static hard filters now (capability, pinning, region, lifecycle, budget; not breakers or
  capacity, which change by the second), capped by ``routing.max_estimated_cost_micros`` when
  set, so whichever eligible route the task takes is covered. Only candidates priced in the
  reservation's currency (``routing.currency``) count; with none, the cap (or 0).
* Settlement (`settle`): SUCCEEDED charges the delivered attempt's cost (actual when the
  provider reported it, else its estimate) capped by the reservation; FAILED and CANCELLED
  release the reservation. Only the delivered attempt is ever charged, so a duplicate or an
  abandoned unknown submit the platform caused never reaches the tenant.
* Platform loss (`platform_losses`): every other attempt of the task that a provider billed or
  may have billed (a job that existed, an ABANDONED or still SUBMIT_UNKNOWN submit), at its
  actual cost when known else its estimate, with the cause as evidence; and the delivered
  attempt's cost beyond its charge (`underpriced_loss`: a self-hosted base time no estimate
  priced, a charge capped by a low reservation).
* Provider-native units (`units_to_micros`): ``units * micros_per_unit / unit_divisor`` under a
  versioned rate, rounded HALF UP to a whole micro (amounts are never negative).
* Billing policy (`BillingPolicy`): PREPAID needs available credit >= the reservation;
  POSTPAID may go below zero down to ``-overdraft_limit_micros`` (None: unlimited).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.domain.routing.candidates import Candidate, RoutingContext
from controlplane.domain.routing.filters import prefilter
from controlplane.domain.states import MAYBE_BILLED_ATTEMPT_STATES, AttemptState, TaskState
from vidroute_core.exceptions import PreconditionFailed
from vidroute_core.spec import GenerationSpec

__all__ = [
    "BILLED_PER_OUTPUT_SECOND",
    "DEFAULT_CURRENCY",
    "INSUFFICIENT_CREDIT",
    "AttemptBill",
    "BillingMode",
    "BillingPolicies",
    "BillingPolicy",
    "CreditKind",
    "InsufficientCredit",
    "Loss",
    "LossCause",
    "Reservation",
    "Settlement",
    "UsageKind",
    "actual_cost",
    "check_reserve",
    "platform_losses",
    "reservation_amount",
    "reservation_currency",
    "settle",
    "task_reservation",
    "underpriced_loss",
    "units_for",
    "units_to_micros",
]

INSUFFICIENT_CREDIT = "INSUFFICIENT_CREDIT"


class CreditKind(enum.Enum):
    """The tenant's ledger entry kinds; the kind gives the sign of ``amount_micros``."""

    CREDIT = "CREDIT"  # + balance (an admin top-up)
    RESERVE = "RESERVE"  # held until the task's one settlement
    RELEASE = "RELEASE"  # settlement: the hold ends, nothing charged
    CHARGE = "CHARGE"  # settlement: the hold ends, this amount charged (- balance)
    REFUND = "REFUND"  # + balance


class UsageKind(enum.Enum):
    """The platform's provider-cost entry kinds."""

    EXPECTED = "EXPECTED"  # a provider accepted the job: its estimated cost
    ACTUAL = "ACTUAL"  # the job or the usage said what it cost
    PLATFORM_LOSS = "PLATFORM_LOSS"  # provider cost the tenant is not charged


class BillingMode(enum.Enum):
    PREPAID = "prepaid"
    POSTPAID = "postpaid"


@dataclass(frozen=True, slots=True)
class BillingPolicy:
    """How far a tenant's available credit may go; `overdraft_limit_micros` only when POSTPAID."""

    mode: BillingMode = BillingMode.PREPAID
    overdraft_limit_micros: int | None = 0  # POSTPAID: None = unlimited

    @classmethod
    def parse(cls, raw: str) -> BillingPolicy:
        """``prepaid`` | ``postpaid`` (unlimited) | ``postpaid:<overdraft micros>``."""
        mode, _, limit = raw.strip().lower().partition(":")
        try:
            parsed = BillingMode(mode)
        except ValueError:
            msg = f"billing policy must be prepaid or postpaid[:micros], got {raw!r}"
            raise ValueError(msg) from None
        if parsed is BillingMode.PREPAID:
            if limit:
                raise ValueError(f"a prepaid policy takes no overdraft: {raw!r}")
            return cls(BillingMode.PREPAID, 0)
        if not limit:
            return cls(BillingMode.POSTPAID, None)
        if not limit.isdigit() or not limit.isascii():
            raise ValueError(f"overdraft must be whole micros >= 0: {raw!r}")
        return cls(BillingMode.POSTPAID, int(limit))

    def describe(self) -> str:
        if self.mode is BillingMode.PREPAID:
            return "prepaid"
        limit = self.overdraft_limit_micros
        return "postpaid" if limit is None else f"postpaid:{limit}"

    def floor_micros(self) -> int | None:
        """The lowest available balance allowed; None when there is none."""
        if self.mode is BillingMode.PREPAID:
            return 0
        limit = self.overdraft_limit_micros
        return None if limit is None else -limit


@dataclass(frozen=True, slots=True)
class BillingPolicies:
    """The default policy and per-tenant overrides (configured like the auth tenants)."""

    default: BillingPolicy = field(default_factory=BillingPolicy)
    tenants: Mapping[str, BillingPolicy] = field(default_factory=dict)

    def for_tenant(self, tenant_id: str) -> BillingPolicy:
        return self.tenants.get(tenant_id, self.default)

    @classmethod
    def parse(cls, default: str, entries: Iterable[str]) -> BillingPolicies:
        """`default` as in `BillingPolicy.parse`; entries ``tenant=policy`` (``#`` comments)."""
        tenants: dict[str, BillingPolicy] = {}
        for raw in entries:
            for part in raw.split(","):
                item = part.split("#", 1)[0].strip()
                if not item:
                    continue
                tenant, sep, policy = item.partition("=")
                if not sep or not tenant.strip():
                    raise ValueError(f"expected tenant=policy, got {item!r}")
                tenants[tenant.strip()] = BillingPolicy.parse(policy)
        return cls(BillingPolicy.parse(default) if default.strip() else BillingPolicy(), tenants)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What CreateTask holds for a task: the amount, its currency and the tenant's policy."""

    amount_micros: int
    currency: str
    policy: BillingPolicy = field(default_factory=BillingPolicy)

    def __post_init__(self) -> None:
        if self.amount_micros < 0:
            raise ValueError("a reservation is never negative")
        if len(self.currency) != 3:
            raise ValueError(f"currency must be ISO 4217: {self.currency!r}")


class InsufficientCredit(PreconditionFailed):
    """The tenant's available credit does not cover the reservation (FAILED_PRECONDITION)."""


def reservation_amount(estimates: Iterable[int], cap_micros: int = 0) -> int:
    """The highest estimate, capped by `cap_micros` when > 0 (see the module docstring)."""
    highest = max((e for e in estimates if e >= 0), default=None)
    if highest is None:
        return max(0, cap_micros)
    return min(highest, cap_micros) if cap_micros > 0 else highest


def check_reserve(
    tenant_id: str,
    policy: BillingPolicy,
    *,
    balance_micros: int,
    available_micros: int,
    amount_micros: int,
    currency: str,
) -> None:
    """Raise `InsufficientCredit` with the numbers unless the policy allows the reservation."""
    floor = policy.floor_micros()
    if floor is None or available_micros - amount_micros >= floor:
        return
    numbers = {
        "balance_micros": balance_micros,
        "available_micros": available_micros,
        "estimated_cost_micros": amount_micros,
        "shortfall_micros": floor - (available_micros - amount_micros),
    }
    if policy.mode is BillingMode.POSTPAID and policy.overdraft_limit_micros is not None:
        numbers["overdraft_limit_micros"] = policy.overdraft_limit_micros
    raise InsufficientCredit(
        f"tenant {tenant_id} has {available_micros} {currency} micros available "
        f"(balance {balance_micros}); the task's estimate is {amount_micros}",
        numbers,
        reason=INSUFFICIENT_CREDIT,
        labels={
            "tenant_id": tenant_id,
            "currency": currency,
            "billing_policy": policy.describe(),
        },
    )


@dataclass(frozen=True, slots=True)
class Settlement:
    """The one settlement entry of a task: CHARGE `amount_micros`, or RELEASE the hold."""

    kind: CreditKind
    amount_micros: int
    attempt_id: int | None = None
    reason: str = ""


def settle(
    target: TaskState,
    reserved_micros: int,
    *,
    delivered_attempt_id: int | None = None,
    delivered_cost_micros: int | None = None,
) -> Settlement:
    """The settlement of a task entering terminal `target` (see the module docstring)."""
    if target is TaskState.SUCCEEDED and delivered_attempt_id is not None:
        cost = max(0, delivered_cost_micros or 0)
        charged = min(cost, reserved_micros)
        why = "delivered" if charged == cost else f"delivered; cost {cost} capped by reservation"
        return Settlement(CreditKind.CHARGE, charged, delivered_attempt_id, why)
    if target is TaskState.SUCCEEDED:
        # No delivered attempt named: nothing the tenant can be shown to owe.
        return Settlement(CreditKind.RELEASE, reserved_micros, None, "succeeded without attempt")
    if target in (TaskState.FAILED, TaskState.CANCELLED):
        return Settlement(CreditKind.RELEASE, reserved_micros, None, target.value.lower())
    raise ValueError(f"{target.value} is not a terminal task state")


class LossCause(enum.Enum):
    DUPLICATE = "DUPLICATE"  # a second job for a task whose result came from another attempt
    UNKNOWN_SUBMIT = "UNKNOWN_SUBMIT"  # ABANDONED / SUBMIT_UNKNOWN: the provider may bill it
    UNDELIVERED = "UNDELIVERED"  # a job that failed or was cancelled: no result delivered
    UNDERPRICED = "UNDERPRICED"  # the delivery cost more than the tenant was charged for it


@dataclass(frozen=True, slots=True)
class AttemptBill:
    """What loss accounting needs of one attempt."""

    attempt_id: int
    state: AttemptState
    estimated_cost_micros: int
    actual_cost_micros: int | None = None
    provider_job_id: str | None = None


@dataclass(frozen=True, slots=True)
class Loss:
    attempt_id: int
    amount_micros: int
    cause: LossCause
    actual: bool  # the amount is the provider's reported cost, not our estimate


_JOB_ENDED = frozenset({AttemptState.SUCCEEDED, AttemptState.FAILED, AttemptState.CANCELLED})


def platform_losses(
    attempts: Sequence[AttemptBill], delivered_attempt_id: int | None
) -> list[Loss]:
    """Provider cost of the task's attempts the tenant is not charged for (module docstring).

    A rejected submit (no job, definite) costs nothing; a live attempt is not counted yet."""
    out: list[Loss] = []
    for a in attempts:
        if a.attempt_id == delivered_attempt_id:
            continue
        if a.state in MAYBE_BILLED_ATTEMPT_STATES and a.provider_job_id is None:
            cause = LossCause.UNKNOWN_SUBMIT
        elif a.provider_job_id is not None and (
            a.state in _JOB_ENDED or a.state in MAYBE_BILLED_ATTEMPT_STATES
        ):
            cause = (
                LossCause.DUPLICATE if delivered_attempt_id is not None else LossCause.UNDELIVERED
            )
        else:
            continue
        actual = a.actual_cost_micros is not None
        amount = (
            a.actual_cost_micros if a.actual_cost_micros is not None else a.estimated_cost_micros
        )
        out.append(Loss(a.attempt_id, max(0, amount), cause, actual))
    return out


def underpriced_loss(delivered_cost_micros: int, charged_micros: int) -> int:
    """What a delivery cost beyond what its tenant was charged (the charge is capped by the
    reservation, itself an estimate): platform loss, 0 when the charge covered it."""
    return max(0, delivered_cost_micros - charged_micros)


def units_to_micros(units: int, micros_per_unit: int, unit_divisor: int = 1) -> int:
    """``units * micros_per_unit / unit_divisor`` rounded half up (all three integers)."""
    if units < 0 or micros_per_unit < 0 or unit_divisor <= 0:
        raise ValueError("units and rate must be >= 0 and the divisor > 0")
    return (units * micros_per_unit * 2 + unit_divisor) // (2 * unit_divisor)


# Providers whose job API reports no cost: they bill per second of delivered output and charge
# nothing for a blocked, failed or cancelled generation (provider-apis 4.2: Veo). Their actual
# cost is the delivered attempt's own per-second estimate, or 0 when nothing was delivered.
BILLED_PER_OUTPUT_SECOND = frozenset({"google"})  # Veo (Gemini API, Vertex)


def actual_cost(
    provider: str, *, reported_micros: int | None, succeeded: bool, estimated_micros: int
) -> int | None:
    """A finished job's actual provider cost, or None when nobody can know it yet.

    The provider's reported figure wins (Runway's terminal ``cost.credits``, self-hosted GPU
    seconds, both converted by their sidecars); a per-output-second biller is computed."""
    if reported_micros is not None:
        return max(0, reported_micros)
    if provider in BILLED_PER_OUTPUT_SECOND:
        return max(0, estimated_micros) if succeeded else 0
    return None


def units_for(amount_micros: int, micros_per_unit: int, unit_divisor: int = 1) -> int | None:
    """The whole provider units `amount_micros` stands for under a rate, if it is exact."""
    if micros_per_unit <= 0 or unit_divisor <= 0 or amount_micros < 0:
        return None
    units, rest = divmod(amount_micros * unit_divisor, micros_per_unit)
    return units if rest == 0 else None


DEFAULT_CURRENCY = "USD"


def reservation_currency(spec: GenerationSpec) -> str:
    """The currency a task is reserved and settled in: its budget's, else USD."""
    return spec.routing.currency or DEFAULT_CURRENCY


def task_reservation(spec: GenerationSpec, candidates: Sequence[Candidate], now: datetime) -> int:
    """What CreateTask reserves for `spec` (the module docstring's rule): the highest catalog
    estimate among the candidates the static hard filters let through, capped by the budget."""
    currency = reservation_currency(spec)
    eligible = prefilter(spec, candidates, RoutingContext(now=now))
    estimates = [c.price.estimate(spec) for c in eligible if c.price.currency == currency]
    return reservation_amount(estimates, spec.routing.max_estimated_cost_micros)
