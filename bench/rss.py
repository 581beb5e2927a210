"""RSS over a long run with a standing backlog (not a test): ``python -m bench.rss [--minutes 60]``.

Issue 10's "control plane RSS with 100k queued: <= 250 MB, flat over an hour". One process:

- a scratch PostgreSQL database with the published catalog (each capability's
  ``max_concurrency`` set to ``--capacity``, so most of the backlog waits for capacity and the
  parking, decision and DRR state is exercised, not just drained), ``--queued`` QUEUED tasks
  bulk-loaded (90% one flooding tenant with 4 users, 10% over 50 tenants x 4 users);
- the real `Dispatcher.run` loop (batch 64, shipped poll interval and park recheck) on
  `RedisLeaseStore` with its ``on_freed`` wired to `Dispatcher.capacity_freed`, as the runtime
  wires it;
- a stand-in for the execution path: every second, leases older than ``--hold-s`` are released
  (`release_many`) and their tasks set SUCCEEDED, and as many new tasks arrive (so the backlog
  stays at ``--queued``);
- a sampler: every ``--sample-s`` (60) one JSON line with RSS, load average, queued, dispatched,
  parked; at the end the start/end RSS and the least-squares slope (MB/min) after the warm-up.

Needs ``VIDROUTE_BENCH_POSTGRES_URL`` and ``VIDROUTE_BENCH_REDIS_URL`` like ``bench.queue``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import time
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import text

from bench.queue import _arrive, bulk_load, make_dispatcher, rss_mb, scratch_database
from bench.routing import DIRS
from controlplane.capabilities.publish import (
    AccountConfig,
    documents_from_directory,
    publish_documents,
)
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from controlplane.scheduling.dispatcher import DispatcherConfig


async def publish(db: Database, capacity: int) -> None:
    accounts = [
        AccountConfig("runway", "prod-us", "us", "kms://r"),
        AccountConfig("google", "veo-us", "us", "kms://g"),
        AccountConfig("self_hosted", "gpu-a", "us", "kms://s"),
    ]
    docs = [d for directory in DIRS for d in documents_from_directory(directory)]
    for d in docs:
        d["max_concurrency"] = capacity
    await publish_documents(db, docs, accounts, now=datetime.now(UTC))


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minutes, MB)."""
    if len(samples) < 2:
        return float("nan")
    n = len(samples)
    mx = sum(x for x, _ in samples) / n
    my = sum(y for _, y in samples) / n
    var = sum((x - mx) ** 2 for x, _ in samples)
    return sum((x - mx) * (y - my) for x, y in samples) / var if var else float("nan")


async def finish_held(db: Database, store: RedisLeaseStore, hold_ms: int) -> int:
    """The execution path's stand-in: leases held longer than `hold_ms` are released and their
    tasks end SUCCEEDED; returns how many."""
    now_ms = await store.now_ms()
    done: list[int] = []
    for account in await store.accounts():
        snap = await store.snapshot(account)
        old = [lease for lease in snap.leases if now_ms - lease.acquired_at_ms >= hold_ms]
        if old:
            await store.release_many(old)
            done += [int(lease.attempt_id.split("-", 1)[0]) for lease in old]
    if done:
        async with db.unit(datetime.now(UTC)) as u:
            await u.conn.execute(
                text(
                    "UPDATE generation_tasks SET status = 'SUCCEEDED', "
                    "status_version = status_version + 1 WHERE id = ANY(:ids)"
                ),
                {"ids": done},
            )
    return len(done)


async def sample(db: Database, dispatcher: Any, start: float, finished: int) -> dict[str, Any]:
    async with db.reading() as conn:
        queued = await conn.scalar(
            text("SELECT count(*) FROM generation_tasks WHERE status = 'QUEUED'")
        )
    return {
        "minute": round((time.monotonic() - start) / 60, 2),
        "rss_mb": round(rss_mb(), 1),
        "load": [round(x, 2) for x in os.getloadavg()],
        "queued": queued,
        "dispatched": dispatcher.dispatched,
        "finished": finished,
        "parked": len(dispatcher.parking),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    client = aioredis.Redis.from_url(
        os.environ.get("VIDROUTE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    namespace = f"benchrss{secrets.token_hex(3)}:"
    samples: list[dict[str, Any]] = []
    async with scratch_database() as url:
        engine = create_engine(url, pool_size=4)
        db = Database(engine)
        try:
            await publish(db, args.capacity)
            await bulk_load(db, 1, args.queued)
            store = RedisLeaseStore(
                client,
                namespace=namespace,
                on_freed=lambda account: dispatcher.capacity_freed(account),  # noqa: PLW0108 - built next
            )
            dispatcher = make_dispatcher(db, store, DispatcherConfig())
            stop = asyncio.Event()
            loop_task = asyncio.create_task(dispatcher.run(stop))
            start = time.monotonic()
            end = start + args.minutes * 60
            next_sample = start
            finished = arrived = 0
            tenants = [f"tenant-{i}" for i in range(50)]
            while time.monotonic() < end:
                n = await finish_held(db, store, int(args.hold_s * 1000))
                finished += n
                if n:  # keep the backlog standing: 90% to the flood, the rest spread
                    counts = {"flood": n - n // 10}
                    for i in range(n // 10):
                        t = tenants[(arrived + i) % len(tenants)]
                        counts[t] = counts.get(t, 0) + 1
                    await _arrive(db, counts, f"a{arrived}", {})
                    arrived += n
                    dispatcher.wake()
                if time.monotonic() >= next_sample:
                    row = await sample(db, dispatcher, start, finished)
                    print(json.dumps(row), flush=True)
                    samples.append(row)
                    next_sample += args.sample_s
                await asyncio.sleep(1.0)
                if loop_task.done():
                    loop_task.result()  # surface a crashed loop
                    break
            stop.set()
            dispatcher.wake()
            await loop_task
        finally:
            await engine.dispose()
            keys = [k async for k in client.scan_iter(f"{namespace}*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()
    warm = [s for s in samples if s["minute"] >= args.warmup_min] or samples
    return {
        "queued_target": args.queued,
        "capacity_per_capability": args.capacity,
        "minutes": args.minutes,
        "rss_start_mb": samples[0]["rss_mb"] if samples else None,
        "rss_after_warmup_mb": warm[0]["rss_mb"] if warm else None,
        "rss_end_mb": samples[-1]["rss_mb"] if samples else None,
        "rss_max_mb": max((s["rss_mb"] for s in samples), default=None),
        "slope_mb_per_min_after_warmup": round(
            slope_mb_per_min([(s["minute"], s["rss_mb"]) for s in warm]), 4
        ),
        "dispatched": samples[-1]["dispatched"] if samples else 0,
        "finished": samples[-1]["finished"] if samples else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="vidroute RSS over a long standing backlog")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--capacity", type=int, default=16, help="max_concurrency per capability")
    parser.add_argument("--hold-s", type=float, default=2.0, help="seconds a lease is held")
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--warmup-min", type=float, default=5.0)
    args = parser.parse_args()
    print("load average:", os.getloadavg(), flush=True)
    result = asyncio.run(run(args))
    print("load average:", os.getloadavg(), flush=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
