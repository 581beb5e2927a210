"""Route replay (design 9.25.4): a candidate routing policy over recorded decisions.

Admin only. The policy document is validated as a publication's is, before any decision is
read: with `validate` (the control plane wires `RoutingPolicyService.validate`) its schema and
ranges, the shadow version it names, and the compile check of its samples against the current
catalog; without it (a bare service) the schema and ranges only
(`policy_document.parse_policy_document`). Every problem is one field violation under
``policy_document.`` (INVALID_ARGUMENT). Then the decisions of ``[since, until)`` (optionally
one tenant's) are read page by page (`persistence.replay_reads`) and folded by
`domain.routing.replay`, which calls no provider and writes nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from controlplane.domain import scoring
from controlplane.domain.routing.policy_document import PolicyDocument, parse_policy_document
from controlplane.domain.routing.replay import Recorded, ReplayReport, ReplayTally
from controlplane.persistence.database import Database
from controlplane.persistence.replay_reads import Cursor
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.validation import IDENTIFIER_RE, FieldViolation

# A publication's validation: the document and its resolved shadow, or `InvalidSpec`.
Validator = Callable[[str], Awaitable[tuple[PolicyDocument, scoring.RoutingPolicy | None]]]


async def _parse_only(text: str) -> tuple[PolicyDocument, scoring.RoutingPolicy | None]:
    doc = parse_policy_document(text)
    return doc, doc.shadow


PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class ReplayInput:
    policy_document: str
    since: datetime | None = None
    until: datetime | None = None  # None: now
    tenant_id: str = ""


class ReplayService:
    def __init__(
        self,
        db: Database,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        page_size: int = PAGE_SIZE,
        validate: Validator | None = None,
    ) -> None:
        self._db, self._clock, self._page_size = db, clock, page_size
        self._validate = validate or _parse_only

    async def replay(self, query: ReplayInput, caller: Caller = SYSTEM) -> ReplayReport:
        ensure_admin(caller, "ReplayRoutes")
        violations: list[FieldViolation] = []
        if query.tenant_id and not IDENTIFIER_RE.fullmatch(query.tenant_id):
            violations.append(FieldViolation("tenant_id", f"must match {IDENTIFIER_RE.pattern}"))
        until = query.until or self._clock()
        if query.since is not None and query.since >= until:
            violations.append(FieldViolation("since", "must be before until"))
        policy: scoring.RoutingPolicy | None = None
        if not query.policy_document.strip():
            violations.append(FieldViolation("policy_document", "is required"))
        else:
            try:
                policy = (await self._validate(query.policy_document))[0].policy
            except InvalidSpec as exc:  # its paths are inside the document
                violations.extend(
                    FieldViolation(f"policy_document.{v.field}", v.description)
                    for v in exc.violations
                )
        if violations or policy is None:
            raise InvalidSpec(violations)
        tally = ReplayTally(policy)
        after: Cursor | None = None
        while True:
            async with self._db.reads() as reads:
                page = await reads.decision_page(
                    since=query.since,
                    until=until,
                    tenant_id=query.tenant_id,
                    after=after,
                    limit=self._page_size,
                )
            tally.add_page(Recorded(str(r.task_id), r.decision_no, r.snapshot) for r in page)
            if len(page) < self._page_size:
                return tally.report()
            after = page[-1].cursor
