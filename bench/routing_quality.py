"""Routing-quality benchmark (issue 26; design 9.13, 9.24): ``python -m bench.routing_quality
[--tasks-per-phase N] [--rate R] [--scale F] [--json PATH]``.

A scripted degradation over the real stack: the shipped sidecar processes and our provider
emulators (`tests.support.stack.ProviderFarm`), one `vidroute serve` process on PostgreSQL + Redis
(`ControlPlane`), every duration on one time factor. Four phases, each N tasks per policy:

1. ``calm``: nothing wrong.
2. ``a_slow``: provider A (Runway) takes 3x as long (its emulator's queue and run time x3).
3. ``a_failing``: A's speed is back, 30% of its jobs fail (``fail_job`` ``INTERNAL``, a
   retryable failure Runway bills 0 credits for; a seeded 30% of its creates).
4. ``recovered``: no fault.

B (Veo, whose cheapest model costs 1.25x A's gen4.5) is steady throughout; the self-hosted
model is saturated throughout: one GPU worker behind its shipped two leases, while the offered
load needs more than that.

Policies, all in the same run and the same control plane (so under the same faults at the same
times), each a tenant of the tenants document (`VIDROUTE_TENANTS_FILE`) whose
``routing_scenario`` picks a weight set of the routing policy (`VIDROUTE_ROUTING_POLICY_FILE`):

* ``auto``: the shipped weights (the built-in policy's ``default`` set, copied);
* ``cheapest``: weight 1 on cost, 0 elsewhere (cheapest eligible candidate first);
* ``fastest``: weight 1 on latency, 0 elsewhere: the router's predicted latency of each candidate
  (the window's p95 where it has one, else the mean: 9.13.2), so lowest-latency-first;
* ``oracle``: computed, not routed: see `bench.routing_quality_figures`.

Every policy runs in two variants: ``all`` (every provider) and ``paid`` (the tenant's
``allowed_regions`` leave out the self-hosted cluster's region). Tasks are AUTO text-to-video
specs (720p, 4 s) that every text-to-video model can serve. Hard filters, breakers, leases,
hysteresis and dwell apply to every policy alike (the policy document's).

Figures per policy and variant: cost per success (failures billed as each provider bills
them), p95 end to end, failures, switches and oscillations, and the ratios against cheapest
and the oracle; with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import secrets
import shutil
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from adapter_sidecars.emulators.jobs import Pace
from bench.lifecycle import _create_db, _drop_db, _maintenance, _raised_capabilities
from bench.routing_quality_figures import (
    AttemptRow,
    PolicyFigures,
    TaskRow,
    candidate_phases,
    oracle_figures,
    policy_figures,
)
from tests.support import stack
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

PHASES = ("calm", "a_slow", "a_failing", "recovered")
POLICIES = ("auto", "cheapest", "fastest")
VARIANTS = ("all", "paid")
PROVIDER_A, PROVIDER_B, SELF_HOSTED = "runway", "google", "self_hosted"
# The regions the shipped sidecar configs give each provider's account.
PAID_REGIONS = ["us", "asia-northeast1"]
SLOW_FACTOR = 3.0
FAILURE_RATE = 0.30
# The oracle's latency bound per phase: this many times the best candidate's p95 that phase.
BOUND_OVER_BEST = 1.25
RAISED_CONCURRENCY = 200

_ZERO = {"quality": 0, "success": 0, "latency": 0, "cost": 0, "capacity": 0}
_ZERO |= {"region": 0, "preference": 0}
_SHIPPED = {"quality": 0.28, "success": 0.22, "latency": 0.18, "cost": 0.14, "capacity": 0.10}
_SHIPPED |= {"region": 0.04, "preference": 0.04}


def routing_policy_document() -> dict[str, Any]:
    """The shipped weights as ``default`` plus one weight set per baseline."""
    return {
        "version": "bench-routing-quality",
        "description": "router-v1's default weights, plus the baselines' weight sets",
        "weights": {
            "default": _SHIPPED,
            "CHEAPEST": _ZERO | {"cost": 1},
            "FASTEST": _ZERO | {"latency": 1},
        },
        "hysteresis_delta": 0.03,
        "min_dwell_s": 60,
    }


def tenant(policy: str, variant: str) -> str:
    return f"{policy}-{variant}"


def tenants_document() -> dict[str, Any]:
    scenario = {"cheapest": "CHEAPEST", "fastest": "FASTEST"}
    tenants: dict[str, Any] = {}
    for policy in POLICIES:
        for variant in VARIANTS:
            entry: dict[str, Any] = {"service_classes": {"STANDARD": {"weight": 1}}}
            if policy in scenario:
                entry["routing_scenario"] = scenario[policy]
            if variant == "paid":
                entry["allowed_regions"] = PAID_REGIONS
            tenants[tenant(policy, variant)] = entry
    return {
        "version": "bench-routing-quality",
        "default": {"service_classes": {"STANDARD": {"weight": 1}}},
        "tenants": tenants,
    }


def spec(tenant_id: str) -> gen.GenerationSpec:
    return gen.GenerationSpec(
        tenant_id=tenant_id,
        prompt="a red kite over a green hill",
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
        routing=gen.RoutingPolicy(mode=gen.ROUTING_MODE_AUTO),
    )


def _create(cp: ControlPlane, tenant_id: str, key: str, tries: int = 10) -> None:
    request = api.CreateTaskRequest(spec=spec(tenant_id), idempotency_key=key)
    for attempt in range(1, tries + 1):
        try:
            assert cp.stub is not None
            cp.stub.CreateTask(request, timeout=stack.RPC_GUARD_S)
            return
        except grpc.RpcError as exc:  # a loaded machine: the same key again is a replay
            retryable = exc.code() in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            )
            if not retryable or attempt == tries:
                raise
            time.sleep(0.2 * attempt)


class Faults:
    """The schedule's faults, applied to the emulators between phases."""

    def __init__(self, farm: ProviderFarm, seed: int) -> None:
        self.farm = farm
        self.rng = random.Random(seed)
        a = farm.emulator(PROVIDER_A)
        self.pace: Pace = a.call(lambda: a.emulator.lifecycle.pace)

    def _set_pace(self, pace: Pace) -> None:
        a = self.farm.emulator(PROVIDER_A)

        def apply() -> None:
            a.emulator.lifecycle.pace = pace

        a.call(apply)

    def enter(self, phase: str, expected_creates: int) -> None:
        a = self.farm.emulator(PROVIDER_A)
        a.clear_faults()
        self._set_pace(self.pace)
        if phase == "a_slow":
            slow = dataclasses.replace(
                self.pace,
                queue_s=self.pace.queue_s * SLOW_FACTOR,
                run_s=self.pace.run_s * SLOW_FACTOR,
            )
            self._set_pace(slow)
        elif phase == "a_failing":
            # `nth` counts the matching creates from now: a seeded 30% of the next ones fail
            # (more than the phase can send, so the rate holds whatever the routing does).
            rules = [
                {"route": "POST /v1/*", "nth": n, "action": "fail_job", "code": "INTERNAL"}
                for n in range(1, 4 * expected_creates + 50)
                if self.rng.random() < FAILURE_RATE
            ]
            a.add_faults(rules)


