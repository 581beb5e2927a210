"""Durable fair queue benchmark (not a test): ``python -m bench.queue [--quick] [--million]``.

1. Round overhead and RSS by backlog: 1k, 10k, 100k (and 1M with ``--million``) QUEUED tasks
   bulk-loaded server side (``INSERT ... SELECT generate_series``: 90% one flooding tenant with
   4 users, 10% spread over 50 tenants x 4 users). Per size: the median of 7 dry rounds
   (`Dispatcher.next_round`: heads read, in-flight aggregate, requeue facts, DRR rebuild, pop
   of a 64-task round, i.e. everything a round does besides dispatching), the process RSS, and,
   for comparison, the old way (read the oldest 2,000 QUEUED rows and rebuild from them). Then a
   light tenant's one task is queued behind it all and one real round runs (is it dispatched?).
   A last row adds 20,000 tasks of one tenant with 2,000 users: the cost follows the groups.
2. The fairness flood through the real dispatcher on PostgreSQL (published catalog, Redis
   leases, an in-process adapter that compiles at once): tenants A:B:C weighted 5:2:1; rounds
   of 32; Poisson arrivals per round A 16, B 6, C (the light tenant) 1 (~72% load).
   *calm*: just that; *flooded*: A also queues 100x C's expected total in bulk before round 1.
   Light-tenant waits are wall-clock seconds from its task's insert to its attempt's commit.
   *saturated*: A 100x, B and C backlogged too, served cost shares vs 5:2:1 and Jain's index.

Needs ``VIDROUTE_BENCH_POSTGRES_URL`` (maintenance database, default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``) and ``VIDROUTE_BENCH_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.routing import DIRS, SPEC, FixedPlanAdapter
from controlplane.capabilities.publish import (
    AccountConfig,
    documents_from_directory,
    publish_documents,
)
from controlplane.domain import fairqueue as fq
from controlplane.domain.breaker import BreakerConfig, BreakerRegistry
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import example_policy
from controlplane.domain.states import TaskState
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import upgrade
from controlplane.persistence.models import generation_tasks
from controlplane.persistence.queue import QueueQueries
from controlplane.persistence.records import TaskRecord
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig, DispatchOutcome
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LocalLock
from vidroute_core.codec import spec_to_dict
from vidroute_core.hashing import normalized_spec_hash

WEIGHTS = {"A": 5.0, "B": 2.0, "C": 1.0}
ROUND = 32
RATES = {"A": 16.0, "B": 6.0, "C": 1.0}  # arrivals per round


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@asynccontextmanager
async def scratch_database() -> AsyncIterator[str]:
    maintenance = make_url(
        os.environ.get(
            "VIDROUTE_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
        )
    )
    name = f"vidroute_bench_q_{secrets.token_hex(4)}"
    admin = create_async_engine(maintenance, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = maintenance.set(database=name).render_as_string(hide_password=False)
    try:
        await upgrade(url)
        yield url
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


_BULK = """
INSERT INTO generation_tasks (tenant_id, user_id, project_id, idempotency_key, spec,
  normalized_spec_hash, service_class, priority, status, status_version, last_event_seq,
  created_at, updated_at)
SELECT tn, us, 'p1', 'bulk-' || CAST(i AS text),
  jsonb_set(jsonb_set(CAST(:spec AS jsonb), '{tenant_id}', to_jsonb(tn)), '{user_id}',
            to_jsonb(us)),
  :hash, 'STANDARD', 0, 'QUEUED', 0, 0, :now, :now
