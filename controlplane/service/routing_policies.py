"""Routing policy publication, rollback and canaries, transport-neutral (design 9.13.5, 9.25.5).

PublishRoutingPolicy validates a policy file like a capability publication: its schema and
ranges (`controlplane.domain.routing.policy_document`), its shadow (a version it names must be
published), then the compile check of its samples against the current catalog (`SampleCheck`,
when a scheduler runs here; an API-only replica, ``require_check``, refuses a file with samples
or canaries as FAILED_PRECONDITION ``POLICY_CHECK_UNAVAILABLE`` rather than skip the check).
Every problem is an `InvalidSpec` field violation and nothing is written. A version is
immutable: publishing it again with the same text changes nothing (a retried publish), with
another text is refused. Publishing makes the version active in one unit
with the canaries it starts: a candidate whose canary is new, or whose stages or gates changed,
starts at its first stage; an unchanged one keeps its state (a republish never resets a canary).
A dry run checks everything and writes nothing.

Publication, activation and rollback go through the path every versioned document shares
(`service.versioned`: the diff against the active version, activation now, scheduled or staged,
the audit of each); every activation, whichever its cause, reconciles the canaries in its unit.

RollbackRoutingPolicy makes a published version active again (empty: the one before the active
version that was ever active), with its canaries reconciled as a publication of it would: one whose
state another version's configuration left (other stages or gates) restarts at its first stage,
an unchanged one keeps its state; the dispatchers of every replica use it on their next round.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from controlplane.domain.routing.canary import CanaryStatus
from controlplane.domain.routing.policy_document import (
    CanarySpec,
    PolicyDocument,
    parse_policy_document,
)
from controlplane.domain.scoring import RoutingPolicy
from controlplane.persistence import canaries as canary_store
from controlplane.persistence import routing_policies as store
from controlplane.persistence.database import Database
from controlplane.persistence.unit import SqlUnitOfWork
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from controlplane.service.versioned import DocumentService, VersionedDocuments
from vidroute_core.exceptions import InvalidSpec, PreconditionFailed
from vidroute_core.validation import FieldViolation

log = logging.getLogger(__name__)

DEFAULT_SOURCE = "PublishRoutingPolicy"

SampleChecker = Callable[[PolicyDocument, RoutingPolicy | None], Awaitable[list[FieldViolation]]]


@dataclass(frozen=True, slots=True)
class CanaryView:
    state: canary_store.CanaryRow
    history: tuple[canary_store.TransitionRow, ...]

    @property
    def traffic_percent(self) -> float:
        s = self.state
        if s.status is CanaryStatus.ROLLED_BACK:
            return 0.0
        if s.status is CanaryStatus.PROMOTED:
            return 100.0
        return s.stages[s.stage] if 0 <= s.stage < len(s.stages) else 0.0


def config_key(spec: CanarySpec) -> str:
    """The identity of a canary's configuration: a change restarts it."""
    body: dict[str, object] = {
        "shares": spec.config.shares,
        "gates": asdict(spec.config.gates),
        "vs": asdict(spec.vs_incumbent),
        "threshold": spec.config.value_threshold_micros,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def wanted_canaries(doc: PolicyDocument) -> dict[str, tuple[str, tuple[float, ...]]]:
    """``candidate id -> (config key, stage percents)`` of the canaries `doc` names."""
    return {cid: (config_key(spec), spec.percents) for cid, spec in doc.canaries.items()}


def _utcnow() -> datetime:
    return datetime.now(UTC)


class RoutingPolicyService(DocumentService):
    default_source = DEFAULT_SOURCE

    def __init__(
        self,
        db: Database,
        *,
        sample_check: SampleChecker | None = None,
        on_published: Callable[[], None] | None = None,
        clock: Callable[[], datetime] = _utcnow,
        require_check: bool = False,
        on_schedule: Callable[[], None] | None = None,
    ) -> None:
        self._db, self._check, self._clock = db, sample_check, clock
        # An API-only replica: no catalog and adapters to check samples and canaries against.
        self._require_check = require_check
        self.documents = VersionedDocuments(
            db,
            store.DOCUMENTS,
            noun="routing policy",
            reason_key="ROUTING_POLICY",
            rpc="RoutingPolicy",
            clock=clock,
            on_activate=self._reconcile_canaries,
            on_change=on_published,
            on_schedule=on_schedule,
        )

    async def validate(self, text: str) -> tuple[PolicyDocument, RoutingPolicy | None]:
        """The document and its resolved shadow, or `InvalidSpec` naming every problem."""
        doc = parse_policy_document(text)
        shadow = doc.shadow
        found: list[FieldViolation] = []
        if doc.shadow_version:
            async with self._db.reads() as reads:
                row = await reads.documents(store.DOCUMENTS).version(doc.shadow_version)
            if row is None:
                found.append(
                    FieldViolation("shadow", f"version {doc.shadow_version!r} not published")
                )
            else:
                shadow = parse_policy_document(row.document).policy
        if self._check is None and self._require_check and (doc.samples or doc.canaries):
            raise PreconditionFailed(
                "this replica runs no scheduler to compile the policy's samples and check its"
                " canaries against: publish or replay it through a scheduling replica",
                {"samples": len(doc.samples), "canaries": len(doc.canaries)},
                reason="POLICY_CHECK_UNAVAILABLE",
            )
        if self._check is not None and not found:
            found.extend(await self._check(doc, shadow))
        if found:
            raise InvalidSpec(found)
        return doc, shadow

    async def _reconcile_canaries(
        self, u: SqlUnitOfWork, version: str, text: str, now: datetime, why: str
    ) -> None:
        """In the activating unit: a canary whose stages or gates this version changes (or
        that is new) starts at its first stage; an unchanged one keeps its state (a state means
        something only with its own stages and gates)."""
        await u.start_changed_canaries(
            wanted_canaries(parse_policy_document(text)), policy_version=version, reason=why
        )

    async def validated(self, text: str) -> str:
        """The policy's version once `validate` passes it."""
        doc, _ = await self.validate(text)
        return doc.policy.version

    async def activations(self, caller: Caller = SYSTEM) -> list[store.ActivationRow]:
        """Every activation, oldest first (pending scheduled ones included)."""
        ensure_admin(caller, "ListRoutingPolicyActivations")
        return list((await self.documents.history()).activations)

    async def list_policies(self, caller: Caller = SYSTEM) -> list[store.PolicyRow]:
        ensure_admin(caller, "ListRoutingPolicies")
        async with self._db.reads() as reads:
            return await reads.documents(store.DOCUMENTS).versions()

    async def list_canaries(self, caller: Caller = SYSTEM) -> list[CanaryView]:
        ensure_admin(caller, "ListCanaries")
        async with self._db.reads() as reads:
            states = await reads.canaries()
            history = await reads.canary_transitions()
        by: dict[str, list[canary_store.TransitionRow]] = {}
        for t in history:
            by.setdefault(t.candidate_id, []).append(t)
        return [CanaryView(s, tuple(by.get(s.candidate_id, ()))) for s in states]
