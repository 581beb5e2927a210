"""Routing benchmark (not a test): ``python -m bench.routing [--quick]``.

1. Pure pipeline: decisions per second and p50/p99 latency of `prefilter` + `route` for 8, 64
   and 256 candidates (compile verdicts precomputed, as if the adapter answered instantly).
2. End to end on PostgreSQL + Redis: tasks routed, leased (RedisLeaseStore) and committed
   (Attempt + RouteDecision + outbox) per second by one dispatcher, with an in-process adapter
   whose Compile returns a fixed plan. Needs ``VIDROUTE_BENCH_POSTGRES_URL`` (default
   ``postgresql+asyncpg://postgres@127.0.0.1:5432/test``, used as maintenance database) and
   ``VIDROUTE_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import secrets
import statistics
import time
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
)
from controlplane.domain.routing.filters import prefilter
from controlplane.domain.routing.selection import RouterConfig, route
from controlplane.domain.scoring import example_policy
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import upgrade
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LocalLock
from vidroute_core.adapter import CompiledPlan, Transformation, TransformationKind
from vidroute_core.capabilities.loader import expand_for_accounts, load_file
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


def pure(n: int, iterations: int) -> dict[str, float]:
    cands = candidates(n)
    cfg = RouterConfig(policy=example_policy("bench"), shadow_policy=example_policy("s"))
    ctx = RoutingContext(
        now=NOW,
        capacity={c.id: CapacityView(3, 4) for c in cands},
        health={c.id: HealthView(0.9, 100.0, 120.0) for c in cands},
    )
    compiled = {
        c.id: CompileResult(
            True,
            (("prompt", TransformKind.EXACT, "p"),),
            c.price.estimate(SPEC),
            "USD",
            "sha256:x",
        )
        for c in prefilter(SPEC, cands, ctx)
    }
    samples = []
    for i in range(iterations):
        start = time.perf_counter()
        prefilter(SPEC, cands, ctx)
        route(str(i), SPEC, cands, compiled, cfg=cfg, ctx=ctx)
        samples.append(time.perf_counter() - start)
    samples.sort()
    return {
        "candidates": n,
        "decisions_per_s": iterations / sum(samples),
        "p50_ms": statistics.median(samples) * 1000,
        "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1000,
    }


class FixedPlanAdapter:
    """Compile answers a submittable plan at the catalog price at once."""

    async def compile(
        self, spec: GenerationSpec, *, account: str, model: str, model_version: str = ""
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
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    iterations = {8: 300, 64: 100, 256: 30} if args.quick else {8: 3000, 64: 1000, 256: 300}
    for n, its in iterations.items():
        r = pure(n, its)
        print(
            f"pure   n={n:<4} {r['decisions_per_s']:8.1f} decisions/s  "
            f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms"
        )
    e2e = asyncio.run(end_to_end(100 if args.quick else 500))
    print(
        f"e2e    {e2e['tasks']:.0f} tasks in {e2e['seconds']:.2f} s = "
        f"{e2e['tasks_per_s']:.1f} tasks/s (routed + leased + committed, PostgreSQL + Redis)"
    )


if __name__ == "__main__":
    main()
