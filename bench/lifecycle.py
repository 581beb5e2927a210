"""Full lifecycle benchmark (not a test): ``python -m bench.lifecycle [--tasks N] [--scale F]
[--providers self_hosted,runway,google]``.

One command, one run: a real control plane process (`vidroute serve`, its shipped defaults and,
unless ``--scale`` says otherwise, the shipped time factor 1.0, on PostgreSQL + Redis), the
sidecar processes of the chosen providers (default: self-hosted alone) and their emulators
configured to finish jobs at once (self-hosted: 64 GPU workers at a tiny time factor; Runway and
Veo: no queue, a few milliseconds of generation), every capability's ``max_concurrency`` raised
to 1,000 in a copied capabilities directory the sidecars are pointed at. N tasks (default 500)
are created over gRPC (16 client threads), pinned to the providers in turn, then the bench
waits until every one is terminal.

Figures also say whether each task got through on one attempt: ``attempts_per_task`` (attempts
over tasks, 1.0 when nothing was re-dispatched) and ``lease_warnings``, the control plane's
"lease not held under fence" lines (an attempt whose lease was gone when its submit was due).

Figures: end-to-end tasks/s (first CreateTask to last terminal), tasks SUCCEEDED, the control
plane's CPU seconds per task (``/proc/<pid>/stat``), and, from ``pg_stat_database`` of the
bench's own database, transactions and rows written per task (``pg_stat_statements`` is not
preloaded on this machine, so statements are approximated by commits + rows). With
``--profile`` the control plane runs under ``py-spy record`` if py-spy is on PATH.

Needs ``VIDROUTE_BENCH_POSTGRES_URL`` (maintenance database, default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``) and ``VIDROUTE_BENCH_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from adapter_sidecars.emulators.runway import RunwayConfig, RunwayEmulator
from adapter_sidecars.emulators.selfhosted import SelfHostedConfig, SelfHostedEmulator
from adapter_sidecars.emulators.veo import VeoConfig, VeoEmulator
from tests.support import stack
from tests.support.stack import CALLBACK_SECRET, ControlPlane, ProviderFarm, RedisDb

ROOT = Path(__file__).resolve().parent.parent
PROVIDER = "self_hosted"
# Wall seconds per simulated GPU second: a 4 s video (~35 GPU s) renders in ~3.5 ms.
EMULATOR_SPEED = 0.0001


def _instant_selfhosted(scale: float, extensions: frozenset[str]) -> SelfHostedEmulator:
    return SelfHostedEmulator(
        SelfHostedConfig(
            advance="time",
            workers=64,
            speed=EMULATOR_SPEED,
            max_queue=100_000,
            url_ttl_s=86400.0,
            callback_secret=CALLBACK_SECRET,
            extensions=extensions,
        )
    )


# Runway and Veo jobs: no provider queue, a few milliseconds of generation.
INSTANT_RUN_S = 0.004


def _instant_runway(scale: float, extensions: frozenset[str]) -> RunwayEmulator:
    return RunwayEmulator(
        RunwayConfig(
            advance="time",
            queue_s=0.0,
            run_s=INSTANT_RUN_S,
            url_ttl_s=86400.0,
            credit_balance=10_000_000_000,
            callback_secret=CALLBACK_SECRET,
            extensions=extensions,
        )
    )


def _instant_veo(scale: float, extensions: frozenset[str]) -> VeoEmulator:
    return VeoEmulator(
        VeoConfig(
            advance="time",
            queue_s=0.0,
            run_s=INSTANT_RUN_S,
            url_ttl_s=86400.0,
            retention_s=2 * 86400.0,
            callback_secret=CALLBACK_SECRET,
            extensions=extensions,
        )
    )


_INSTANT = {
    "self_hosted": ("selfhosted", _instant_selfhosted),
    "runway": ("runway", _instant_runway),
    "google": ("veo", _instant_veo),
}


def _raised_capabilities(into: Path, limit: int, providers: list[str]) -> Path:
    """Every chosen provider's shipped capabilities in one directory (a sidecar keeps only its
    own provider's entries), ``max_concurrency`` raised to `limit`."""
    into.mkdir(parents=True, exist_ok=True)
    paths = [
        path
        for provider in providers
        for path in (ROOT / "adapter_sidecars" / _INSTANT[provider][0] / "capabilities").glob(
            "*.yaml"
        )
    ]
    for path in paths:
        raised = re.sub(
            r"^max_concurrency: \d+$",
            f"max_concurrency: {limit}",
            path.read_text(encoding="utf-8"),
            flags=re.MULTILINE,
        )
        (into / path.name).write_text(raised, encoding="utf-8")
    return into


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found


def _maintenance() -> Any:
    return make_url(
        os.environ.get(
            "VIDROUTE_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
        )
    )


