"""Money operations of the public API (design 9.23): balances, ledger pages, credits, unit costs.

Transport-neutral, like `controlplane.service.tasks`: domain inputs in, persistence records and
domain values out, domain errors raised. The scoping rules are `controlplane.service.access`'s:

- a tenant caller reads only its own balance and ledger; naming another tenant is
  `PermissionDenied` (the request names a tenant, as ListTasks' filter does; no id is walked);
- `credit` (CreditTenant), `unit_costs` and `reconciliation_report` (provider cost is the
  platform's, not a tenant's) need the admin role, checked before anything else; so do the
  disputes, read and moved (`move_dispute`: the console's action, the same move as
  ``vidroute disputes move``, `controlplane.reconciliation.disputes.move_dispute`).

Bad input is `InvalidSpec` (INVALID_ARGUMENT with field violations) before any read or write. A
credit is idempotent by its key: the same key with the same amount, currency and reason returns
the stored entry (created False); with other content it is `IdempotencyConflict`
(ALREADY_EXISTS, as a reused CreateTask key). Admin keys live in their own namespace
(``credit:<key>``) so they can never collide with the platform's ``reserve:<task>`` /
``settle:<task>`` keys under the ledger's UNIQUE(tenant, key).

Ledger pages are keyset pages on the entry id, oldest first, with an opaque token bound to the
tenant it was issued for (a token of another tenant or a forged one is INVALID_ARGUMENT).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from controlplane.domain.disputes import DisputeState
from controlplane.domain.margins import Grouping, MarginRow, margins
from controlplane.domain.unit_cost import UnitCost
from controlplane.persistence import ledger
from controlplane.persistence.database import Database
from controlplane.persistence.disputes import DisputeRow
from controlplane.reconciliation import ReconciliationReport, read_report
from controlplane.reconciliation import disputes as dispute_book
from controlplane.reconciliation.disputes import list_disputes
from controlplane.service.access import SYSTEM, Caller, ensure_admin, ensure_own_tenant
from controlplane.service.tasks import text_violations
from vidroute_core.exceptions import IdempotencyConflict, InvalidSpec
from vidroute_core.validation import IDENTIFIER_RE, MODEL_NAME_RE, FieldViolation

DEFAULT_CURRENCY = "USD"
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_PAGE_TOKEN = 512
MAX_CREDIT_MICROS = 10**15  # one billion currency units: a typo guard, not a business limit
MAX_REASON = 1000
MAX_KEY = 128
DEFAULT_WINDOW = timedelta(days=7)
MAX_WINDOW = timedelta(days=366)
CREDIT_KEY_PREFIX = "credit:"
_CURRENCY_RE = re.compile(r"[A-Z]{3}")
_KEY_RE = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces
_TOKEN_VERSION = 1
_DAY_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class BalanceView:
    tenant_id: str
    balance: ledger.Balance
    read_at: datetime


@dataclass(frozen=True, slots=True)
class ListEntriesInput:
    tenant_id: str = ""
    page_size: int = 0
    page_token: str = ""
    #: Filters (empty: none): a task id, and UTC days (inclusive) the entries were written on.
    task_id: str = ""
    from_date: str = ""
    to_date: str = ""

    def scope(self, tenant: str) -> str:
        """What a page token is bound to: the tenant, and the filters when any."""
        filters = (self.task_id, self.from_date, self.to_date)
        return tenant if not any(filters) else "\x1f".join((tenant, *filters))


@dataclass(frozen=True, slots=True)
class CreditInput:
    tenant_id: str
    amount_micros: int
    currency: str
    idempotency_key: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class UnitCostsInput:
    provider: str = ""
    model: str = ""
    window: timedelta | None = None  # None or zero: DEFAULT_WINDOW
    end: datetime | None = None  # None: now


@dataclass(frozen=True, slots=True)
class UnitCostReport:
    rows: tuple[UnitCost, ...]
    start: datetime
    end: datetime


def _tenant_violations(field: str, tenant: str) -> list[FieldViolation]:
    if tenant and not IDENTIFIER_RE.fullmatch(tenant):
        return [FieldViolation(field, f"must match {IDENTIFIER_RE.pattern}")]
    return []


def _currency_violations(currency: str, *, required: bool) -> list[FieldViolation]:
    if not currency:
        return [FieldViolation("currency", "is required")] if required else []
    if not _CURRENCY_RE.fullmatch(currency):
        return [FieldViolation("currency", "must be an ISO 4217 code: three upper-case letters")]
    return []


def _key_violations(key: str) -> list[FieldViolation]:
    if not key:
        return [FieldViolation("idempotency_key", "is required")]
    if len(key) > MAX_KEY:
        return [FieldViolation("idempotency_key", f"must be at most {MAX_KEY} characters")]
    if not _KEY_RE.fullmatch(key):
        return [FieldViolation("idempotency_key", "must be printable ASCII without spaces")]
    return []


def _scoped_tenant(caller: Caller, requested: str, violations: list[FieldViolation]) -> str:
    """The tenant a read is for: the caller's own by default; an admin must name one."""
    violations.extend(_tenant_violations("tenant_id", requested))
    if not requested and caller.tenant_id is None:
        violations.append(FieldViolation("tenant_id", "is required for an admin caller"))
    if violations:
        raise InvalidSpec(violations)
    tenant = requested or str(caller.tenant_id)
    ensure_own_tenant(caller, tenant)
    return tenant


