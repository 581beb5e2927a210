"""Routing benchmark (not a test): ``python -m bench.routing`` or ``make bench-routing``.

1. One routing decision in process, as the dispatcher makes it (`filters.screen` once, its
   survivors before and after the lease pre-check, `selection.route` reusing the screen; compile
   verdicts precomputed, as if the adapter answered at once; shadow policy on), for 8, 64 and
   256 candidates, and 64 candidates whose capabilities all differ (no shared checks). Thread
   CPU per decision (`time.thread_time_ns`), p50/p99; "every task a new shape" empties the
   capabilities' verdict tables before each decision (a task shape never seen before).
2. Side by side with LiteLLM's Router (issue 10): a pinned litellm in its own environment
   (``.venv-bench-litellm`` from ``bench/requirements-litellm.txt``; never in constraints.txt)
   runs ``bench/routing_litellm.py`` as a subprocess: one Router per strategy (simple-shuffle,
   latency-based-routing, usage-based-routing-v2, cost-based-routing) over 64 deployments,
   warmed with mock completions. Rounds are interleaved (ours, then each strategy, repeated), so
   both sides see the same load; the load average is sampled every round.
3. ``--e2e``: tasks routed, leased (RedisLeaseStore) and committed (Attempt + RouteDecision +
   outbox) per second by one dispatcher on PostgreSQL + Redis with an in-process adapter whose
   Compile returns a fixed plan. Needs ``VIDROUTE_BENCH_POSTGRES_URL`` (default
   ``postgresql+asyncpg://postgres@127.0.0.1:5432/test``, used as maintenance database) and
   ``VIDROUTE_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``).

Our side runs with the collector tuned as the dispatcher process tunes it
(`controlplane.scheduling.heap.tune_gc`, after the cases are built); ``--default-gc`` keeps
CPython's defaults. ``--rounds`` and ``--per-round`` size the run; ``--json PATH`` writes the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from controlplane.capabilities.publish import (
    AccountConfig,
    documents_from_directory,
    publish_documents,
)
from controlplane.domain.breaker import BreakerConfig, BreakerRegistry
from controlplane.domain.routing.candidates import (
    Candidate,
    CapacityView,
    CompileResult,
    HealthView,
    Price,
    RoutingContext,
    TransformKind,
    catalog_version,
)
from controlplane.domain.routing.decision import RouteDecisionSnapshot
from controlplane.domain.routing.filters import screen
from controlplane.domain.routing.plan import plan_for
from controlplane.domain.routing.selection import RouterConfig, route
from controlplane.domain.scoring import ScoreWeights, example_policy
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import upgrade
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.heap import tune_gc
from controlplane.scheduling.leader import LocalLock
from vidroute_core.adapter import CompiledPlan, Transformation, TransformationKind
from vidroute_core.capabilities.constraints import Constraint
from vidroute_core.capabilities.loader import Capability, expand_for_accounts, load_file
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

ROOT = Path(__file__).resolve().parents[1]
DIRS = sorted(ROOT.glob("adapter_sidecars/*/capabilities"))
NOW = datetime(2026, 6, 24, 10, 0, tzinfo=UTC)
SPEC = GenerationSpec(
    tenant_id="bench",
    prompt="a red fox in snow",
    mode=Mode.TEXT_TO_VIDEO,
    output=OutputSpec(width=1280, height=720, duration_ms=8000),
)


def candidates(n: int) -> list[Candidate]:
    """`n` candidates: the real catalog entries cloned over synthetic accounts and regions."""
    base = []
    for directory in DIRS:
        for path in sorted(directory.glob("*.yaml")):
            base.extend(expand_for_accounts(load_file(path), [("acct", "us")]))
    out = []
    for i in range(n):
        cap = dataclasses.replace(
            base[i % len(base)], account=f"acct-{i}", region=("us", "eu", "asia")[i % 3]
        )
        com = cap.commercial
        out.append(
            Candidate(
                cap.provider,
                cap.account,
                i + 1,
                cap.region,
                cap.model,
                cap.model_version,
                cap.capability_version,
                cap.lifecycle,
                cap.sunset_at,
                cap,
                Price(
                    com.price_version,
                    com.currency,
                    com.price_micros_per_output_second + i,
                    com.price_micros_per_output_second_with_audio,
                ),
            )
        )
    return out


GOAL_P50_MS = 0.35  # issue 10: p50 at 64 candidates, thread CPU
# A shadow policy weighing cost more (a candidate next policy): recorded with every decision.
SHADOW = dataclasses.replace(
    example_policy("shadow-cost-heavy"),
    weights={"default": ScoreWeights(0.20, 0.20, 0.10, 0.30, 0.10, 0.05, 0.05)},
)
LITELLM_VENV = ROOT / ".venv-bench-litellm"
STRATEGIES = (
    "simple-shuffle",
    "latency-based-routing",
    "usage-based-routing-v2",
    "cost-based-routing",
)


def distinct_capabilities(cands: list[Candidate]) -> list[Candidate]:
    """The same candidates, each capability made unique by one more (always true) rule."""
    out = []
    for i, c in enumerate(cands):
        rule = Constraint("duration_seconds >= 0", f"duration_seconds != {1000 + i}")
        cap = dataclasses.replace(c.capability, constraints=(*c.capability.constraints, rule))
        out.append(dataclasses.replace(c, capability=cap))
    return out


Decide = Callable[[int], RouteDecisionSnapshot]


def decision_case(n: int, *, distinct: bool = False, cold: bool = False) -> Decide:
    """One decision over `n` candidates as the dispatcher makes it (see the module docstring);
    `cold`: every capability's verdict table emptied first, as for a task of a new shape."""
    cands = candidates(n)
    if distinct:
        cands = distinct_capabilities(cands)
    catalog = tuple(cands)
    # Each case its own plan: equal clones under one version would rebuild it at every switch.
    version = catalog_version(catalog) + ("-cold" if cold else "")
    cfg = RouterConfig(policy=example_policy("bench"), shadow_policy=SHADOW)
    capacity = {c.id: CapacityView(3, 4) for c in catalog}
    health = {c.id: HealthView(0.9, 100.0, 120.0) for c in catalog}
    base = RoutingContext(now=NOW, circuit_open={catalog[-1].id: "OPEN since 09:58"})
    full = dataclasses.replace(base, capacity=capacity, health=health)
    compiled = {
        c.id: CompileResult(
            True,
            (("prompt", TransformKind.EXACT, "p"), ("duration", TransformKind.EXACT, "8 s")),
            c.price.estimate(SPEC),
            "USD",
            "sha256:x",
        )
        for c in screen(SPEC, catalog, full, version).survivors()
    }

    def decide(i: int) -> RouteDecisionSnapshot:
        if cold:
            plan_for(catalog, version).clear_tables()
        screened = screen(SPEC, catalog, base, version)
        screened.survivors()  # whose leases and health are read
        screened.survivors(capacity)  # whose adapters are asked to compile
        return route(
            str(i), SPEC, catalog, compiled, cfg=cfg, ctx=full, catalog_version=version,
            screened=screened,
        )  # fmt: skip

    decide(0)
    return decide


