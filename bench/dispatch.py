"""Batched dispatch benchmark (not a test): ``python -m bench.dispatch [--quick] [--batch N]``.

The dispatcher runs the shipped configuration (`bootstrap.dispatcher_config`: batch size
``VIDROUTE_DISPATCH_BATCH_SIZE``'s default, 256, and the queue-head read that goes with it);
``--batch N`` measures another batch size the same way.

Per size (500 and 50,000 QUEUED tasks; ``--quick``: 500 and 5,000), in one run:

1. *dispatch*: the real `Dispatcher` on PostgreSQL + Redis (a scratch database, the published
   catalog with room for every task, `RedisLeaseStore` in a namespace of its own, the in-process
   `FixedPlanAdapter` answering Compile at once) runs `tick()` until the backlog is dispatched.
   Tasks carry distinct normalized spec hashes, so every task's compile misses the verdict cache
   (as distinct prompts do). Counted: SQL statements and transactions (SQLAlchemy
   ``before_cursor_execute`` / ``commit`` events), PostgreSQL round trips (each statement, each
   BEGIN, COMMIT and ROLLBACK: a lower bound, a prepared statement's first PREPARE aside), Redis
   commands and round trips (a counting connection class: one round trip per packed send),
   dispatcher CPU (process time) and wall. One line per size sums them up per task.
2. *pgbench replay*: the same writes, batched the same way, by pgbench (one client) into a
   fresh scratch database holding the same QUEUED tasks: per transaction of one batch the
   SKIP LOCKED claim, the task UPDATE, the multi-row INSERTs of decisions, attempts, 3 events per
   task and outbox rows, with JSON of the sizes the run stored (a real decision's snapshot). Its
   tasks/s is the ceiling of what PostgreSQL does with these writes on this machine now.

The dispatcher process tunes its collector as `SchedulingRuntime.start` does
(`controlplane.scheduling.heap.tune_gc`: the start-up heap frozen, generation 0 every 10,000
allocations) once its set-up is done; ``--default-gc`` keeps CPython's defaults (the A/B).
The collector's own CPU per task is reported (``gc_ms_per_task``, from ``gc.callbacks``).

Prints the load average before and after, and the ratio dispatch / replay per size.
Needs ``VIDROUTE_BENCH_POSTGRES_URL`` (maintenance database, default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``), ``VIDROUTE_BENCH_REDIS_URL`` and
``pgbench`` (found in /usr/lib/postgresql/*/bin or on PATH).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import gc
import glob
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import make_url

from bench.queue import _publish, make_dispatcher, scratch_database
from bench.routing import SPEC
from controlplane.bootstrap import Settings, dispatcher_config
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from controlplane.persistence.models import generation_tasks, route_decisions, task_attempts
from controlplane.scheduling.dispatcher import DispatcherConfig
from controlplane.scheduling.heap import tune_gc
from vidroute_core.codec import spec_to_dict

REDIS_URL = os.environ.get("VIDROUTE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
COUNTED = ("statements", "transactions", "pg_round_trips", "redis_commands", "redis_round_trips")

# 90% one tenant with 4 users, 10% over 50 tenants x 4 users; every task its own spec hash.
_LOAD = """
INSERT INTO generation_tasks (tenant_id, user_id, project_id, idempotency_key, spec,
  normalized_spec_hash, service_class, priority, status, status_version, last_event_seq,
  created_at, updated_at)
SELECT tn, us, 'p1', 'bulk-' || CAST(i AS text),
  jsonb_set(jsonb_set(CAST(:spec AS jsonb), '{tenant_id}', to_jsonb(tn)), '{user_id}',
            to_jsonb(us)),
  'sha256:' || md5(CAST(i AS text)), 'STANDARD', 0, 'QUEUED', 0, 1, :now, :now
FROM (
  SELECT i,
    CASE WHEN i % 10 = 0 THEN 'tenant-' || CAST((i / 10) % 50 AS text) ELSE 'flood' END AS tn,
    'u' || CAST((i / 7) % 4 AS text) AS us
  FROM generate_series(1, CAST(:n AS bigint)) AS i
) AS s
"""


class Counts:
    statements = 0
    transactions = 0
    pg_round_trips = 0
    redis_commands = 0
    redis_round_trips = 0


class CountingConnection(Connection):
    """A redis-py connection that counts what it sends: commands and round trips."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        Counts.redis_round_trips += 1
        await super().send_packed_command(command, check_health)

    def pack_command(self, *args: Any) -> list[bytes]:
        Counts.redis_commands += 1
        return super().pack_command(*args)

    # (a pipeline's pack_commands packs each command through pack_command: counted there)


