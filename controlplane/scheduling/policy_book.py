"""The routing policy a dispatch round uses (design 9.13, 9.13.5, 9.25.4, 9.25.5).

`PolicyBook.refresh` runs once per round on every replica: one cheap read
(`routing_policies.active_snapshot`: the active version and each canary's stage), and only when
the active version changed, one more to load and parse its document (and its shadow, when the
shadow names another version). So a publish or a rollback takes effect on the next round of
every replica, and a canary's advance or rollback by the leader too. Before any publication the
fallback is used: the policy file the deployment configured, else the built-in example.

`SampleCheck` is the publication's compile check: each sample spec of a document goes through
the routing pipeline in memory against the current catalog (hard filters, the adapters' Compile,
which never calls a provider, and the new policy's scoring), and a sample that no candidate can
serve, or a canary naming a candidate the catalog does not have, is a field violation; a sample
no candidate could be decided for because an adapter's Compile failed (down, timed out) is
`Unavailable`: the document may be fine, so the caller retries rather than edits it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from controlplane.domain.routing.canary import ROLLED_BACK_STAGE, CanaryStatus
from controlplane.domain.routing.candidates import RoutingContext
from controlplane.domain.routing.decision import Outcome
from controlplane.domain.routing.filters import screen
from controlplane.domain.routing.policy_document import PolicyDocument, parse_policy_document
from controlplane.domain.routing.selection import RouterConfig, route
from controlplane.domain.scoring import RoutingPolicy
from controlplane.persistence import routing_policies as store
from controlplane.persistence.database import Database
from controlplane.persistence.reads import DocumentReads
from controlplane.scheduling.gather import compile_many
from vidroute_core.exceptions import InvalidSpec, Unavailable
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.validation import FieldViolation

if TYPE_CHECKING:  # the dispatcher is only handed in; importing it here would be a cycle
    from controlplane.scheduling.dispatcher import Dispatcher

log = logging.getLogger(__name__)

_EMPTY: Mapping[str, int] = MappingProxyType({})


def _same(policy: RoutingPolicy) -> RoutingPolicy:
    return policy


class PolicyBook:
    """The active routing policy and canary stages, re-read once per round."""

    def __init__(
        self,
        db: Database,
        base: RouterConfig,
        *,
        fallback: PolicyDocument | None = None,
        transform: Callable[[RoutingPolicy], RoutingPolicy] = _same,
    ) -> None:
        self._db, self._transform = db, transform
        if fallback is not None:
            base = dataclasses.replace(
                base,
                policy=transform(fallback.policy),
                shadow_policy=None if fallback.shadow is None else transform(fallback.shadow),
            )
            if fallback.canaries:
                log.warning("canaries of an unpublished policy file are ignored: publish it")
        self.fallback = base
        self._version: str | None = None
        self._router = base
        self._document: PolicyDocument | None = None

    @property
    def version(self) -> str:
        return self._router.policy.version

    async def refresh(self) -> tuple[RouterConfig, Mapping[str, int]]:
        """The router config and the canary stages (candidate id -> stage; -1 rolled back)."""
        async with self._db.reads() as reads:
            snap = await reads.policy_snapshot()
            if snap is None:
                self._version, self._document, self._router = None, None, self.fallback
                return self.fallback, _EMPTY
            if snap.version != self._version:
                await self._load(reads.documents(store.DOCUMENTS), snap.version)
        doc = self._document
        if doc is None or not doc.canaries:
            return self._router, _EMPTY
        stages: dict[str, int] = {}
        for cid, stage, status in snap.canaries:
            if cid not in doc.canaries or status is CanaryStatus.PROMOTED:
                continue
            stages[cid] = ROLLED_BACK_STAGE if status is CanaryStatus.ROLLED_BACK else stage
        return self._router, stages

    async def _load(self, versions: DocumentReads, name: str) -> None:
        row = await versions.version(name)
        if row is None:
            return
        try:
            doc = parse_policy_document(row.document)
            shadow = doc.shadow
            if shadow is None and doc.shadow_version:
                other = await versions.version(doc.shadow_version)
                shadow = None if other is None else parse_policy_document(other.document).policy
        except InvalidSpec:  # validated at publication; a bad row must not stop dispatching
            log.exception("routing policy %s does not parse; keeping %s", name, self.version)
            return
        self._router = dataclasses.replace(
            self.fallback,
            policy=self._transform(doc.policy),
            shadow_policy=None if shadow is None else self._transform(shadow),
        )
        self._version, self._document = name, doc
        log.info("routing policy %s active (shadow %s)", name, shadow and shadow.version)


class SampleCheck:
    """The compile check of a document's samples against a dispatcher's catalog and adapters."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._d = dispatcher

    async def __call__(
        self, doc: PolicyDocument, shadow: RoutingPolicy | None
    ) -> list[FieldViolation]:
        d = self._d
        catalog = await d.catalog()
        ids = {c.id for c in catalog.candidates}
        found = [
            FieldViolation(f'canaries["{cid}"]', "not a candidate of the current catalog")
            for cid in doc.canaries
            if cid not in ids
        ]
        if not doc.samples:
            return found
        cfg = dataclasses.replace(d.router, policy=doc.policy, shadow_policy=shadow)
        now = d.now()
        stages = dict.fromkeys(doc.canaries, 0)
        jobs, screens = [], []
        for spec in doc.samples:
            ctx = RoutingContext(now=now, canary_stages=stages)
            screened = screen(spec, catalog.candidates, ctx, catalog.version)
            jobs.append((spec, normalized_spec_hash(spec), screened.survivors()))
            screens.append((ctx, screened))
        compiled = await compile_many(
            d.adapters,
            jobs,
            d.compile_cache,
            timeout_s=d.config.compile_timeout_s,
        )
        for i, (spec, (ctx, screened), (verdicts, _)) in enumerate(
            zip(doc.samples, screens, compiled, strict=True)
        ):
            decision = route(
                f"sample-{i}",
                spec,
                catalog.candidates,
                verdicts,
                cfg=cfg,
                ctx=ctx,
                catalog_version=catalog.version,
                screened=screened,
            )
            if decision.outcome is not Outcome.SELECTED:
                unreachable = sorted(cid for cid, v in verdicts.items() if v.error)
                if unreachable:
                    # Not the document's fault: an adapter could not compile (down, timed out).
                    raise Unavailable(
                        f"the adapter compile of samples[{i}] on {', '.join(unreachable[:3])}"
                    )
                reasons = sorted({f"{v.candidate.id}: {v.reason}" for v in decision.verdicts})
                found.append(
                    FieldViolation(
                        f"samples[{i}]",
                        "no candidate of the current catalog can serve it ("
                        + ("; ".join(reasons[:5]) or "no candidates")
                        + ")",
                    )
                )
        return found