_ROWS_SQL = """
SELECT t.idempotency_key, t.status,
       EXTRACT(EPOCH FROM t.updated_at - t.created_at),
       a.attempt_no, pa.provider, a.provider_model, a.status,
       a.estimated_cost_micros, a.actual_cost_micros
FROM generation_tasks t
LEFT JOIN task_attempts a ON a.task_id = t.id
LEFT JOIN provider_accounts pa ON pa.id = a.provider_account_id
ORDER BY t.id, a.attempt_no
"""
_OPEN_SQL = (
    "SELECT count(*) FROM generation_tasks WHERE status NOT IN ('SUCCEEDED','FAILED','CANCELLED')"
)


async def _wait_settled(url: str, created: int, deadline: float) -> int:
    """Wait until every created task is terminal (or the deadline); the number still open."""
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        while True:
            async with engine.connect() as conn:
                total = (await conn.execute(text("SELECT count(*) FROM generation_tasks"))).one()
                still = (await conn.execute(text(_OPEN_SQL))).one()
            if (int(total[0]) >= created and int(still[0]) == 0) or time.monotonic() > deadline:
                return int(still[0])
            await asyncio.sleep(0.5)
    finally:
        await engine.dispose()


async def _read_rows(url: str, keys: dict[str, tuple[str, str, str, int]]) -> list[TaskRow]:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text(_ROWS_SQL))).all()
    finally:
        await engine.dispose()
    tasks: dict[str, tuple[str, float, list[AttemptRow]]] = {}
    for key, status, latency, no, provider, model, a_status, est, actual in rows:
        if key not in keys:
            continue
        entry = tasks.setdefault(key, (str(status), float(latency or 0.0), []))
        if no is not None:
            entry[2].append(
                AttemptRow(
                    f"{provider}/{model}",
                    str(a_status),
                    int(est or 0),
                    None if actual is None else int(actual),
                )
            )
    out = []
    for key, (status, latency, attempts) in tasks.items():
        policy, variant, phase, seq = keys[key]
        out.append(TaskRow(policy, variant, phase, seq, status, latency, tuple(attempts)))
    return out