def before_case(n: int) -> Decide:
    """The same decision through the pipeline as it was before the fast path (the oracle kept
    in ``tests/unit/domain/routing_reference.py``: prefilter twice, route filtering again)."""
    from tests.unit.domain import routing_reference as old

    catalog = tuple(candidates(n))
    cfg = RouterConfig(policy=example_policy("bench"), shadow_policy=SHADOW)
    capacity = {c.id: CapacityView(3, 4) for c in catalog}
    health = {c.id: HealthView(0.9, 100.0, 120.0) for c in catalog}
    base = RoutingContext(now=NOW, circuit_open={catalog[-1].id: "OPEN since 09:58"})
    full = dataclasses.replace(base, capacity=capacity, health=health)
    compiled = {
        c.id: CompileResult(
            True,
            (("prompt", TransformKind.EXACT, "p"), ("duration", TransformKind.EXACT, "8 s")),
            c.price.estimate(SPEC),
            "USD",
            "sha256:x",
        )
        for c in old.prefilter(SPEC, catalog, full)
    }

    def decide(i: int) -> RouteDecisionSnapshot:
        survivors = old.prefilter(SPEC, catalog, base)
        old.prefilter(SPEC, survivors, full)
        result: RouteDecisionSnapshot = old.route(
            str(i), SPEC, catalog, compiled, cfg=cfg, ctx=full
        )
        return result

    decide(0)
    return decide


