"""Worker process for `test_redis_multiprocess`: a real OS process using Redis through the store.

Run as `python _lease_worker.py MODE URL NAMESPACE ...` with the repository root on PYTHONPATH.
Modes:

- `hammer ID ITERATIONS SEED`: print ``ready`` once connected, wait for a line on stdin (the
  start signal, so that every worker races the others however slowly the machine started them),
  then acquire and release random dimension mixes and print JSON stats.
- `hold ATTEMPT TTL_MS`: acquire one lease, print it as JSON, then wait to be killed.
- `reclaim ATTEMPT DEADLINE_S`: poll reclaim_expired until ATTEMPT comes back, print the ids.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import sys

from redis.asyncio import Redis

from controlplane.leases import Dimension, LeaseRequest
from controlplane.leases.redis_store import RedisLeaseStore

ACCOUNT = "runway:prod-us"
ALL_VIDEO = Dimension("all-video", 4)
MODELS = (Dimension("gen4.5", 2), Dimension("gen4-turbo", 2))
REGION = Dimension("region-us", 3)
CAPACITIES = {d.key: d.capacity for d in (ALL_VIDEO, *MODELS, REGION)}


async def hammer(
    store: RedisLeaseStore, worker_id: str, iterations: int, seed: int
) -> dict[str, int]:
    rng = random.Random(seed)
    stats = {"granted": 0, "rejected": 0, "released": 0}
    for i in range(iterations):
        dims = (ALL_VIDEO, rng.choice(MODELS)) + ((REGION,) if rng.random() < 0.5 else ())
        req = LeaseRequest(f"{worker_id}-{i}", ACCOUNT, dims, slots=1, ttl_ms=10_000)
        lease = await store.acquire(req)
        if lease is None:
            stats["rejected"] += 1
            await asyncio.sleep(rng.random() / 1000)  # back off a little, as a scheduler would
            continue
        stats["granted"] += 1
        await asyncio.sleep(rng.random() / 500)  # hold the slot for a moment of "work"
        if rng.random() < 0.3:
            await store.renew(lease)
        stats["released"] += int(await store.release(lease))
    return stats


async def hold(store: RedisLeaseStore, attempt_id: str, ttl_ms: int) -> None:
    lease = await store.acquire(LeaseRequest(attempt_id, ACCOUNT, (ALL_VIDEO,), ttl_ms=ttl_ms))
    print(json.dumps(None if lease is None else dataclasses.asdict(lease)), flush=True)
    await asyncio.Event().wait()  # hold until SIGKILL


async def reclaim(store: RedisLeaseStore, attempt_id: str, deadline_s: float) -> list[str]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    reclaimed: list[str] = []
    while attempt_id not in reclaimed and loop.time() < deadline:
        reclaimed += await store.reclaim_expired()
        await asyncio.sleep(0.02)  # polling interval of the reclaim loop
    return reclaimed


async def main(argv: list[str]) -> int:
    mode, url, namespace, *rest = argv
    client = Redis.from_url(url)
    store = RedisLeaseStore(client, namespace=namespace)
    try:
        if mode == "hammer":
            await client.ping()  # connected before the start line, like the others
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            stats = await hammer(store, rest[0], int(rest[1]), int(rest[2]))
            print(json.dumps(stats), flush=True)
        elif mode == "hold":
            await hold(store, rest[0], int(rest[1]))
        elif mode == "reclaim":
            reclaimed = await reclaim(store, rest[0], float(rest[1]))
            print(json.dumps({"reclaimed": reclaimed}), flush=True)
            return 0 if rest[0] in reclaimed else 1
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    finally:
        await client.aclose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
