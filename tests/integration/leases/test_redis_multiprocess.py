"""The Redis lease store under real concurrency: several OS processes share one account's quota.

The worker processes run `_lease_worker.py`. This process watches the counters while they run.
The Lua scripts must keep every dimension within capacity no matter how the processes interleave.
A holder killed with SIGKILL must lose its slots to another process's reclaimer once its lease
expires.

Nothing here is a speed claim: what is proved is counts and order, so the timeout is a hang guard
sized for a loaded machine (the hammer's ~2 s of CPU over six processes, stretched by a load of 40
on two cores), and the hammer workers start on one signal, after all of them are up, so that they
race however unevenly a busy machine started them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis

from controlplane.leases.redis_store import RedisLeaseStore

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

WORKER = Path(__file__).with_name("_lease_worker.py")
REPO_ROOT = Path(__file__).resolve().parents[3]
ACCOUNT = "runway:prod-us"
CAPACITIES = {"all-video": 4, "gen4.5": 2, "gen4-turbo": 2, "region-us": 3}
WORKERS = 6
ITERATIONS = 60


async def spawn(*args: str) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )


async def ready(proc: asyncio.subprocess.Process) -> None:
    """Wait for a hammer worker's ``ready`` line (connected, waiting for the start signal)."""
    assert proc.stdout is not None
    line = await proc.stdout.readline()
    assert line.strip() == b"ready", (line, await proc.stderr.read() if proc.stderr else b"")


async def finish(proc: asyncio.subprocess.Process, start: bytes | None = None) -> dict[str, object]:
    stdout, stderr = await proc.communicate(start)
    assert proc.returncode == 0, stderr.decode()
    result: dict[str, object] = json.loads(stdout.decode().strip().splitlines()[-1])
    return result


async def test_concurrent_processes_never_exceed_capacity(
    redis_client: Redis, redis_namespace: str, redis_url: str
) -> None:
    """Racing processes never push a dimension past capacity, and every count returns to 0."""
    store = RedisLeaseStore(redis_client, namespace=redis_namespace)
    procs = [
        await spawn("hammer", redis_url, redis_namespace, f"w{i}", str(ITERATIONS), str(i))
        for i in range(WORKERS)
    ]
    try:
        await asyncio.gather(*(ready(p) for p in procs))
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    # One start signal for all: communicate() below writes it and closes stdin.
    waiters = asyncio.gather(*(finish(p, start=b"go\n") for p in procs))
    peaks = dict.fromkeys(CAPACITIES, 0)
    samples = 0
    try:
        while not waiters.done():
            counts = await asyncio.gather(*(store.used(ACCOUNT, key) for key in CAPACITIES))
            for key, count in zip(CAPACITIES, counts, strict=True):
                assert 0 <= count <= CAPACITIES[key], f"{key} at {count} > {CAPACITIES[key]}"
                peaks[key] = max(peaks[key], count)
            samples += 1
            await asyncio.wait({waiters}, timeout=0.002)
        stats = await waiters
    finally:
        # A failed assertion must not leave workers writing into the namespace after cleanup.
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
        await asyncio.gather(waiters, return_exceptions=True)

    granted = sum(int(s["granted"]) for s in stats)  # type: ignore[call-overload]  # stats rows are JSON objects typed object
    rejected = sum(int(s["rejected"]) for s in stats)  # type: ignore[call-overload]  # stats rows are JSON objects typed object
    released = sum(int(s["released"]) for s in stats)  # type: ignore[call-overload]  # stats rows are JSON objects typed object
    assert granted == released
    assert granted + rejected == WORKERS * ITERATIONS
    assert rejected > 0, "the workload never hit a full dimension, so it proved nothing"
    assert samples > 10
    assert peaks["all-video"] > 1
    for key in CAPACITIES:
        assert await store.used(ACCOUNT, key) == 0
    snapshot = await store.snapshot(ACCOUNT)
    assert snapshot.leases == ()


async def test_lease_of_a_killed_holder_is_reclaimed_by_another_process(
    redis_client: Redis, redis_namespace: str, redis_url: str
) -> None:
    """A SIGKILLed holder's lease expires and another process's reclaimer returns its slot."""
    store = RedisLeaseStore(redis_client, namespace=redis_namespace)
    holder = await spawn("hold", redis_url, redis_namespace, "doomed-1", "300")
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), timeout=10)
        lease = json.loads(line)
        assert lease is not None
        assert lease["attempt_id"] == "doomed-1"
        assert await store.used(ACCOUNT, "all-video") == 1

        os.kill(holder.pid, signal.SIGKILL)
        await holder.communicate()
        assert holder.returncode == -signal.SIGKILL
    finally:
        if holder.returncode is None:  # the holder never exits on its own
            holder.kill()
            await holder.communicate()

    reclaimer = await spawn("reclaim", redis_url, redis_namespace, "doomed-1", "10")
    result = await finish(reclaimer)
    assert result["reclaimed"] == ["doomed-1"]
    assert await store.used(ACCOUNT, "all-video") == 0
    assert (await store.snapshot(ACCOUNT)).leases == ()