def _fingerprint(tenant: str) -> str:
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


def encode_page_token(after_id: int, tenant: str) -> str:
    raw = json.dumps({"v": _TOKEN_VERSION, "after": after_id, "t": _fingerprint(tenant)})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_page_token(token: str, tenant: str) -> int:
    """The entry id a token continues after; `InvalidSpec` for anything this service did not
    issue for `tenant`."""
    bad = InvalidSpec([FieldViolation("page_token", "not a page token issued for this tenant")])
    if len(token) > MAX_PAGE_TOKEN or not token.isascii():
        raise bad
    try:
        data = json.loads(base64.urlsafe_b64decode((token + "=" * (-len(token) % 4)).encode()))
        after = data["after"]
        ok = data["v"] == _TOKEN_VERSION and data["t"] == _fingerprint(tenant)
        ok = ok and isinstance(after, int) and not isinstance(after, bool) and 0 < after < 2**63
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError) as exc:
        raise bad from exc
    if not ok:
        raise bad
    return int(after)


def _content_hash(amount_micros: int, currency: str, reason: str) -> str:
    raw = json.dumps([amount_micros, currency, reason])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


class BillingService:
    """Balances, ledger pages, admin credits and unit costs over one `Database`."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = utcnow) -> None:
        self._db = db
        self._clock = clock

    async def balance(self, tenant_id: str, currency: str, caller: Caller = SYSTEM) -> BalanceView:
        violations = _currency_violations(currency, required=False)
        tenant = _scoped_tenant(caller, tenant_id, violations)
        now = self._clock()
        async with self._db.reads() as reads:
            figures = await reads.balance(tenant, currency or DEFAULT_CURRENCY)
        return BalanceView(tenant, figures, now)

    async def list_entries(
        self, query: ListEntriesInput, caller: Caller = SYSTEM
    ) -> tuple[list[ledger.CreditEntry], str | None]:
        """One page of the tenant's entries (increasing id) and the next page's token."""
        violations: list[FieldViolation] = []
        tenant = _scoped_tenant(caller, query.tenant_id, violations)
        task_id: int | None = None
        if query.task_id:
            if query.task_id.isascii() and query.task_id.isdigit() and len(query.task_id) < 19:
                task_id = int(query.task_id)
            else:
                violations.append(FieldViolation("task_id", "must be a decimal task id"))
        bounds: list[datetime | None] = []
        for name, raw, shift in (("from_date", query.from_date, 0),
                                 ("to_date", query.to_date, 1)):  # fmt: skip
            try:
                day = _optional_day(name, raw)
            except InvalidSpec as exc:
                violations.extend(exc.violations)
                day = None
            bounds.append(
                None if day is None
                else datetime.combine(day + timedelta(days=shift), datetime.min.time(), tzinfo=UTC)
            )  # fmt: skip
        if violations:
            raise InvalidSpec(violations)
        scope = query.scope(tenant)
        after = decode_page_token(query.page_token, scope) if query.page_token else 0
        size = DEFAULT_PAGE_SIZE if query.page_size <= 0 else min(query.page_size, MAX_PAGE_SIZE)
        async with self._db.reads() as reads:
            rows = await reads.credit_entries(
                tenant, after, size + 1, task_id=task_id, start=bounds[0], end=bounds[1]
            )
        page = list(rows[:size])
        more = len(rows) > size
        return page, (encode_page_token(page[-1].id, scope) if more else None)

    async def credit(
        self, cmd: CreditInput, caller: Caller = SYSTEM
    ) -> tuple[ledger.CreditEntry, bool]:
        """Write a CREDIT entry, or return the one this key already wrote (same content)."""
        ensure_admin(caller, "CreditTenant")
        violations: list[FieldViolation] = []
        if not cmd.tenant_id:
            violations.append(FieldViolation("tenant_id", "is required"))
        violations += _tenant_violations("tenant_id", cmd.tenant_id)
        if not 0 < cmd.amount_micros <= MAX_CREDIT_MICROS:
            violations.append(
                FieldViolation("amount_micros", f"must be between 1 and {MAX_CREDIT_MICROS}")
            )
        violations += _currency_violations(cmd.currency, required=True)
        violations += _key_violations(cmd.idempotency_key)
        violations += text_violations("reason", cmd.reason, MAX_REASON)
        if violations:
            raise InvalidSpec(violations)
        now = self._clock()
        key = CREDIT_KEY_PREFIX + cmd.idempotency_key
        try:
            async with self._db.unit(now) as u:
                entry, created = await u.append_credit(
                    cmd.tenant_id, cmd.amount_micros, cmd.currency, key,
                    actor=caller.name, reason=cmd.reason,
                )  # fmt: skip
        except ledger.CreditKeyConflict as exc:  # the key holds another amount or currency
            entry, created = exc.stored, False
        if not created and (entry.amount_micros, entry.currency, entry.reason) != (
            cmd.amount_micros,
            cmd.currency,
            cmd.reason,
        ):
            raise IdempotencyConflict(
                cmd.idempotency_key,
                _content_hash(entry.amount_micros, entry.currency, entry.reason),
                _content_hash(cmd.amount_micros, cmd.currency, cmd.reason),
            )
        return entry, created

    async def unit_costs(self, query: UnitCostsInput, caller: Caller = SYSTEM) -> UnitCostReport:
        """Unit cost of successful delivery per provider/model over the window (9.23)."""
        ensure_admin(caller, "GetUnitCosts")
        violations = _tenant_violations("provider", query.provider)
        if query.model and not MODEL_NAME_RE.fullmatch(query.model):
            violations.append(FieldViolation("model", f"must match {MODEL_NAME_RE.pattern}"))
        window = query.window or DEFAULT_WINDOW
        if window < timedelta(0) or window > MAX_WINDOW:
            violations.append(
                FieldViolation("window", f"must be between 0 and {MAX_WINDOW.days} days")
            )
        if violations:
            raise InvalidSpec(violations)
        end = query.end or self._clock()
        start = end - window
        async with self._db.reads() as reads:
            rows = await reads.unit_costs(
                start, end, provider=query.provider or None, model=query.model or None
            )
        return UnitCostReport(tuple(rows), start, end)

    async def reconciliation_report(
        self, day: str, caller: Caller = SYSTEM
    ) -> ReconciliationReport:
        """The stored reconciliation report of `day` ("YYYY-MM-DD", UTC; empty: yesterday).

        Read only: the report is what `vidroute reconcile` wrote (`controlplane.reconciliation`);
        a day never reconciled is an empty report."""
        ensure_admin(caller, "GetReconciliationReport")
        return await read_report(self._db, parse_day(day, self._clock()))

    async def disputes(
        self, state: str, first: str, last: str, caller: Caller = SYSTEM
    ) -> list[DisputeRow]:
        """Booked losses and their disputes (``vidroute disputes`` writes them), oldest first;
        `state` empty means all, `first` / `last` bound the bill days (empty: unbounded)."""
        ensure_admin(caller, "ListDisputes")
        start = _optional_day("from_date", first)
        end = _optional_day("to_date", last)
        return await list_disputes(self._db, state=state, start=start, end=end)

    async def move_dispute(self, move: DisputeMoveInput, caller: Caller = SYSTEM) -> DisputeRow:
        """Move a booked loss's dispute (OPEN -> DISPUTED -> REFUNDED | WRITTEN_OFF) with its
        event, the caller as the actor; an illegal move or a refund out of range is refused
        by the domain (`controlplane.domain.disputes.move`) with nothing written."""
        ensure_admin(caller, "MoveDispute")
        violations = []
        targets = {s.value for s in DisputeState} - {DisputeState.OPEN.value}
        target = move.target.strip().upper()
        if target not in targets:
            violations.append(
                FieldViolation("target", f"must be one of {', '.join(sorted(targets))}")
            )
        reason = move.reason.strip()
        if not reason:
            violations.append(FieldViolation("reason", "required: why the dispute moves"))
        violations += text_violations("reason", reason, MAX_REASON)
        if move.refunded_micros < 0:
            violations.append(FieldViolation("refunded_micros", "must not be negative"))
        if violations:
            raise InvalidSpec(violations)
        actor = caller.name or caller.role.value
        return await dispute_book.move_dispute(
            self._db,
            move.dispute_id,
            DisputeState(target),
            actor=f"console:{actor}",
            reason=reason,
            refunded_micros=move.refunded_micros,
            now=self._clock(),
        )

    async def margins(self, query: MarginsInput, caller: Caller = SYSTEM) -> list[MarginRow]:
        """Revenue, provider cost, platform loss and margin over UTC days (inclusive), grouped
        (`controlplane.domain.margins`)."""
        ensure_admin(caller, "GetMargins")
        violations = []
        days = []
        for name, raw in (("from_date", query.first), ("to_date", query.last)):
            try:
                if not _DAY_RE.fullmatch(raw):
                    raise ValueError(raw)
                days.append(date.fromisoformat(raw))
            except ValueError:
                violations.append(FieldViolation(name, "must be a date YYYY-MM-DD"))
        if not violations and not timedelta(0) <= days[1] - days[0] <= MAX_WINDOW:
            violations.append(
                FieldViolation("to_date", f"must be 0..{MAX_WINDOW.days} days after from_date")
            )
        if violations:
            raise InvalidSpec(violations)
        start = datetime.combine(days[0], datetime.min.time(), tzinfo=UTC)
        end = datetime.combine(days[1] + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
        async with self._db.reads() as reads:
            facts = await reads.money_facts(start, end)
        return margins(facts, query.by)


@dataclass(frozen=True, slots=True)
class DisputeMoveInput:
    """One dispute move: `target` DISPUTED, REFUNDED or WRITTEN_OFF (any case); a refund
    records `refunded_micros` (1..the booked loss), every other move 0."""

    dispute_id: int
    target: str
    reason: str
    refunded_micros: int = 0


@dataclass(frozen=True, slots=True)
class MarginsInput:
    first: str
    last: str
    by: Grouping = Grouping.DAY


def _optional_day(name: str, raw: str) -> date | None:
    if not raw:
        return None
    try:
        if not _DAY_RE.fullmatch(raw):
            raise ValueError(raw)
        return date.fromisoformat(raw)
    except ValueError as exc:
        raise InvalidSpec([FieldViolation(name, "must be a date YYYY-MM-DD")]) from exc


def parse_day(raw: str, now: datetime) -> date:
    """A report day: ASCII ``YYYY-MM-DD`` that is a real date; empty means yesterday (UTC)."""
    if not raw:
        return (now.astimezone(UTC) - timedelta(days=1)).date()
    try:
        if not _DAY_RE.fullmatch(raw):
            raise ValueError(raw)
        return date.fromisoformat(raw)
    except ValueError as exc:
        raise InvalidSpec([FieldViolation("date", "must be a date YYYY-MM-DD")]) from exc