def timed(decide: Decide, count: int, start: int = 0) -> list[int]:
    """Thread CPU nanoseconds of `count` decisions."""
    out = []
    clock = time.thread_time_ns
    for i in range(start, start + count):
        t = clock()
        decide(i)
        out.append(clock() - t)
    return out


def hot_loop_calls(decide: Decide, decisions: int = 20) -> dict[str, float]:
    """Calls per decision of what the fast path must not do (cProfile counts, not times)."""
    import cProfile
    import pstats

    from controlplane.domain.routing import filters

    profile = cProfile.Profile()
    profile.runcall(lambda: [decide(i) for i in range(decisions)])
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]  # Stats.stats exists at run time; typeshed leaves it out
    wanted = {
        ("dataclasses.py", "fields"): "dataclasses.fields",
        ("dataclasses.py", "replace"): "dataclasses.replace",
        ("dataclasses.py", "asdict"): "dataclasses.asdict",
        ("__init__.py", "dumps"): "json.dumps",
        (Path(filters.__file__).name, "_static_reject"): "static filters (per candidate)",
        (Path(filters.__file__).name, "_capability_reject"): "capability checks (table misses)",
        ("routing_reference.py", "hard_reject"): "hard_reject calls",
    }
    counts = dict.fromkeys(wanted.values(), 0.0)
    for (path, _line, name), row in stats.items():
        label = wanted.get((Path(path).name, name))
        if label is not None:
            counts[label] += row[1] / decisions
    return counts


