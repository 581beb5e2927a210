"""The control plane's RSS over a long run (not a test): ``python -m bench.rss_serve``.

Issue 20, item 4: "memory stays flat" for the process that is deployed, not for a dispatcher
alone (`bench.rss` measures that one). One command, one run, started as the e2e tests start
the platform (`tests.support.stack`):

- the three provider emulators (threads of this process) and the three sidecar processes, each
  from its shipped ``config.example.yaml``, all on one time factor (``--scale``, default 0.1: a
  60 s provider job takes 6 s);
- `vidroute serve` on its defaults, on a scratch PostgreSQL database and a claimed Redis
  logical database, callbacks on;
- ``--queued`` (100k) QUEUED tasks written before the clock starts by the server's own create
  statement (`_create.insert_many`, batches of 1,000: each task with its QUEUED event and
  outbox message, as CreateTask writes them); AUTO routing, each task its own prompt (spec
  hashes differ as in real traffic, so every cache keyed by one fills to its bound), 4, 6 or
  8 s; 90% one flooding tenant with 4 users, 10% over 50 tenants;
- a steady lifecycle flow: the shipped capabilities' ``max_concurrency`` bounds how many run at
  once, the emulators finish them, and every ``--refill-s`` (5 s) the bench sends as many
  CreateTask calls over gRPC as tasks became terminal since the last refill, so the backlog
  stays at ``--queued``;
- a sampler: every ``--sample-s`` (60) one JSON line with the control plane's RSS and its
  anonymous and file-backed parts and thread count (``/proc/<pid>/status``), the load average,
  CreateTask refusals by code, tasks by status (and failure code);
  at the end the RSS at start, after the warm-up, at the end, the maximum and the least-squares
  slope (MB/min) after ``--warmup-min``.

``--cp-env KEY=VALUE`` (repeatable) adds a variable to the control plane's environment, e.g.
``PYTHONPATH`` of a ``sitecustomize`` that takes tracemalloc snapshots while hunting a leak.

Needs ``VIDROUTE_BENCH_POSTGRES_URL`` (maintenance database, default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``) and ``VIDROUTE_BENCH_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.lifecycle import _create_db, _drop_db, _maintenance
from bench.rss import slope_mb_per_min
from controlplane.domain.money import Reservation
from controlplane.persistence import _create
from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.wire.spec import spec_from_proto

TENANTS = [f"tenant-{i}" for i in range(50)]
_COUNTS_SQL = "SELECT status, failure_code, count(*) FROM generation_tasks GROUP BY 1, 2"


def _spec(i: int) -> gen.GenerationSpec:
    """Task i's text-to-video spec on AUTO routing (any provider of the farm may take it): its
    own prompt (so spec hashes differ as in real traffic, and every cache keyed by one fills),
    4, 6 or 8 s at 720p. Tenants: 90% one flooding tenant with 4 users, 10% over 50 tenants."""
    tenant = TENANTS[(i // 10) % len(TENANTS)] if i % 10 == 0 else "flood"
    return gen.GenerationSpec(
        tenant_id=tenant,
        user_id=f"u{(i // 7) % 4}",
        prompt=f"a red kite over a green hill, take {i}",
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=(4000, 6000, 8000)[i % 3]),
    )


def _new_task(i: int, run_key: str) -> _create.NewTask:
    spec, violations = spec_from_proto(_spec(i))
    assert not violations, violations
    return _create.NewTask(
        spec=spec,
        idempotency_key=f"{run_key}-bulk-{i}",
        spec_hash=normalized_spec_hash(spec),
        queue_deadline_at=None,
        deadline_at=None,
        trace_context=None,
    )


async def bulk_queue(url: str, count: int, run_key: str) -> None:
    """`count` QUEUED tasks written by the server's create statement, 1,000 per statement."""
    engine = create_engine(url, pool_size=1)
    db = Database(engine)
    try:
        for lo in range(0, count, 1000):
            now = datetime.now(UTC)
            items: list[tuple[_create.NewTask, Reservation | None, datetime]] = [
                (_new_task(i, run_key), None, now) for i in range(lo, min(count, lo + 1000))
            ]
            async with db.unit(now, one_statement=True) as u:
                await _create.insert_many(u.conn, items)
        async with engine.connect() as raw:
            conn = await raw.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text("VACUUM (ANALYZE) generation_tasks"))
    finally:
        await engine.dispose()


async def counts(url: str) -> dict[str, int]:
    """Tasks by status (and failure code, for FAILED ones)."""
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(text(_COUNTS_SQL))).all()
    finally:
        await engine.dispose()
    out: dict[str, int] = {}
    for status, code, n in rows:
        label = str(status) if code is None else f"{status}:{code}"
        out[label] = out.get(label, 0) + int(n)
    return out


def terminal(states: dict[str, int]) -> int:
    return sum(
        n for k, n in states.items() if k.split(":")[0] in ("SUCCEEDED", "FAILED", "CANCELLED")
    )


def memory_of(pid: int) -> dict[str, float]:
    """The process's RSS and its anonymous (heap, arenas) and file-backed (libraries) parts in
    MB, and its thread count, from ``/proc/<pid>/status``."""
    fields = {"VmRSS": "rss_mb", "RssAnon": "anon_mb", "RssFile": "file_mb", "Threads": "threads"}
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in fields:
                number = int(value.split()[0])
                out[fields[name]] = number if name == "Threads" else round(number / 1024, 1)
    return out


