"""CreateTask benchmark (not a test): ``python -m bench.create_task [--seconds S] [--backends]``.

A real control plane process (``vidroute serve``: API only, authentication on, the shipped
safety policy and billing default) on a fresh database per backend, driven over gRPC by a load
generator in this process at fixed concurrencies (every request a new idempotency key, one
tenant token). Per backend and concurrency: req/s over `--seconds`, p50/p99 latency, errors,
and the PostgreSQL transactions per call (``pg_stat_database``). Then the store alone, in
process: statements, transactions and pre-pings per CreateTask counted by engine events, and
the replay of an existing key; and 64 concurrent creates in process with group
commit (`persistence.creates`) off and on, interleaved. The machine's load average is printed
with each row: the figures are only as good as the cores were free.

PostgreSQL: ``VIDROUTE_BENCH_POSTGRES_URL`` (maintenance database, default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``). SQLite: a file under a temp folder.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from controlplane.api.auth import hash_token
from controlplane.persistence.creates import CreateBatcher
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.service.tasks import CreateTaskInput, TaskService
from vidroute.scheduler.v1 import scheduler_service_pb2, scheduler_service_pb2_grpc
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

DEFAULT_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
CONCURRENCIES = (1, 8, 32, 128)
TENANT = "bench"
# A path: the control plane runs under cProfile and writes its profile there (``--profile``).
PROFILE = ""
LOOP = "asyncio"
_UVLOOP = (
    "import asyncio, sys, uvloop; from clients.cli import main; "
    "asyncio.set_event_loop_policy(uvloop.EventLoopPolicy()); sys.exit(main(sys.argv[1:]))"
)
_PROFILED = (
    "import cProfile, sys, time; from clients.cli import main; "
    "p = cProfile.Profile(time.process_time); p.enable(); "
    "code = main(sys.argv[1:]); p.disable(); p.dump_stats({out!r}); sys.exit(code)"
)


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


async def _pg_database(maintenance: str) -> str:
    name = f"bench_create_{secrets.token_hex(3)}"
    engine = create_async_engine(maintenance, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    async with engine.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    await engine.dispose()
    return make_url(maintenance).set(database=name).render_as_string(hide_password=False)


async def _pg_drop(maintenance: str, url: str) -> None:
    engine = create_async_engine(maintenance, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    async with engine.connect() as conn:
        await conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    await engine.dispose()


async def _pg_xacts(url: str) -> int:
    engine = create_async_engine(url, poolclass=NullPool)
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        value = await conn.scalar(
            text(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database"
                " WHERE datname = current_database()"
            )
        )
    await engine.dispose()
    return int(value or 0)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _request(key: str) -> scheduler_service_pb2.CreateTaskRequest:
    request = scheduler_service_pb2.CreateTaskRequest(idempotency_key=key)
    spec = request.spec
    spec.tenant_id = TENANT
    spec.prompt = "a red kite over a green hill"
    spec.mode = 1  # MODE_TEXT_TO_VIDEO
    spec.output.width, spec.output.height, spec.output.duration_ms = 1280, 720, 4000
    return request


@dataclass
class Row:
    backend: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    xacts_per_call: float | None
    cpu_ms: float
    load: str

    def line(self) -> str:
        xacts = "-" if self.xacts_per_call is None else f"{self.xacts_per_call:.2f}"
        return (
            f"| {self.backend} | {self.concurrency} | {self.requests / self.seconds:,.0f} | "
            f"{self.p50_ms:.1f} | {self.p99_ms:.1f} | {self.errors} | {xacts} | "
            f"{self.cpu_ms:.2f} | {self.load} |"
        )


async def _drive(address: str, token: str, concurrency: int, seconds: float) -> tuple:
    """`concurrency` callers in a loop for `seconds`; (latencies, errors, elapsed)."""
    metadata = (("authorization", f"Bearer {token}"),)
    latencies: list[float] = []
    errors: list[str] = []
    prefix = secrets.token_hex(4)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
        await stub.CreateTask(_request(f"warm-{prefix}"), metadata=metadata)
        stop_at = time.perf_counter() + seconds

        async def caller(n: int) -> None:
            i = 0
            while time.perf_counter() < stop_at:
                i += 1
                started = time.perf_counter()
                try:
                    await stub.CreateTask(_request(f"{prefix}-{n}-{i}"), metadata=metadata)
                except grpc.aio.AioRpcError as exc:
                    errors.append(exc.code().name)
                    continue
                latencies.append(time.perf_counter() - started)

        began = time.perf_counter()
        await asyncio.gather(*(caller(n) for n in range(concurrency)))
        elapsed = time.perf_counter() - began
    return latencies, errors, elapsed


def _serve(url: str, workdir: Path, token: str, extra_env: dict[str, str]) -> tuple[Any, int]:
    port_file = workdir / "cp.port"
    port_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        "VIDROUTE_DATABASE_URL": url,
        "VIDROUTE_AUTH_TOKENS": f"{hash_token(token)}=tenant:{TENANT}",
        "VIDROUTE_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        **extra_env,
    }
    env.pop("VIDROUTE_ADAPTERS", None)
    env["VIDROUTE_API_ONLY"] = "1"  # CreateTask alone: no scheduling replica
    log = (workdir / "cp.log").open("ab")
    # Profiled by process CPU time, not wall time: what the server spends, not what it waits.
    profile = ["-c", _PROFILED.format(out=PROFILE), "serve"] if PROFILE else []
    if LOOP == "uvloop":  # the same server on uvloop's event loop (A/B against asyncio's)
        profile = ["-c", _UVLOOP, "serve"]
    popen = subprocess.Popen(
        [
            sys.executable,
            *(profile or ("-m", "clients.cli", "serve")),
            *("--listen", "127.0.0.1:0"),
            *("--port-file", str(port_file)),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return popen, int(port_file.read_text())
        if popen.poll() is not None:
            break
        time.sleep(0.05)
    popen.kill()
    raise RuntimeError(f"control plane did not start; log in {workdir / 'cp.log'}")


async def _grpc_rows(
    backend: str, url: str, workdir: Path, seconds: float, concurrencies: Sequence[int]
) -> list[Row]:
    token = secrets.token_urlsafe(16)
    popen, port = _serve(url, workdir, token, {})
    rows = []
    try:
        for concurrency in concurrencies:
            before = await _pg_xacts(url) if backend == "postgresql" else None
            cpu = _cpu_s(popen.pid)
            latencies, errors, elapsed = await _drive(
                f"127.0.0.1:{port}", token, concurrency, seconds
            )
            cpu = _cpu_s(popen.pid) - cpu
            xacts = None
            if before is not None:
                xacts = (await _pg_xacts(url) - before) / max(1, len(latencies) + len(errors))
            latencies.sort()
            q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
            row = Row(
                backend,
                concurrency,
                len(latencies),
                len(errors),
                elapsed,
                q[49] * 1000,
                q[98] * 1000,
                xacts,
                cpu * 1000 / max(1, len(latencies) + len(errors)),
                _load(),
            )
            print(row.line(), flush=True)
            if errors:
                print(f"  errors: {sorted(set(errors))}", flush=True)
            rows.append(row)
    finally:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(20)
        except subprocess.TimeoutExpired:
            popen.kill()
    return rows


def _spec() -> GenerationSpec:
    return GenerationSpec(
        tenant_id=TENANT,
        prompt="a red kite over a green hill",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=4000),
    )


async def _store_counts(backend: str, url: str, calls: int) -> str:
    """Statements, transactions and pre-pings per CreateTask of the store, in process."""
    db = Database.from_url(url)
    counts = {"statements": 0, "begins": 0, "pings": 0}
    sync = db.engine.sync_engine

    @event.listens_for(sync, "before_cursor_execute")
    def _stmt(*_a: Any, **_k: Any) -> None:
        counts["statements"] += 1

    @event.listens_for(sync, "begin")
    def _begin(*_a: Any) -> None:
        counts["begins"] += 1

    @event.listens_for(sync, "engine_connect")
    def _connect(*_a: Any) -> None:
        counts["pings"] += 1 if sync.pool._pre_ping else 0

    from controlplane.bootstrap import Settings

    settings = Settings.from_env({"VIDROUTE_DATABASE_URL": url})
    service = TaskService(db, billing=settings.billing, catalog=None)
    spec = _spec()
    await service.create_task(CreateTaskInput(spec, "warm"))
    for key in counts:
        counts[key] = 0
    cpu = time.process_time()
    began = time.perf_counter()
    for i in range(calls):
        await service.create_task(CreateTaskInput(spec, f"store-{i}"))
    wall = time.perf_counter() - began
    cpu = time.process_time() - cpu
    created = dict(counts)
    for key in counts:
        counts[key] = 0
    for i in range(calls):
        await service.create_task(CreateTaskInput(spec, f"store-{i}"))
    await db.dispose()
    per = {k: v / calls for k, v in created.items()}
    again = {k: v / calls for k, v in counts.items()}
    return (
        f"| {backend} | {calls / wall:,.0f}/s | {cpu / calls * 1000:.2f} ms | "
        f"{per['statements']:.1f} | {per['begins']:.1f} | {per['pings']:.1f} | "
        f"{again['statements']:.1f} / {again['begins']:.1f} | {_load()} |"
    )


async def _store_batching(backend: str, url: str, calls: int, rounds: int = 3) -> list[str]:
    """The store alone under 64 concurrent creates, group commit on (batches up to 64) and off
    (max_batch 1), interleaved `rounds` times: creates/s and process CPU per create."""
    from controlplane.bootstrap import Settings

    db = Database.from_url(url)
    service = TaskService(db, billing=Settings.from_env({"VIDROUTE_DATABASE_URL": url}).billing)
    spec = _spec()
    lines = []
    try:
        for r in range(rounds):
            for max_batch in (1, 64):
                service._creates = CreateBatcher(db, max_batch=max_batch)  # the A/B switch
                keys = iter(range(calls))
                tag = f"batch-{r}-{max_batch}"

                async def worker(tag: str = tag, keys: Any = keys) -> None:
                    for i in keys:
                        await service.create_task(CreateTaskInput(spec, f"{tag}-{i}"))

                cpu, began = time.process_time(), time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(64)))
                wall, cpu = time.perf_counter() - began, time.process_time() - cpu
                lines.append(
                    f"| {backend} | {max_batch} | {r + 1} | {calls / wall:,.0f}/s | "
                    f"{cpu / calls * 1000:.3f} ms | {_load()} |"
                )
                print(lines[-1], flush=True)
    finally:
        await db.dispose()
    return lines


async def _run(args: argparse.Namespace) -> None:
    maintenance = os.environ.get("VIDROUTE_BENCH_POSTGRES_URL", DEFAULT_PG)
    print(f"load average before: {_load()}", flush=True)
    print(
        "| backend | concurrency | req/s | p50 ms | p99 ms | errors | xacts/call | "
        "server CPU ms/call | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    store_lines = []
    with tempfile.TemporaryDirectory(prefix="bench-create-") as tmp:
        workdir = Path(tmp)
        for backend in args.backends:
            if backend == "postgresql":
                url = await _pg_database(maintenance)
            else:
                url = f"sqlite+aiosqlite:///{workdir / 'bench.db'}"
            try:
                await upgrade(url)
                await _grpc_rows(backend, url, workdir, args.seconds, args.concurrency)
                store_lines.append(await _store_counts(backend, url, args.store_calls))
                print("| store, 64 concurrent | max batch | round | rate | CPU/create | load |")
                print("|---|---:|---:|---:|---:|---|")
                await _store_batching(backend, url, args.batch_calls)
            finally:
                if backend == "postgresql":
                    await _pg_drop(maintenance, url)
    print()
    print(
        "| store alone | rate (sequential) | CPU per call | statements | transactions | "
        "pre-pings | replay statements / transactions | load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for line in store_lines:
        print(line)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.create_task")
    parser.add_argument("--seconds", type=float, default=10.0, help="per concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES))
    parser.add_argument(
        "--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"]
    )
    parser.add_argument("--store-calls", type=int, default=300)
    parser.add_argument("--batch-calls", type=int, default=1500, help="per group commit round")
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the server's event loop; uvloop is no project dependency (pip install it to A/B)",
    )
    parser.add_argument("--profile", default="", help="cProfile the control plane into this file")
    args = parser.parse_args(argv)
    global PROFILE, LOOP  # switches read by _serve
    PROFILE, LOOP = args.profile, args.loop
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