class LiteLLMSide:
    """The LiteLLM subprocess of `bench/routing_litellm.py` in its own environment."""

    def __init__(self, deployments: int) -> None:
        python = LITELLM_VENV / "bin" / "python"
        if not python.exists():
            raise SystemExit(
                "no LiteLLM environment: make bench-routing creates it, or\n"
                f"  python3.11 -m venv {LITELLM_VENV} && {LITELLM_VENV}/bin/pip install "
                "-r bench/requirements-litellm.txt"
            )
        self.proc = subprocess.Popen(
            [str(python), "-P", str(ROOT / "bench" / "routing_litellm.py"), str(deployments)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdin is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        hello = json.loads(self._out.readline() or "{}")
        if not hello.get("ready"):
            raise SystemExit("the LiteLLM side did not start (see its stderr above)")
        self.version = str(hello["litellm"])

    def picks(self, strategy: str, count: int) -> list[int]:
        self._in.write(json.dumps({"strategy": strategy, "picks": count}) + "\n")
        self._in.flush()
        return [int(x) for x in json.loads(self._out.readline())["thread_ns"]]

    def close(self) -> None:
        self._in.close()
        self.proc.wait(timeout=30)


def percentile(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1e6


def side_by_side(
    rounds: int, per_round: int, with_litellm: bool, default_gc: bool = False
) -> dict[str, Any]:
    """Interleaved rounds: every case of ours, then every LiteLLM strategy, `rounds` times."""
    ours = {
        "vidroute n=8": decision_case(8),
        "vidroute n=64": decision_case(64),
        "vidroute n=64, every task a new shape": decision_case(64, cold=True),
        "vidroute n=64 distinct capabilities": decision_case(64, distinct=True),
        "vidroute n=64 distinct, every task a new shape": decision_case(
            64, distinct=True, cold=True
        ),
        "vidroute n=256": decision_case(256),
        "before the fast path n=64": before_case(64),
    }
    calls = hot_loop_calls(ours["vidroute n=64"])
    calls_before = hot_loop_calls(ours["before the fast path n=64"], decisions=5)
    lite = LiteLLMSide(64) if with_litellm else None
    if not default_gc:
        tune_gc()  # as the dispatcher process (SchedulingRuntime.start)
    samples: dict[str, list[int]] = {k: [] for k in ours}
    if lite is not None:
        samples.update({f"litellm {s} (64 deployments)": [] for s in STRATEGIES})
    loads = [os.getloadavg()[0]]
    try:
        for r in range(rounds):
            for name, decide in ours.items():
                count = per_round
                if "256" in name or "before" in name:
                    count = max(1, per_round // (4 if "256" in name else 10))
                samples[name] += timed(decide, count, start=r * per_round)
            if lite is not None:
                for s in STRATEGIES:
                    samples[f"litellm {s} (64 deployments)"] += lite.picks(s, per_round)
            loads.append(os.getloadavg()[0])
    finally:
        if lite is not None:
            lite.close()
    table = {
        name: {"n": len(v), "p50_ms": percentile(v, 0.5), "p99_ms": percentile(v, 0.99)}
        for name, v in samples.items()
    }
    return {
        "table": table,
        "load_average": {"min": min(loads), "max": max(loads), "mean": statistics.fmean(loads)},
        "litellm": lite.version if lite is not None else None,
        "gc": "default" if default_gc else "tuned",
        "hot_loop_calls_per_decision_64": calls,
        "hot_loop_calls_per_decision_64_before": calls_before,
    }


def report(result: dict[str, Any]) -> None:
    table = result["table"]
    load = result["load_average"]
    print(
        f"one routing decision, thread CPU; load average {load['min']:.2f}-{load['max']:.2f} "
        f"(mean {load['mean']:.2f}); litellm {result['litellm'] or '-'}; our gc {result['gc']}"
    )
    for name, row in table.items():
        print(
            f"  {name:<50} p50 {row['p50_ms']:7.3f} ms  p99 {row['p99_ms']:7.3f} ms  ({row['n']})"
        )
    ours = table["vidroute n=64"]
    print(
        f"goal p50 <= {GOAL_P50_MS} ms at 64: {ours['p50_ms']:.3f} ms "
        f"({ours['p50_ms'] / GOAL_P50_MS:.2f}x of the goal)"
    )
    shuffle = table.get("litellm simple-shuffle (64 deployments)")
    if shuffle is not None:
        print(
            f"goal p99 <= LiteLLM simple-shuffle p50 ({shuffle['p50_ms']:.3f} ms): "
            f"{ours['p99_ms']:.3f} ms ({ours['p99_ms'] / shuffle['p50_ms']:.2f}x)"
        )
        for s in STRATEGIES:
            row = table[f"litellm {s} (64 deployments)"]
            print(f"  LiteLLM {s} p50 / vidroute p50 at 64: {row['p50_ms'] / ours['p50_ms']:.1f}x")
    before = table.get("before the fast path n=64")
    if before is not None:
        print(f"before / after at 64, p50: {before['p50_ms'] / ours['p50_ms']:.1f}x")
    calls = result["hot_loop_calls_per_decision_64"]
    print(
        "per decision at 64: "
        + ", ".join(
            f"{k} {v:g}" for k, v in calls.items() if "before" not in k and "hard_reject" not in k
        )
    )
    before_calls = result["hot_loop_calls_per_decision_64_before"]
    print(
        "  before the fast path: "
        + ", ".join(f"{k} {v:g}" for k, v in before_calls.items() if v or "dataclasses.fields" in k)
    )


class FixedPlanAdapter:
    """Compile answers a submittable plan at the catalog price at once."""

    async def compile(
        self,
        spec: GenerationSpec,
        *,
        account: str,
        model: str,
        model_version: str = "",
        capability: Capability | None = None,
    ) -> CompiledPlan:
        return CompiledPlan(
            provider="bench",
            account=account,
            model=model,
            model_version=model_version,
            capability_version="",
            price_version="",
            request_hash="sha256:" + "0" * 64,
            estimated_cost_micros=1000,
            currency="USD",
            submittable=True,
            transformations=(Transformation("prompt", TransformationKind.EXACT, "prompt"),),
            plan_json={"account": account, "model": model},
        )


async def end_to_end(tasks: int) -> dict[str, float]:
    maintenance = make_url(
        os.environ.get(
            "VIDROUTE_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
        )
    )
    name = f"vidroute_bench_{secrets.token_hex(4)}"
    admin = create_async_engine(maintenance, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = maintenance.set(database=name).render_as_string(hide_password=False)
    client = aioredis.Redis.from_url(
        os.environ.get("VIDROUTE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    namespace = f"bench{secrets.token_hex(3)}:"
    engine = create_engine(url, pool_size=10)
    try:
        await upgrade(url)
        db = Database(engine)
        accounts = [
            AccountConfig("runway", "prod-us", "us", "kms://r"),
            AccountConfig("google", "veo-us", "us", "kms://g"),
            AccountConfig("self_hosted", "gpu-a", "us", "kms://s"),
        ]
        docs = [d for directory in DIRS for d in documents_from_directory(directory)]
        for d in docs:
            d["max_concurrency"] = 1_000_000
        await publish_documents(db, docs, accounts, now=NOW)
        for i in range(tasks):
            spec = dataclasses.replace(SPEC, tenant_id=f"tenant-{i % 20}", user_id=f"u{i % 7}")
            async with db.unit(NOW) as u:
                await u.create_task(
                    spec, idempotency_key=f"k{i}", spec_hash=normalized_spec_hash(spec)
                )
        adapter: Any = FixedPlanAdapter()
        dispatcher = Dispatcher(
            db=db,
            catalogs=CatalogQueries(db),
            leases=RedisLeaseStore(client, namespace=namespace),
            adapters={"runway": adapter, "google": adapter, "self_hosted": adapter},
            monitor=HealthMonitor(BreakerRegistry(BreakerConfig(), time.time)),
            router=RouterConfig(policy=example_policy("bench")),
            leader=LocalLock("bench"),
            config=DispatcherConfig(batch_size=256, default_concurrency=1_000_000),
            clock=lambda: NOW,
        )
        start = time.perf_counter()
        done = 0
        while done < tasks:
            step = await dispatcher.tick()
            if step == 0:
                break
            done += step
        elapsed = time.perf_counter() - start
        return {"tasks": done, "seconds": elapsed, "tasks_per_s": done / elapsed}
    finally:
        await engine.dispose()
        keys = [k async for k in client.scan_iter(f"{namespace}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description="vidroute routing benchmark")
    parser.add_argument("--quick", action="store_true", help="a smoke run (3 rounds of 50)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--per-round", type=int, default=300, help="decisions/picks per round")
    parser.add_argument("--no-litellm", action="store_true", help="only our pipeline")
    parser.add_argument("--e2e", action="store_true", help="also dispatch on PostgreSQL + Redis")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--default-gc", action="store_true", help="CPython's collector settings")
    args = parser.parse_args()
    rounds, per_round = (3, 50) if args.quick else (args.rounds, args.per_round)
    result = side_by_side(
        rounds, per_round, with_litellm=not args.no_litellm, default_gc=args.default_gc
    )
    result["python"] = sys.version.split()[0]
    report(result)
    if args.e2e:
        e2e = asyncio.run(end_to_end(100 if args.quick else 500))
        result["e2e"] = e2e
        print(
            f"e2e    {e2e['tasks']:.0f} tasks in {e2e['seconds']:.2f} s = "
            f"{e2e['tasks_per_s']:.1f} tasks/s (routed + leased + committed, PostgreSQL + Redis)"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