async def _create_db(name: str) -> None:
    admin = create_async_engine(_maintenance(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    await admin.dispose()


async def _drop_db(name: str) -> None:
    admin = create_async_engine(_maintenance(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    async with admin.connect() as conn:
        await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    await admin.dispose()


async def _db_stats(name: str) -> dict[str, int]:
    admin = create_async_engine(_maintenance(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    async with admin.connect() as conn:
        await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        row = (
            await conn.execute(
                text(
                    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted,"
                    " tup_returned, tup_fetched FROM pg_stat_database WHERE datname = :n"
                ),
                {"n": name},
            )
        ).one()
    await admin.dispose()
    keys = ("commits", "rollbacks", "inserted", "updated", "deleted", "returned", "fetched")
    return dict(zip(keys, (int(v) for v in row), strict=True))


async def _seq_scans(url: str) -> dict[str, tuple[int, int]]:
    engine = create_async_engine(url, poolclass=NullPool)
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT relname, seq_scan, seq_tup_read FROM pg_stat_user_tables")
            )
        ).all()
    await engine.dispose()
    return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}


_SKIP = ("engine", "batching", "bootstrap", "server", "cli")
_FRAME = re.compile(r"controlplane/((?:\w+/)*)(\w+)\.py")


def _stage_of(stack_line: str) -> str:
    """The outermost control-plane frame of a collapsed py-spy stack that names a stage."""
    for frame in stack_line.split(";"):
        found = _FRAME.search(frame)
        if found is None or found.group(2) in _SKIP:
            continue
        return f"{found.group(1)}{found.group(2)}"
    return "(not control plane: event loop, grpc, idle)"


def _profile_summary(raw: Path) -> dict[str, float]:
    totals: dict[str, int] = {}
    if not raw.exists():
        return {}
    for line in raw.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        stage = _stage_of(frames)
        totals[stage] = totals.get(stage, 0) + int(count)
    whole = sum(totals.values()) or 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:12]
    return {k: round(100 * v / whole, 1) for k, v in ranked}


_TERMINAL_SQL = (
    "SELECT status, failure_code, count(*) FROM generation_tasks"
    " WHERE status IN ('SUCCEEDED', 'FAILED', 'CANCELLED') GROUP BY status, failure_code"
)


async def _wait_terminal(url: str, count: int, deadline: float) -> dict[str, int]:
    """Wait (reading PostgreSQL, not the API) until `count` tasks are terminal or the deadline."""
    engine = create_async_engine(url, poolclass=NullPool)
    states: dict[str, int] = {}
    try:
        while True:
            async with engine.connect() as conn:
                rows = (await conn.execute(text(_TERMINAL_SQL))).all()
            states = {}
            for status, code, n in rows:
                label = str(status) if code is None else f"{status}:{code}"
                states[label] = states.get(label, 0) + int(n)
            if sum(states.values()) >= count or time.monotonic() >= deadline:
                return states
            await asyncio.sleep(0.05)
    finally:
        await engine.dispose()


_STAGES_SQL = """
SELECT
       percentile_cont(0.5)
         WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM a.created_at - t.created_at)),
       percentile_cont(0.5)
         WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM a.request_started_at - a.created_at)),
       percentile_cont(0.5)
         WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM r.accepted_at - a.request_started_at)),
       percentile_cont(0.5)
         WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM t.updated_at - r.accepted_at)),
       EXTRACT(EPOCH FROM max(a.created_at) - min(t.created_at)),
       EXTRACT(EPOCH FROM max(r.accepted_at) - min(t.created_at)),
       EXTRACT(EPOCH FROM max(t.updated_at) - min(t.created_at)),
       percentile_cont(0.5)
         WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM j.completed_at - r.accepted_at))
FROM generation_tasks t
JOIN task_attempts a ON a.task_id = t.id AND a.attempt_no = 1
LEFT JOIN attempt_runtime r ON r.attempt_id = a.id
LEFT JOIN provider_jobs j ON j.attempt_id = a.id
"""


async def _stage_times(url: str) -> dict[str, float]:
    """Medians per stage and when the last task reached each (seconds from the first create)."""
    engine = create_async_engine(url, poolclass=NullPool)
    async with engine.connect() as conn:
        row = (await conn.execute(text(_STAGES_SQL))).one()
    await engine.dispose()
    keys = (
        "p50_create_to_dispatch_s",
        "p50_dispatch_to_submit_start_s",
        "p50_submit_start_to_accept_s",
        "p50_accept_to_terminal_s",
        "last_dispatch_at_s",
        "last_accept_at_s",
        "last_terminal_at_s",
        # Accept to the observation that ended the job (polls and callbacks; the rest of
        # accept-to-terminal is the output step).
        "p50_accept_to_job_end_s",
    )
    return {k: round(float(v or 0.0), 3) for k, v in zip(keys, row, strict=True)}


_ATTEMPTS_SQL = (
    "SELECT (SELECT count(*) FROM task_attempts), (SELECT count(*) FROM generation_tasks)"
)


async def _attempts_per_task(url: str) -> float:
    engine = create_async_engine(url, poolclass=NullPool)
    async with engine.connect() as conn:
        attempts, tasks = (await conn.execute(text(_ATTEMPTS_SQL))).one()
    await engine.dispose()
    return round(int(attempts) / max(int(tasks), 1), 3)


LEASE_WARNING = "lease not held under fence"


def _lease_warnings(cp_dir: Path) -> int:
    """The control plane's log lines saying an attempt's lease was gone when its submit was due."""
    return sum(
        path.read_text(errors="replace").count(LEASE_WARNING)
        for path in cp_dir.glob("controlplane-*.log")
    )


def _create(cp: ControlPlane, provider: str, key: str, tries: int = 10) -> str:
    """CreateTask under `key`, sent again (the same key: a replay, never a second task) when a
    loaded machine lets the call's 10 s deadline pass."""
    for attempt in range(1, tries + 1):
        try:
            return cp.create_task(provider, idempotency_key=key)
        except grpc.RpcError as exc:
            retryable = exc.code() in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.UNAVAILABLE,
            )
            if not retryable or attempt == tries:
                raise
    raise AssertionError("unreachable")


def failures_of(states: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in states.items() if k != "SUCCEEDED"}


_DB_LINE = re.compile(r"^controlplane_db_total\{([^}]*)\} ([0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _db_work(port: int) -> dict[tuple[str, str], float]:
    """The control plane's ``controlplane_db_total`` counters: (stage, kind) -> count."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        body = resp.read().decode()
    found: dict[tuple[str, str], float] = {}
    for line in body.splitlines():
        match = _DB_LINE.match(line)
        if match is not None:
            labels = dict(_LABEL.findall(match.group(1)))
            found[(labels["stage"], labels["kind"])] = float(match.group(2))
    return found


def per_stage(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], done: int
) -> dict[str, dict[str, float]]:
    """Per stage per task: statements, transactions and round trips, plus their total."""
    table: dict[str, dict[str, float]] = {}
    for (stage, kind), value in after.items():
        delta = (value - before.get((stage, kind), 0.0)) / max(done, 1)
        table.setdefault(stage, {})[kind] = round(delta, 2)
    total: dict[str, float] = {}
    for row in table.values():
        for kind, value in row.items():
            total[kind] = round(total.get(kind, 0.0) + value, 2)
    table["TOTAL"] = total
    return table


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def run(  # noqa: PLR0915 - one linear script of a run
    tasks: int,
    scale: float,
    redis_url: str,
    profile: bool,
    tuning: str = "",
    *,
    providers: list[str] | None = None,
) -> dict[str, Any]:
    providers = providers or [PROVIDER]
    for name in providers:
        shipped = stack.PROVIDERS[name]
        stack.PROVIDERS[name] = stack.Provider(
            name, shipped.package, shipped.model, _INSTANT[name][1], callbacks=shipped.callbacks
        )
    work = Path(tempfile.mkdtemp(prefix="vidroute-bench-life-"))
    name = f"vidroute_bench_l_{secrets.token_hex(4)}"
    asyncio.run(_create_db(name))
    url = _maintenance().set(database=name).render_as_string(hide_password=False)
    caps = _raised_capabilities(work / "caps", 1000, providers)
    lease_warnings = 0
    try:
        with ProviderFarm(
            work / "farm",
            time_scale=scale,
            providers=providers,
            sidecar_env={"VIDROUTE_ADAPTER_CAPABILITIES_DIR": str(caps)},
        ) as farm:
            (work / "cp").mkdir()
            env = {"VIDROUTE_METRICS_LISTEN": "127.0.0.1:0"}
            if tuning:
                env["VIDROUTE_EXECUTION_TUNING"] = tuning
            cp = ControlPlane(work / "cp", farm, database_url=url, redis_url=redis_url, env=env)
            cp.start()
            try:
                assert cp.proc is not None
                pid = cp.proc.popen.pid
                metrics_port = stack.logged_metrics_port(cp.proc)
                before_db = asyncio.run(_db_stats(name))
                scans0 = asyncio.run(_seq_scans(url))
                spy = None
                raw = work / "profile.txt"
                if profile:
                    spy = subprocess.Popen(
                        [
                            _py_spy(),
                            "record",
                            "--pid",
                            str(pid),
                            "--format",
                            "raw",
                            "--rate",
                            "50",
                            "--nonblocking",
                            "--output",
                            str(raw),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                db_work0 = _db_work(metrics_port)
                cpu0 = _cpu_s(pid)
                sidecar_pids = [farm.sidecars[p].popen.pid for p in providers]
                side0, bench0 = sum(map(_cpu_s, sidecar_pids)), _cpu_s(os.getpid())
                t0 = time.monotonic()
                run_key = secrets.token_hex(4)

                def create(i: int) -> str:
                    return _create(cp, providers[i % len(providers)], f"{run_key}-{i}")

                with ThreadPoolExecutor(16) as pool:
                    ids = list(pool.map(create, range(tasks)))
                created_s = time.monotonic() - t0
                deadline = time.monotonic() + max(120.0, tasks * 2.0)
                states = asyncio.run(_wait_terminal(url, len(ids), deadline))
                wall = time.monotonic() - t0
                cpu = _cpu_s(pid) - cpu0
                db_work1 = _db_work(metrics_port)
                side_cpu = sum(map(_cpu_s, sidecar_pids)) - side0
                bench_cpu = _cpu_s(os.getpid()) - bench0
                after_db = asyncio.run(_db_stats(name))
                scans1 = asyncio.run(_seq_scans(url))
                stage_times = asyncio.run(_stage_times(url))
                attempts_per_task = asyncio.run(_attempts_per_task(url))
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=60)
                stages = _profile_summary(raw)
            finally:
                cp.stop()
                lease_warnings = _lease_warnings(work / "cp")
    finally:
        if not os.environ.get("VIDROUTE_BENCH_KEEP"):
            asyncio.run(_drop_db(name))
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work} and database {name}")
    delta = {k: after_db[k] - before_db[k] for k in after_db}
    done = sum(states.values())
    return {
        "tasks": tasks,
        "providers": ",".join(providers),
        "terminal": done,
        "succeeded": states.get("SUCCEEDED", 0),
        "create_s": round(created_s, 2),
        "wall_s": round(wall, 2),
        "tasks_per_s": round(done / wall, 2),
        "cp_cpu_s": round(cpu, 2),
        "cp_cpu_ms_per_task": round(1000 * cpu / max(done, 1), 1),
        "sidecar_cpu_s": round(side_cpu, 2),
        "bench_and_emulator_cpu_s": round(bench_cpu, 2),
        "commits_per_task": round(delta["commits"] / max(done, 1), 1),
        # Read-only connections end in ROLLBACK (SQLAlchemy's reset on return): each one is a
        # BEGIN and a ROLLBACK around its reads, so they count like transactions.
        "rollbacks_per_task": round(delta["rollbacks"] / max(done, 1), 1),
        "rows_written_per_task": round(
            (delta["inserted"] + delta["updated"] + delta["deleted"]) / max(done, 1), 1
        ),
        "rows_read_per_task": round((delta["returned"] + delta["fetched"]) / max(done, 1), 1),
        # From the control plane's own engine events (`persistence.statement_tally`): per
        # stage (the execution loop, "dispatch", "api"; "other" is unlabelled) per task.
        "db_per_task_by_stage": per_stage(db_work0, db_work1, done),
        "failures": failures_of(states),
        "attempts_per_task": attempts_per_task,
        "lease_warnings": lease_warnings,
        "seq_tup_read_per_task": {
            t: round((scans1[t][1] - scans0.get(t, (0, 0))[1]) / max(done, 1))
            for t in sorted(scans1, key=lambda t: scans0.get(t, (0, 0))[1] - scans1[t][1])[:6]
        },
        "stage_times": stage_times,
        "cpu_share_by_stage_pct": stages,
        "load_avg": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="the time factor of every process (default 1.0, the shipped one: every loop's"
        " period as deployed; a smaller factor makes the idle loops claim more often per task)",
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the control plane")
    parser.add_argument("--tuning", default="", help="VIDROUTE_EXECUTION_TUNING JSON, if any")
    parser.add_argument(
        "--providers",
        default=PROVIDER,
        help="comma-separated providers the tasks are pinned to in turn"
        f" (of {', '.join(_INSTANT)}; default {PROVIDER})",
    )
    args = parser.parse_args()
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = sorted(set(providers) - set(_INSTANT))
    if unknown:
        parser.error(f"unknown providers {unknown}; known: {sorted(_INSTANT)}")
    base = os.environ.get("VIDROUTE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    # A logical database claimed like the e2e tests claim theirs, so no one flushes it meanwhile.
    with RedisDb(base) as redis_db:
        figures = run(
            args.tasks, args.scale, redis_db.url, args.profile, args.tuning, providers=providers
        )
    for key, value in figures.items():
        if key == "db_per_task_by_stage":
            print(f"{key}: (statements / transactions / round trips per task)")
            for stage, row in sorted(value.items(), key=lambda kv: -kv[1].get("statement", 0)):
                print(
                    f"  {stage:>10}: {row.get('statement', 0):7.2f} / "
                    f"{row.get('transaction', 0):6.2f} / {row.get('round_trip', 0):7.2f}"
                )
            continue
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
