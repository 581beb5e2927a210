"""Scale-out benchmark (not a test): ``python -m bench.shards [--tasks N] [--replicas 1,2]``.

For each replica count K: a scratch PostgreSQL database with the published catalog (capacity
raised so leases never hold a task back), N QUEUED tasks spread over 64 tenants (bulk-loaded
server side), then K control-plane scheduling replicas, each its own OS process running
`build_scheduling` as `bootstrap` does (``shard_count`` 4, Redis leases, an adapter that compiles
at once). The replicas split the shards by advisory locks; the parent counts attempts and
reports dispatched tasks per second from the first attempt to the last, and checks that every
task has exactly one attempt.

Needs ``VIDROUTE_BENCH_POSTGRES_URL`` (maintenance database, default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``) and ``VIDROUTE_BENCH_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import secrets
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import func, select, text

from bench.queue import _publish, scratch_database
from bench.routing import SPEC, FixedPlanAdapter
from controlplane.domain.scoring import example_policy
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.persistence.advisory import SHARD_CLASS
from controlplane.persistence.database import Database
from controlplane.persistence.models import task_attempts
from controlplane.scheduling.dispatcher import DispatcherConfig
from controlplane.scheduling.runtime import build_scheduling
from vidroute_core.codec import spec_to_dict
from vidroute_core.hashing import normalized_spec_hash

SHARDS = int(os.environ.get("VIDROUTE_BENCH_SHARDS", "4"))  # --shards sets it for the replicas
TENANTS = 64
_BULK = """
INSERT INTO generation_tasks (tenant_id, user_id, project_id, idempotency_key, spec,
  normalized_spec_hash, service_class, priority, status, status_version, last_event_seq,
  created_at, updated_at)
SELECT tn, 'u1', 'p1', 'bulk-' || CAST(i AS text),
  jsonb_set(CAST(:spec AS jsonb), '{tenant_id}', to_jsonb(tn)),
  :hash, 'STANDARD', 0, 'QUEUED', 0, 0, :now, :now
FROM (
  SELECT i, 'tenant-' || CAST(i % :tenants AS text) AS tn
  FROM generate_series(1, CAST(:n AS bigint)) AS i
) AS s
"""


def redis_url() -> str:
    return os.environ.get("VIDROUTE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


async def replica(url: str, namespace: str) -> None:
    """One replica: schedule until the parent terminates it."""
    db = Database.from_url(url)
    client = aioredis.Redis.from_url(redis_url())
    adapter: Any = FixedPlanAdapter()
    runtime = build_scheduling(
        db=db,
        database_url=url,
        leases=functools.partial(RedisLeaseStore, client, namespace=namespace),
        adapters={"runway": adapter, "google": adapter, "self_hosted": adapter},
        policy=example_policy("bench"),
        redis_client=client,
        config=DispatcherConfig(
            shard_count=SHARDS, default_concurrency=1_000_000, leader_retry_s=0.2
        ),
        worker_id=f"bench-{os.getpid()}",
    )
    runtime.start()
    try:
        await asyncio.Event().wait()
    finally:
        await runtime.stop()


async def attempts(db: Database) -> tuple[int, int]:
    """(tasks with an attempt, attempts)."""
    async with db.reading() as conn:
        row = (
            await conn.execute(
                select(func.count(func.distinct(task_attempts.c.task_id)), func.count())
            )
        ).one()
    return int(row[0]), int(row[1])


async def balanced(db: Database, count: int, deadline: float) -> None:
    """Wait until the replicas lead every shard between them, each its share."""
    while time.monotonic() < deadline:
        async with db.reading() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT pid, count(*) FROM pg_locks WHERE locktype = 'advisory'"
                        " AND granted AND objsubid = 2 AND classid::bigint = :c GROUP BY pid"
                    ),
                    {"c": SHARD_CLASS},
                )
            ).all()
        if sum(n for _, n in rows) == SHARDS and len(rows) == min(count, SHARDS):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the replicas did not split the shards")


async def run(count: int, tasks: int, timeout_s: float) -> dict[str, Any]:
    async with scratch_database() as url:
        db = Database.from_url(url)
        await _publish(db)
        namespace = f"bench-shards-{secrets.token_hex(3)}"
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is timed
                [sys.executable, "-m", "bench.shards", "--replica", url, "--namespace", namespace]
            )
            for _ in range(count)
        ]
        first = last = None
        done = total = 0
        deadline = time.monotonic() + timeout_s
        try:
            if SHARDS > 1:
                await balanced(db, count, deadline)  # then the backlog arrives
            async with db.unit(datetime.now(UTC)) as u:
                await u.conn.execute(
                    text(_BULK),
                    {
                        "spec": json.dumps(spec_to_dict(SPEC)),
                        "hash": normalized_spec_hash(SPEC),
                        "now": datetime.now(UTC),
                        "n": tasks,
                        "tenants": TENANTS,
                    },
                )
            while time.monotonic() < deadline:
                done, total = await attempts(db)
                now = time.monotonic()
                if done and first is None:
                    first = now
                if done >= tasks:
                    last = now
                    break
                await asyncio.sleep(0.1)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)
            await db.dispose()
        elapsed = (last or time.monotonic()) - (first or time.monotonic())
        return {
            "replicas": count,
            "tasks": tasks,
            "dispatched": done,
            "attempts": total,
            "once_each": done == total,
            "seconds": round(elapsed, 2),
            "tasks_per_s": round(done / elapsed, 1) if elapsed > 0 else None,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description="vidroute scale-out benchmark")
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--shards", type=int, default=SHARDS)
    parser.add_argument("--replica", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["VIDROUTE_BENCH_SHARDS"] = str(args.shards)
    globals()["SHARDS"] = args.shards
    if args.replica:
        asyncio.run(replica(args.replica, args.namespace))
        return
    load = os.getloadavg()[0]
    rows = [asyncio.run(run(int(k), args.tasks, args.timeout)) for k in args.replicas.split(",")]
    print(json.dumps({"load_average": round(load, 2), "shards": SHARDS, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