def run(  # noqa: PLR0915 - one linear script of a run
    tasks_per_phase: int,
    rate: float,
    scale: float,
    redis_url: str,
    *,
    seed: int = 26,
    keep: bool = False,
    database_url: str = "",
    rows_to: Path | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """One run of the scenario; returns every figure (see `report`). Without `database_url`
    it runs on a PostgreSQL database of its own, created and dropped."""
    work = Path(tempfile.mkdtemp(prefix="vidroute-bench-rq-"))
    name = f"vidroute_bench_rq_{secrets.token_hex(4)}"
    url = database_url
    if not database_url:
        asyncio.run(_create_db(name))
        url = _maintenance().set(database=name).render_as_string(hide_password=False)
    # Runway and Veo: an account tier far above the offered load (leases and emulator);
    # the self-hosted cluster keeps its shipped two leases in front of one GPU worker.
    caps = _raised_capabilities(work / "caps", RAISED_CONCURRENCY, [PROVIDER_A, PROVIDER_B])
    for path in (stack.ROOT / "adapter_sidecars" / "selfhosted" / "capabilities").glob("*.yaml"):
        shutil.copy(path, caps / path.name)
    policy_file, tenants_file = work / "policy.json", work / "tenants.json"
    policy_file.write_text(json.dumps(routing_policy_document()), encoding="utf-8")
    tenants_file.write_text(json.dumps(tenants_document()), encoding="utf-8")
    keys: dict[str, tuple[str, str, str, int]] = {}
    boundaries: list[tuple[str, float]] = []
    load: list[float] = [os.getloadavg()[0]]
    run_key = uuid.uuid4().hex[:8]
    started = time.monotonic()
    try:
        with ProviderFarm(
            work / "farm",
            time_scale=scale,
            providers=[PROVIDER_A, PROVIDER_B, SELF_HOSTED],
            sidecar_env={"VIDROUTE_ADAPTER_CAPABILITIES_DIR": str(caps)},
            emulator_options={
                # the tier's daily limit too (200 gen4.5 a day by default: a run sends more)
                PROVIDER_A: {"max_concurrent": RAISED_CONCURRENCY, "max_daily": 1_000_000},
                SELF_HOSTED: {"workers": 1},
            },
        ) as farm:
            (work / "cp").mkdir()
            env = {
                "VIDROUTE_ROUTING_POLICY_FILE": str(policy_file),
                "VIDROUTE_TENANTS_FILE": str(tenants_file),
            }
            cp = ControlPlane(work / "cp", farm, database_url=url, redis_url=redis_url, env=env)
            cp.start()
            try:
                faults = Faults(farm, seed)
                tenants = [(p, v) for p in POLICIES for v in VARIANTS]
                per_phase = tasks_per_phase * len(tenants)
                log(f"started in {time.monotonic() - started:.0f} s; {per_phase} tasks a phase")
                pending: list[Future[None]] = []
                lock = threading.Lock()
                with ThreadPoolExecutor(8) as pool:
                    t0 = time.monotonic()
                    sent = 0
                    for phase in PHASES:
                        faults.enter(phase, per_phase)
                        boundaries.append((phase, time.monotonic() - t0))
                        for i in range(tasks_per_phase):
                            for policy, variant in tenants:
                                key = f"{run_key}-{policy}-{variant}-{phase}-{i}"
                                seq = PHASES.index(phase) * tasks_per_phase + i
                                with lock:
                                    keys[key] = (policy, variant, phase, seq)
                                at = t0 + sent / rate
                                if (wait := at - time.monotonic()) > 0:
                                    time.sleep(wait)
                                pending.append(
                                    pool.submit(_create, cp, tenant(policy, variant), key)
                                )
                                sent += 1
                        load.append(os.getloadavg()[0])
                        log(f"phase {phase} sent at {time.monotonic() - t0:.0f} s")
                    for done in pending:
                        done.result()
                created_s = time.monotonic() - t0
                # Any task still open this long after the last create is a finding, not a wait.
                deadline = time.monotonic() + max(180.0, 100 * farm.seconds(65))
                still_open = asyncio.run(_wait_settled(url, len(keys), deadline))
                load.append(os.getloadavg()[0])
                wall_s = time.monotonic() - t0
                rows = asyncio.run(_read_rows(url, keys))
            finally:
                cp.stop()
    finally:
        if keep or database_url:
            log(f"kept database {url}")
        else:
            asyncio.run(_drop_db(name))
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")
    if rows_to is not None:  # every task's row, so `--from-rows` can compute the figures again
        rows_to.write_text(json.dumps([dataclasses.asdict(t) for t in rows]), encoding="utf-8")
    return report(
        rows,
        tasks_per_phase=tasks_per_phase,
        extra={
            "scale": scale,
            "rate_per_s": rate,
            "create_s": round(created_s, 1),
            "wall_s": round(wall_s, 1),
            "still_open": still_open,
            "phase_starts_s": {p: round(s, 1) for p, s in boundaries},
            "load_avg_1m": [round(x, 1) for x in load],
        },
    )


def _fig(f: PolicyFigures) -> dict[str, Any]:
    return {
        "tasks": f.tasks,
        "successes": f.successes,
        "failures": f.failures,
        "cost_per_success_micros": round(f.cost_per_success_micros),
        "p95_s": round(f.p95_s, 3),
        "switches": f.switches,
        "oscillations": f.oscillations,
        "first_candidates": {p: dict(sorted(c.items())) for p, c in f.per_phase.items()},
    }


def report(rows: list[TaskRow], *, tasks_per_phase: int, extra: dict[str, Any]) -> dict[str, Any]:
    """Figures per variant: each policy's, the oracle's, and the ratios (see the docstring)."""
    out: dict[str, Any] = dict(extra)
    out["oracle_bound"] = f"{BOUND_OVER_BEST} x the phase's best candidate p95"
    # What the oracle reads: each candidate's measured figures per phase, over every policy's
    # tasks whose first attempt went to it (and its attempts' failure share).
    out["candidates"] = {
        phase: {
            c.candidate: {
                "tasks": c.tasks,
                "task_successes": c.successes,
                "cost_per_success_micros": round(c.cost_per_success) if c.successes else None,
                "p95_s": round(c.p95_s, 3),
                "served_per_policy": c.served_per_policy,
                "attempts_failed": _attempts_failed(rows, phase, c.candidate),
            }
            for c in candidate_phases(rows, phase)
        }
        for phase in PHASES
    }
    for variant in VARIANTS:
        figures = {
            policy: policy_figures(
                [t for t in rows if t.policy == policy and t.variant == variant], PHASES
            )
            for policy in POLICIES
        }
        allowed = None if variant == "all" else frozenset({PROVIDER_A, PROVIDER_B})
        figures["oracle"], _ = oracle_figures(
            [t for t in rows if t.variant == variant],
            PHASES,
            dict.fromkeys(PHASES, tasks_per_phase),
            BOUND_OVER_BEST,
            allowed,
        )
        section: dict[str, Any] = {p: _fig(f) for p, f in figures.items()}
        base, oracle = figures["cheapest"], figures["oracle"]
        for policy, f in figures.items():
            section[policy]["cost_vs_cheapest"] = _ratio(
                f.cost_per_success_micros, base.cost_per_success_micros
            )
            section[policy]["p95_vs_cheapest"] = _ratio(f.p95_s, base.p95_s)
            section[policy]["cost_vs_oracle"] = _ratio(
                f.cost_per_success_micros, oracle.cost_per_success_micros
            )
            section[policy]["p95_vs_oracle"] = _ratio(f.p95_s, oracle.p95_s)
        out[variant] = section
    return out


def _attempts_failed(rows: list[TaskRow], phase: str, candidate: str) -> str:
    attempts = [a for t in rows if t.phase == phase for a in t.attempts if a.candidate == candidate]
    return f"{sum(1 for a in attempts if a.state == 'FAILED')}/{len(attempts)}"


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b and b != float("inf") and a != float("inf") else None


def table(figures: dict[str, Any]) -> str:
    """The figures as the markdown rows RESULTS.md carries."""
    lines = []
    for variant in VARIANTS:
        lines.append(f"\n{variant} providers\n")
        lines.append(
            "| policy | tasks | failures | cost/success (µ) | p95 (s) | switches | oscillations"
            " | cost vs cheapest | p95 vs cheapest | cost vs oracle | p95 vs oracle |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for policy, f in figures[variant].items():
            lines.append(
                f"| {policy} | {f['tasks']} | {f['failures']} | {f['cost_per_success_micros']:,}"
                f" | {f['p95_s']} | {f['switches']} | {f['oscillations']}"
                f" | {f['cost_vs_cheapest']} | {f['p95_vs_cheapest']}"
                f" | {f['cost_vs_oracle']} | {f['p95_vs_oracle']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks-per-phase", type=int, default=25, help="per policy and variant")
    parser.add_argument("--rate", type=float, default=1.5, help="CreateTask calls per second")
    parser.add_argument("--scale", type=float, default=0.05, help="the run's time factor")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the database and workdir")
    parser.add_argument("--rows", type=Path, help="write every task's row here (JSON)")
    parser.add_argument("--from-rows", type=Path, help="no run: the figures of saved rows")
    args = parser.parse_args()
    if args.from_rows:
        saved = json.loads(args.from_rows.read_text(encoding="utf-8"))
        rows = [
            TaskRow(**{**r, "attempts": tuple(AttemptRow(**a) for a in r["attempts"])})
            for r in saved
        ]
        figures = report(rows, tasks_per_phase=args.tasks_per_phase, extra={})
    else:
        base = os.environ.get("VIDROUTE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
        with RedisDb(base) as redis_db:
            figures = run(
                args.tasks_per_phase,
                args.rate,
                args.scale,
                redis_db.url,
                seed=args.seed,
                keep=args.keep,
                rows_to=args.rows,
            )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, sort_keys=True), encoding="utf-8")
    print(json.dumps(figures, indent=1, sort_keys=True))
    print(table(figures))


if __name__ == "__main__":
    main()
