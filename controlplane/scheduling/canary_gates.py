"""The leader's canary gatekeeper (design 9.13.5): live gates, automatic promotion and rollback.

Every ``interval_s`` the replica that leads shard 0 evaluates each ACTIVE canary of the active
policy on live data: the finished attempts (SUCCEEDED or FAILED, the ledger of what the provider
did) of the canary candidate since its stage began, and those of the incumbent over the same
window (the busiest non-canary candidate: the one carrying the traffic the canary would take).
`controlplane.domain.routing.canary.evaluate` decides; an advance, promotion or rollback moves
the state and records the transition with the observed figures in one unit, guarded so a step
is applied once even if two replicas believed they led. Dispatchers see the new stage on their
next round (`PolicyBook`). Quality is the share of the output probe's technical checks of the
canary's outputs since its stage began that found no defect (absent until one exists), read in
the routing's quality buckets (9.14): the lowest of the overall share and the share of each
bucket with at least ``quality_bucket_min_checks`` checks (`domain.quality.gate_pass_rate`). Three
reads per evaluation, whatever the number of canaries: the incumbents' newest attempts, the
canaries' own (apart, so the incumbents' traffic never crowds them out) and their checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from controlplane.domain.quality import gate_pass_rate
from controlplane.domain.routing.canary import CanaryStatus, GateVerdict, evaluate
from controlplane.domain.routing.policy_document import (
    CanarySpec,
    PolicyDocument,
    parse_policy_document,
)
from controlplane.domain.scoring import CanaryAction, CanaryMetrics
from controlplane.persistence import canaries as canary_store
from controlplane.persistence import routing_policies as store
from controlplane.persistence.database import Database
from vidroute_core.exceptions import InvalidSpec

log = logging.getLogger(__name__)

_SAFETY = frozenset({"SAFETY_INPUT", "SAFETY_OUTPUT"})
_NEXT_STATUS = {
    CanaryAction.ADVANCE: CanaryStatus.ACTIVE,
    CanaryAction.PROMOTE: CanaryStatus.PROMOTED,
    CanaryAction.ROLLBACK: CanaryStatus.ROLLED_BACK,
}


@dataclass(frozen=True, slots=True)
class CanaryGateConfig:
    interval_s: float = 10.0  # between evaluations (scaled by the time scale)
    # VIDROUTE_TIME_SCALE: a document's p95 gate is production seconds while attempts last
    # scaled ones, so the gate is scaled as well before it is compared.
    time_scale: float = 1.0
    # A bucket's own clean share gates the canary once it holds this many checks.
    quality_bucket_min_checks: int = 10


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _p95(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def metrics_of(
    attempts: Sequence[canary_store.WindowAttempt],
    checks: Sequence[tuple[str, bool]] = (),
    min_bucket_checks: int = 10,
) -> CanaryMetrics:
    """Gate figures of finished attempts: success rate, p95 of their durations, safety
    failures, spend per success (inf with no success), and the share of the output probe's
    technical checks, (bucket, clean) pairs, that found nothing wrong, overall and per well
    sampled bucket (`gate_pass_rate`; None without a check)."""
    n = len(attempts)
    ok = sum(1 for a in attempts if a.status == "SUCCEEDED")
    spend = sum(a.cost_micros for a in attempts)
    durations = [(a.updated_at - a.created_at).total_seconds() for a in attempts]
    return CanaryMetrics(
        samples=n,
        success_rate=ok / n if n else 0.0,
        p95_latency_s=_p95(durations),
        safety_failure_rate=(sum(1 for a in attempts if a.failure_class in _SAFETY) / n)
        if n
        else 0.0,
        cost_per_success_micros=spend / ok if ok else math.inf,
        quality_pass_rate=gate_pass_rate(checks, min_bucket_checks),
    )


class CanaryGatekeeper:
    """Evaluates the active policy's canaries while `is_leader()` holds."""

    def __init__(
        self,
        db: Database,
        *,
        is_leader: Callable[[], bool],
        config: CanaryGateConfig | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._db, self._is_leader, self._clock = db, is_leader, clock
        self.config = config or CanaryGateConfig()
        self._parsed: tuple[str, PolicyDocument] | None = None
        self._wake = asyncio.Event()

    def kick(self) -> None:
        """Evaluate now (a publication started canaries)."""
        self._wake.set()

    def _document(self, row: store.PolicyRow) -> PolicyDocument | None:
        if self._parsed is None or self._parsed[0] != row.version:
            try:
                self._parsed = (row.version, parse_policy_document(row.document))
            except InvalidSpec:
                log.exception("active routing policy %s does not parse", row.version)
                return None
        return self._parsed[1]

    def _scaled(self, spec: CanarySpec) -> CanarySpec:
        scale = self.config.time_scale
        if scale == 1.0:
            return spec
        gates = spec.config.gates
        gates = replace(gates, max_p95_latency_s=gates.max_p95_latency_s * scale)
        return replace(spec, config=replace(spec.config, gates=gates))

    async def evaluate_once(self) -> list[tuple[str, GateVerdict]]:
        """One evaluation of every ACTIVE canary; returns what was decided for each."""
        async with self._db.reads() as reads:
            active = await reads.documents(store.DOCUMENTS).active()
            doc = None if active is None else self._document(active)
            if doc is None or not doc.canaries:
                return []
            rows = [
                r
                for r in await reads.canaries()
                if r.status is CanaryStatus.ACTIVE and r.candidate_id in doc.canaries
            ]
            if not rows:
                return []
            since = min(r.stage_started_at for r in rows)
            ids = [r.candidate_id for r in rows]
            # The canaries' own attempts apart: a 0.5 % share of the newest attempts of all
            # would never reach ``min_samples`` on a busy platform.
            window = await reads.attempt_window(since, exclude=list(doc.canaries))
            window.update(await reads.attempt_window(since, only=ids))
            quality = await reads.quality_window(since, only=ids)
        now = self._clock()
        out = []
        for row in rows:
            spec = self._scaled(doc.canaries[row.candidate_id])
            start = row.stage_started_at
            mine = [a for a in window.get(row.candidate_id, ()) if a.created_at >= start]
            others = [
                [a for a in attempts if a.created_at >= start]
                for cid, attempts in window.items()
                if cid not in doc.canaries
            ]
            busiest = max(others, key=len, default=[])
            incumbent = metrics_of(busiest) if busiest else None
            checks = [(b, ok) for at, ok, b in quality.get(row.candidate_id, ()) if at >= start]
            metrics = metrics_of(mine, checks, self.config.quality_bucket_min_checks)
            verdict = evaluate(spec, row.stage, metrics, incumbent)
            await self._apply(row, spec.percents, verdict, now)
            out.append((row.candidate_id, verdict))
        return out

    async def _apply(
        self,
        row: canary_store.CanaryRow,
        percents: tuple[float, ...],
        verdict: GateVerdict,
        now: datetime,
    ) -> None:
        gates = dict(verdict.gates)
        async with self._db.unit(now) as u:
            if verdict.action is CanaryAction.HOLD:
                await u.note_canary_gates(row, gates)  # False: moved meanwhile, its gates stand
                return
            status = _NEXT_STATUS[verdict.action]
            stage = row.stage if verdict.next_stage is None else verdict.next_stage
            if not await u.move_canary(row, stage=stage, status=status, gates=gates):
                return  # another evaluation moved it first
            current = percents[row.stage] if row.stage < len(percents) else 0.0
            to = {
                CanaryAction.ADVANCE: percents[stage] if stage < len(percents) else current,
                CanaryAction.PROMOTE: 100.0,
                CanaryAction.ROLLBACK: 0.0,
            }[verdict.action]
            await u.record_canary_transition(
                row.candidate_id,
                policy_version=row.policy_version,
                action=verdict.action.value,
                reason=verdict.reason,
                from_percent=current,
                to_percent=to,
                observed=dict(verdict.observed),
            )
        log.warning(
            "canary %s: %s (%s) %s%% -> %s%%",
            row.candidate_id,
            verdict.action.value,
            verdict.reason,
            current,
            to,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Evaluate every ``interval_s`` while leading, until `stop`."""
        while not stop.is_set():
            if self._is_leader():
                try:
                    await self.evaluate_once()
                except Exception:  # a bad evaluation must not end the loop
                    log.exception("canary evaluation failed")
            self._wake.clear()
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED),
                    self.config.interval_s,
                )
            for w in waits:
                w.cancel()