class CollectorClock:
    """The garbage collector's CPU while installed (``gc.callbacks``), in seconds."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._start = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.seconds += time.process_time() - self._start
            self.collections += 1

    def __enter__(self) -> CollectorClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)


def _count_sql(engine: Any) -> None:
    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _statement(*_: Any) -> None:
        Counts.statements += 1
        Counts.pg_round_trips += 1

    @event.listens_for(engine.sync_engine, "begin")
    def _begin(*_: Any) -> None:
        Counts.pg_round_trips += 1

    @event.listens_for(engine.sync_engine, "commit")
    def _commit(*_: Any) -> None:
        Counts.transactions += 1
        Counts.pg_round_trips += 1

    @event.listens_for(engine.sync_engine, "rollback")
    def _rollback(*_: Any) -> None:
        Counts.pg_round_trips += 1


async def load(db: Database, n: int) -> None:
    async with db.unit(datetime.now(UTC)) as u:
        await u.conn.execute(
            text(_LOAD), {"spec": json.dumps(spec_to_dict(SPEC)), "now": datetime.now(UTC), "n": n}
        )
    async with db.engine.connect() as raw:
        conn = await raw.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM (ANALYZE) generation_tasks"))


async def dispatch_run(
    n: int, batch: int, profile: str | None = None, default_gc: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The real dispatcher over `n` queued tasks; its figures and samples for the replay."""
    pool = aioredis.ConnectionPool.from_url(REDIS_URL, connection_class=CountingConnection)
    client = aioredis.Redis(connection_pool=pool)
    namespace = f"benchd{secrets.token_hex(3)}:"
    async with scratch_database() as url:
        engine = create_engine(url, pool_size=4)
        db = Database(engine)
        try:
            await _publish(db)
            await load(db, n)
            # The shipped configuration at `batch`; room in every account for the whole backlog.
            config = dataclasses.replace(
                dispatcher_config(Settings(dispatch_batch_size=batch)),
                default_concurrency=1_000_000,
            )
            store = RedisLeaseStore(client, namespace=namespace)
            dispatcher = make_dispatcher(db, store, config)
            await dispatcher.catalog()
            if not default_gc:
                tune_gc()  # as SchedulingRuntime.start, once the process is set up
            _count_sql(engine)
            for name in COUNTED:
                setattr(Counts, name, 0)
            rounds, done = 0, 0
            profiler = cProfile.Profile() if profile else None
            wall0, cpu0 = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            with CollectorClock() as collector:
                while done < n:
                    took = await dispatcher.tick()
                    rounds += 1
                    if took == 0:
                        break
                    done += took
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            if profiler is not None and profile:
                profiler.disable()
                profiler.dump_stats(f"{profile}.{n}")
            counted = {k: getattr(Counts, k) for k in COUNTED}
            async with db.reading() as conn:
                counted_rows = await conn.scalar(select(func.count()).select_from(task_attempts))
                attempts = int(counted_rows or 0)
                doubled = await conn.scalar(
                    text(
                        "SELECT count(*) FROM (SELECT task_id FROM task_attempts GROUP BY "
                        "task_id HAVING count(*) > 1) AS d"
                    )
                )
                sample = (
                    (
                        await conn.execute(
                            select(
                                route_decisions.c.candidate_snapshot,
                                task_attempts.c.compile_plan,
                                task_attempts.c.provider_account_id,
                            )
                            .join(
                                task_attempts,
                                task_attempts.c.route_decision_id == route_decisions.c.id,
                            )
                            .limit(1)
                        )
                    )
                    .mappings()
                    .one()
                )
                queued = await conn.scalar(
                    select(func.count())
                    .select_from(generation_tasks)
                    .where(generation_tasks.c.status == "QUEUED")
                )
        finally:
            await engine.dispose()
            keys = [k async for k in client.scan_iter(f"{namespace}*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()
    figures = {
        "tasks": n,
        "batch": batch,
        "rounds": rounds,
        "dispatched": attempts,
        "left_queued": queued,
        "tasks_with_two_attempts": doubled,
        "wall_s": round(wall, 2),
        "tasks_per_s": round(attempts / wall, 1),
        "cpu_ms_per_task": round(cpu * 1000 / max(attempts, 1), 3),
        "cpu_share_of_wall": round(cpu / wall, 2),
        "gc_ms_per_task": round(collector.seconds * 1000 / max(attempts, 1), 3),
        "gc_collections": collector.collections,
        "gc": "default" if default_gc else "tuned",
        **{f"{k}_per_task": round(v / max(attempts, 1), 3) for k, v in counted.items()},
        **{f"{k}_per_round": round(v / max(rounds, 1), 1) for k, v in counted.items()},
    }
    return figures, dict(sample)


def summary(figures: dict[str, Any]) -> str:
    """The stage's figures per task on one line, with the load average now (`make bench`)."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"== dispatch at batch {figures['batch']}, {figures['tasks']} queued: per task "
        f"{figures['statements_per_task']} statements, {figures['transactions_per_task']} "
        f"transactions, {figures['pg_round_trips_per_task']} PostgreSQL round trips, "
        f"{figures['redis_round_trips_per_task']} Redis round trips "
        f"({figures['redis_commands_per_task']} commands), {figures['cpu_ms_per_task']} ms CPU; "
        f"{figures['tasks_per_s']} tasks/s; load average {load}"
    )


def pgbench_binary() -> str:
    found = shutil.which("pgbench") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)), None
    )
    if found is None:
        raise SystemExit("pgbench not found (PostgreSQL client tools)")
    return found


# One transaction = one batch, the writes of `persistence.batch` in the same shape.
_SCRIPT = """
SELECT nextval('bench_batch') - 1 AS b \\gset
\\set lo :b * :batch + 1
\\set hi :lo + :batch - 1
BEGIN;
SELECT id, status_version FROM generation_tasks
 WHERE id BETWEEN CAST(:lo AS bigint) AND CAST(:hi AS bigint) AND status = 'QUEUED'
 FOR UPDATE SKIP LOCKED;
UPDATE generation_tasks SET status = 'SUBMITTING', status_version = status_version + 2,
  last_event_seq = last_event_seq + 3, updated_at = now()
 WHERE id BETWEEN CAST(:lo AS bigint) AND CAST(:hi AS bigint) AND status = 'QUEUED'
 RETURNING id, status_version, last_event_seq;
INSERT INTO route_decisions (task_id, decision_no, policy_version, selected_candidate,
  candidate_snapshot, reason_code, created_at)
SELECT g, 1, 'bench', 'runway/gen4.5/prod-us', CAST({snap} AS jsonb), 'SELECTED', now()
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS g RETURNING id, task_id;
INSERT INTO task_attempts (task_id, attempt_no, provider_account_id, provider_model,
  provider_model_version, capability_version, price_version, routing_policy_version,
  client_request_key, normalized_spec_hash, request_hash, compile_plan, route_decision_id,
  status, status_version, estimated_cost_micros, currency, lease_token, fencing_token,
  created_at, updated_at)
SELECT d.task_id, 1, CAST(:account AS bigint), 'gen4.5', 'v1', 'cap-1', 'price-1', 'bench',
  CAST(d.task_id AS text) || '-1-' || md5(CAST(d.id AS text)), 'sha256-x', 'sha256-y',
  CAST({plan} AS jsonb), d.id, 'READY_TO_SUBMIT', 0, 1000, 'USD', md5(CAST(d.task_id AS text)),
  d.task_id, now(), now()
  FROM route_decisions AS d
 WHERE d.task_id BETWEEN CAST(:lo AS bigint) AND CAST(:hi AS bigint) RETURNING id, task_id;
INSERT INTO task_events (task_id, seq, kind, payload, created_at)
SELECT g, 1 + k, CASE WHEN k = 2 THEN 'attempt.created' ELSE 'task.state_changed' END,
  CAST('{"state": "SUBMITTING", "status_version": 2, "attempt_id": 1}' AS jsonb), now()
  FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS g,
       generate_series(0, 2) AS k;
INSERT INTO outbox (topic, aggregate_id, payload, created_at, available_at, attempts)
SELECT 'attempt.submit', CAST(a.id AS text), CAST({body} AS jsonb), now(), now(), 0
  FROM task_attempts AS a WHERE a.task_id BETWEEN CAST(:lo AS bigint) AND CAST(:hi AS bigint);
COMMIT;
"""


def _literal(value: Any) -> str:
    """A JSON document as an SQL string literal (pgbench substitutes only known :names)."""
    # pgbench reads every ':name' as a parameter, inside literals too: a colon before a name
    # character (only ever inside a JSON string here) is written as its JSON escape.
    text_ = re.sub(r":(?=[A-Za-z0-9_])", r"\\u003a", json.dumps(value))
    return "'" + text_.replace("'", "''") + "'"


async def replay(n: int, batch: int, sample: dict[str, Any]) -> dict[str, Any]:
    """pgbench writing the same rows in the same batches into a fresh database of `n` tasks."""
    async with scratch_database() as url:
        engine = create_engine(url, pool_size=1)
        db = Database(engine)
        try:
            await _publish(db)
            await load(db, n)
            async with db.unit(datetime.now(UTC)) as u:
                await u.conn.execute(text("CREATE SEQUENCE bench_batch"))
                account = await u.conn.scalar(text("SELECT min(id) FROM provider_accounts"))
        finally:
            await engine.dispose()
        parsed = make_url(url)
        body = {"lease_account": "runway:prod-us", "supports_idempotency_key": True}
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "dispatch.sql"
            script.write_text(
                _SCRIPT.replace("{snap}", _literal(sample["candidate_snapshot"]))
                .replace("{plan}", _literal(sample["compile_plan"]))
                .replace("{body}", _literal(body))
            )
            transactions = n // batch
            cmd = [
                pgbench_binary(),
                "-n",
                "-M",
                "extended",
                "-c",
                "1",
                "-t",
                str(transactions),
                "-f",
                str(script),
                "-D",
                f"batch={batch}",
                "-D",
                f"account={account}",
                "-h",
                parsed.host or "127.0.0.1",
                "-p",
                str(parsed.port or 5432),
                "-U",
                parsed.username or "postgres",
                parsed.database or "",
            ]
            env = {**os.environ, "PGPASSWORD": parsed.password or ""}
            start = time.perf_counter()
            out = await asyncio.to_thread(
                subprocess.run, cmd, capture_output=True, text=True, env=env, check=False
            )
            wall = time.perf_counter() - start
        if out.returncode != 0:
            raise SystemExit(f"pgbench failed: {out.stderr[-2000:]}")
        tps = re.search(r"tps = ([0-9.]+)", out.stdout)
        rate = float(tps.group(1)) * batch if tps else transactions * batch / wall
        return {
            "tasks": transactions * batch,
            "transactions": transactions,
            "tasks_per_s": round(rate, 1),
            "wall_s": round(wall, 2),
        }


async def run(
    sizes: list[int],
    batch: int,
    profile: str | None = None,
    default_gc: bool = False,
    no_replay: bool = False,
) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        figures, sample = await dispatch_run(n, batch, profile, default_gc)
        print("dispatch", json.dumps(figures), flush=True)
        print(summary(figures), flush=True)
        row: dict[str, Any] = {
            "dispatch": figures,
            "ratio_to_goal_2000": round(figures["tasks_per_s"] / 2000, 2),
        }
        if not no_replay:
            ceiling = await replay(n, batch, sample)
            print("pgbench ", json.dumps(ceiling), flush=True)
            row["pgbench_replay"] = ceiling
            row["ratio_to_replay"] = round(figures["tasks_per_s"] / ceiling["tasks_per_s"], 2)
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="vidroute batched dispatch benchmark")
    parser.add_argument("--quick", action="store_true", help="500 and 5,000 tasks")
    parser.add_argument(
        "--batch",
        type=int,
        default=DispatcherConfig().batch_size,
        help="tasks per round (default: the shipped batch size)",
    )
    parser.add_argument("--sizes", help="comma-separated backlog sizes (default 500,50000)")
    parser.add_argument(
        "--profile", metavar="PATH", help="cProfile each dispatch run into PATH.<size>"
    )
    parser.add_argument(
        "--default-gc", action="store_true", help="keep CPython's collector settings (A/B)"
    )
    parser.add_argument("--no-replay", action="store_true", help="skip the pgbench replay")
    args = parser.parse_args()
    sizes = [500, 5_000] if args.quick else [500, 50_000]
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",")]
    print("load average:", os.getloadavg(), flush=True)
    results = asyncio.run(run(sizes, args.batch, args.profile, args.default_gc, args.no_replay))
    print("load average:", os.getloadavg(), flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