FROM (
  SELECT i,
    CASE WHEN i % 10 = 0 THEN 'tenant-' || CAST((i / 10) % 50 AS text) ELSE :flood END AS tn,
    'u' || CAST((i / 7) % CAST(:users AS bigint) AS text) AS us
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i
) AS s
"""


async def bulk_load(
    db: Database, lo: int, hi: int, *, flood: str = "flood", users: int = 4
) -> None:
    """Tasks lo..hi (inclusive) QUEUED, written by the server itself, then VACUUM ANALYZE (the
    state autovacuum reaches; right after a bulk load the index-only skip scan must visit the
    heap for every probe)."""
    async with db.unit(datetime.now(UTC)) as u:
        await u.conn.execute(
            text(_BULK),
            {
                "spec": json.dumps(spec_to_dict(SPEC)),
                "hash": normalized_spec_hash(SPEC),
                "now": datetime.now(UTC),
                "lo": lo,
                "hi": hi,
                "flood": flood,
                "users": users,
            },
        )
    async with db.engine.connect() as raw:
        conn = await raw.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM (ANALYZE) generation_tasks"))


def make_dispatcher(db: Database, leases: Any, config: DispatcherConfig) -> Dispatcher:
    adapter: Any = FixedPlanAdapter()
    return Dispatcher(
        db=db,
        catalogs=CatalogQueries(db),
        leases=leases,
        adapters={"runway": adapter, "google": adapter, "self_hosted": adapter},
        monitor=HealthMonitor(BreakerRegistry(BreakerConfig(), time.time)),
        router=RouterConfig(policy=example_policy("bench")),
        leader=LocalLock(f"bench-{secrets.token_hex(3)}"),
        config=config,
    )


async def old_scan_round(db: Database, config: DispatcherConfig) -> float:
    """The replaced way: oldest 2,000 QUEUED rows, rebuild, pop one round; seconds."""
    start = time.perf_counter()
    rows = await CatalogQueries(db).tasks_in_states([TaskState.QUEUED], limit=2000)
    queue = fq.FairQueue.rebuild(config.fair_queue, time.time, [_queued(t) for t in rows])
    queue.pop_batch(config.batch_size)
    return time.perf_counter() - start


def _queued(task: TaskRecord) -> fq.QueuedTask:
    out = task.spec.output
    cost = fq.estimate_cost_units(
        out.duration_ms / 1000, out.width, out.height, max(out.sample_count, 1)
    )
    return fq.QueuedTask(
        str(task.id),
        task.tenant_id,
        task.user_id,
        task.project_id,
        fq.ServiceClass(task.service_class.value),
        float(task.priority),
        cost,
        task.created_at.timestamp(),
    )


async def backlog_sizes(sizes: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    client = aioredis.Redis.from_url(
        os.environ.get("VIDROUTE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    namespace = f"benchq{secrets.token_hex(3)}:"
    async with scratch_database() as url:
        engine = create_engine(url, pool_size=4)
        db = Database(engine)
        await _publish(db)
        config = DispatcherConfig(default_concurrency=1_000_000)
        dispatcher = make_dispatcher(db, RedisLeaseStore(client, namespace=namespace), config)
        loaded = 0
        try:
            plan = [(size, "flood", 4) for size in sizes]
            # Then 20,000 more from one tenant with 2,000 users: the cost follows the groups.
            plan.append((sizes[-1] + 20_000, "wide", 2_000))
            for size, flood, users in plan:
                t0 = time.perf_counter()
                await bulk_load(db, loaded + 1, size, flood=flood, users=users)
                load_s = time.perf_counter() - t0
                loaded = size
                await dispatcher.next_round()  # warm: plans, connections
                samples, taken = [], 0
                for _ in range(7):
                    start = time.perf_counter()
                    taken = len(await dispatcher.next_round())
                    samples.append(time.perf_counter() - start)
                heads = await QueueQueries(db).heads(
                    now=datetime.now(UTC), rows=config.scan_limit, per_group_max=config.batch_size
                )
                old = statistics.median([await old_scan_round(db, config) for _ in range(3)])
                # A light tenant's one task, queued behind all of it, and one real round.
                light: dict[int, tuple[str, float]] = {}
                await _arrive(db, {f"light-{size}": 1}, "light", light)
                (light_id,) = light
                start = time.perf_counter()
                await dispatcher.tick()
                tick_s = time.perf_counter() - start
                async with db.reading() as conn:
                    state = await conn.scalar(
                        select(generation_tasks.c.status).where(generation_tasks.c.id == light_id)
                    )
                row = {
                    "queued": size,
                    "load_s": round(load_s, 1),
                    "groups": heads.groups,
                    "head_rows": len(heads.tasks),
                    "round_take": taken,
                    "round_overhead_ms": round(statistics.median(samples) * 1000, 2),
                    "round_overhead_max_ms": round(max(samples) * 1000, 2),
                    "old_scan_round_ms": round(old * 1000, 1),
                    "rss_mb": round(rss_mb(), 1),
                    "light_task_after_one_round": state,
                    "real_round_s": round(tick_s, 2),
                }
                print(row, flush=True)
                out.append(row)
        finally:
            await engine.dispose()
            keys = [k async for k in client.scan_iter(f"{namespace}*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()
    return out


async def _arrive(
    db: Database, counts: dict[str, int], tag: str, arrived: dict[int, tuple[str, float]]
) -> None:
    if not any(counts.values()):
        return
    now = datetime.now(UTC)
    rows = []
    for tenant, n in counts.items():
        spec_json = spec_to_dict(SPEC) | {"tenant_id": tenant}
        for i in range(n):
            rows.append(
                {
                    "tenant_id": tenant,
                    "user_id": "u1",
                    "project_id": "p1",
                    "idempotency_key": f"{tag}-{tenant}-{i}-{secrets.token_hex(4)}",
                    "spec": spec_json,
                    "normalized_spec_hash": normalized_spec_hash(SPEC),
                    "service_class": "STANDARD",
                    "priority": 0,
                    "status": TaskState.QUEUED.value,
                    "status_version": 0,
                    "last_event_seq": 0,
                    "created_at": now,
                    "updated_at": now,
                }
            )
    at = time.perf_counter()
    async with db.unit(now) as u:
        result = await u.conn.execute(
            insert(generation_tasks).returning(generation_tasks.c.id, generation_tasks.c.tenant_id),
            rows,
        )
        for task_id, tenant in result:
            arrived[task_id] = (tenant, at)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


async def flood_scenario(
    db: Database, leases: Any, *, rounds: int, flood: int, backlog: dict[str, int], seed: int
) -> dict[str, Any]:
    config = DispatcherConfig(
        batch_size=ROUND,
        default_concurrency=1_000_000,
        fair_queue=fq.FairQueueConfig(tenant_weights=WEIGHTS),
    )
    dispatcher = make_dispatcher(db, leases, config)
    arrived: dict[int, tuple[str, float]] = {}
    arrival_round: dict[int, int] = {}
    current = [0]
    rounds_waited: list[int] = []
    waits: dict[str, list[float]] = {t: [] for t in WEIGHTS}
    served: Counter[str] = Counter()
    original = dispatcher.dispatch_batch
    tick_s: list[float] = []

    async def timed(tasks: list[TaskRecord], facts: Any, **kw: Any) -> list[Any]:
        results = await original(tasks, facts, **kw)
        tenant_of = {t.id: t.tenant_id for t in tasks}
        for result in results:
            if result.outcome is not DispatchOutcome.SELECTED:
                continue
            tenant, at = arrived.pop(result.task_id, (tenant_of[result.task_id], float("nan")))
            waits.setdefault(tenant, []).append(time.perf_counter() - at)
            if tenant == "C" and result.task_id in arrival_round:
                rounds_waited.append(current[0] - arrival_round.pop(result.task_id))
            served[tenant] += 1
        return results

    dispatcher.dispatch_batch = timed  # type: ignore[method-assign]  # the test swaps in a recording or failing double
    await _arrive(db, {"A": flood, **backlog}, "flood", arrived)
    rng = random.Random(seed)
    for r in range(rounds):
        counts = {t: _poisson(rng, rate) for t, rate in RATES.items()}
        before = set(arrived)
        await _arrive(db, counts, f"r{r}", arrived)
        current[0] = r
        for task_id in set(arrived) - before:
            if arrived[task_id][0] == "C":
                arrival_round[task_id] = r
        start = time.perf_counter()
        await dispatcher.tick()
        tick_s.append(time.perf_counter() - start)
    total = sum(served.values())
    normalised = [served[t] / w for t, w in WEIGHTS.items()]
    jain = sum(normalised) ** 2 / (len(normalised) * sum(x * x for x in normalised) or 1)
    return {
        "served": dict(served),
        "shares": {t: round(served[t] / total, 4) for t in WEIGHTS} if total else {},
        "jain": round(jain, 4),
        "light_waits": len(waits["C"]),
        "light_p50_s": round(statistics.median(waits["C"]), 3) if waits["C"] else None,
        "light_p99_s": round(p99(waits["C"]), 3),
        # 0: dispatched in the round right after it arrived (Poisson arrivals only).
        "light_rounds_waited_max": max(rounds_waited, default=None),
        "round_s_median": round(statistics.median(tick_s), 3),
        "rss_mb": round(rss_mb(), 1),
    }


def _poisson(rng: random.Random, rate: float) -> int:
    n, t = 0, rng.expovariate(rate)
    while t < 1.0:
        n += 1
        t += rng.expovariate(rate)
    return n


async def fairness(rounds: int) -> dict[str, Any]:
    client = aioredis.Redis.from_url(
        os.environ.get("VIDROUTE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    out: dict[str, Any] = {}
    light_total = int(RATES["C"] * rounds)
    scenarios: dict[str, dict[str, Any]] = {
        "calm": {"flood": 0, "backlog": {}},
        "flooded": {"flood": 100 * light_total, "backlog": {}},
        "saturated": {
            "flood": 100 * light_total,
            "backlog": {"B": rounds * ROUND, "C": rounds * ROUND},
        },
    }
    try:
        for name, params in scenarios.items():
            async with scratch_database() as url:
                engine = create_engine(url, pool_size=10)
                namespace = f"benchq{secrets.token_hex(3)}:"
                try:
                    db = Database(engine)
                    await _publish(db)
                    leases = RedisLeaseStore(client, namespace=namespace)
                    out[name] = await flood_scenario(db, leases, rounds=rounds, seed=7, **params)
                    print(name, out[name], flush=True)
                finally:
                    await engine.dispose()
                    keys = [k async for k in client.scan_iter(f"{namespace}*")]
                    if keys:
                        await client.delete(*keys)
    finally:
        await client.aclose()
    calm, flooded = out["calm"]["light_p99_s"], out["flooded"]["light_p99_s"]
    out["light_p99_ratio_flooded_vs_calm"] = round(flooded / calm, 2) if calm else None
    return out


async def _publish(db: Database) -> None:
    accounts = [
        AccountConfig("runway", "prod-us", "us", "kms://r"),
        AccountConfig("google", "veo-us", "us", "kms://g"),
        AccountConfig("self_hosted", "gpu-a", "us", "kms://s"),
    ]
    docs = [d for directory in DIRS for d in documents_from_directory(directory)]
    for d in docs:
        d["max_concurrency"] = 1_000_000
    await publish_documents(db, docs, accounts, now=datetime.now(UTC))


def main() -> None:
    parser = argparse.ArgumentParser(description="vidroute durable fair queue benchmark")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1k/10k, 8 rounds")
    parser.add_argument("--million", action="store_true", help="also 1M queued")
    parser.add_argument("--rounds", type=int, default=40, help="rounds per fairness scenario")
    parser.add_argument("--backlog-only", action="store_true", help="skip the fairness flood")
    args = parser.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    if args.million:
        sizes.append(1_000_000)
    print("load average:", os.getloadavg(), flush=True)
    backlog = asyncio.run(backlog_sizes(sizes))
    flood = {} if args.backlog_only else asyncio.run(fairness(8 if args.quick else args.rounds))
    print("load average:", os.getloadavg(), flush=True)
    print(json.dumps({"backlog": backlog, "fairness": flood}, indent=2))


if __name__ == "__main__":
    main()