def _create_one(cp: ControlPlane, i: int, run_key: str, tries: int = 10) -> str:
    """CreateTask for task i; "" when created, else the status code of the last refusal. The
    same key is sent again after a timeout or UNAVAILABLE (a replay, never a second task)."""
    request = api.CreateTaskRequest(spec=_spec(i), idempotency_key=f"{run_key}-{i}")
    code = ""
    for _ in range(tries):
        try:
            assert cp.stub is not None
            cp.stub.CreateTask(request, timeout=10)
            return ""
        except grpc.RpcError as exc:
            code = exc.code().name
            if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                break
    return code


def _start(cp: ControlPlane, tries: int = 3) -> None:
    """`cp.start()`, again after a start that missed the harness's 60 s (a loaded machine)."""
    for attempt in range(1, tries + 1):
        try:
            cp.start()
            return
        except TimeoutError:
            if attempt == tries:
                raise
            print(f"control plane start {attempt} timed out; starting again", flush=True)


def run(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:  # noqa: PLR0915 - one script
    work = Path(tempfile.mkdtemp(prefix="vidroute-bench-rss-"))
    name = f"vidroute_bench_rss_{secrets.token_hex(4)}"
    asyncio.run(_create_db(name))
    url = _maintenance().set(database=name).render_as_string(hide_password=False)
    run_key = secrets.token_hex(4)
    samples: list[dict[str, Any]] = []
    try:
        with ProviderFarm(work / "farm", time_scale=args.scale) as farm:
            (work / "cp").mkdir()
            env = dict(kv.split("=", 1) for kv in args.cp_env)
            cp = ControlPlane(work / "cp", farm, database_url=url, redis_url=redis_url, env=env)
            # Start once to migrate the database, stop, load the backlog, start again: the
            # measured process starts with 100k queued, as one restarted in production does.
            _start(cp)
            cp.stop()
            loaded = time.monotonic()
            asyncio.run(bulk_queue(url, args.queued, run_key))
            print(f"loaded {args.queued} in {time.monotonic() - loaded:.0f} s", flush=True)
            _start(cp)
            try:
                assert cp.proc is not None
                pid = cp.proc.popen.pid
                start = time.monotonic()
                end = start + args.minutes * 60
                next_sample = start
                created = 0
                refused: dict[str, int] = {}  # CreateTask refusals by status code
                done_before = terminal(asyncio.run(counts(url)))
                with ThreadPoolExecutor(8) as pool:
                    while time.monotonic() < end:
                        states = asyncio.run(counts(url))
                        done = terminal(states)
                        if done > done_before:  # keep the backlog standing
                            first = args.queued + created
                            for code in pool.map(
                                lambda i: _create_one(cp, i, run_key),
                                range(first, first + done - done_before),
                            ):
                                if code:
                                    refused[code] = refused.get(code, 0) + 1
                            created += done - done_before
                            done_before = done
                        if time.monotonic() >= next_sample:
                            row = {
                                "minute": round((time.monotonic() - start) / 60, 2),
                                **memory_of(pid),
                                "load": [round(x, 2) for x in os.getloadavg()],
                                "created": created,
                                "refused": refused,
                                "states": states,
                            }
                            print(json.dumps(row), flush=True)
                            samples.append(row)
                            next_sample += args.sample_s
                        if not cp.alive():
                            raise RuntimeError(f"control plane exited:\n{cp.logs()}")
                        time.sleep(args.refill_s)
                row = {
                    "minute": round((time.monotonic() - start) / 60, 2),
                    **memory_of(pid),
                    "load": [round(x, 2) for x in os.getloadavg()],
                    "created": created,
                    "refused": refused,
                    "states": asyncio.run(counts(url)),
                }
                print(json.dumps(row), flush=True)
                samples.append(row)
            finally:
                cp.stop()
    finally:
        asyncio.run(_drop_db(name))
        if os.environ.get("VIDROUTE_BENCH_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    warm = [s for s in samples if s["minute"] >= args.warmup_min] or samples
    return {
        "queued": args.queued,
        "scale": args.scale,
        "minutes": args.minutes,
        "rss_start_mb": samples[0]["rss_mb"] if samples else None,
        "rss_after_warmup_mb": warm[0]["rss_mb"] if warm else None,
        "rss_end_mb": samples[-1]["rss_mb"] if samples else None,
        "rss_max_mb": max((s["rss_mb"] for s in samples), default=None),
        "slope_mb_per_min_after_warmup": round(
            slope_mb_per_min([(s["minute"], s["rss_mb"]) for s in warm]), 4
        ),
        "created_during_run": samples[-1]["created"] if samples else 0,
        "create_refused": samples[-1]["refused"] if samples else {},
        "final_states": samples[-1]["states"] if samples else {},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--scale", type=float, default=0.1, help="the platform's time factor")
    parser.add_argument("--refill-s", type=float, default=5.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--warmup-min", type=float, default=5.0)
    parser.add_argument("--cp-env", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    print("load average:", os.getloadavg(), flush=True)
    base = os.environ.get("VIDROUTE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    with RedisDb(base) as redis_db:
        result = run(args, redis_db.url)
    print("load average:", os.getloadavg(), flush=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
