"""The execution engine's collaborators over the in-memory fake, for tests of its steps without
a database or a provider, and the moment and spec those tests build their tasks with."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from controlplane.execution.config import ExecutionConfig
from controlplane.execution.leasing import LeaseKeeper
from controlplane.execution.outcomes import ExecutionDeps
from controlplane.persistence.memory import MemoryDatabase
from controlplane.persistence.ports import ExecutionReads, TaskReads, UnitSource
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

__all__ = ["NOW", "SPEC", "memory_deps"]

NOW = datetime(2026, 6, 24, 10, 0, 0, tzinfo=UTC)
SPEC = GenerationSpec(
    tenant_id="tenant-a",
    prompt="a red fox in snow",
    mode=Mode.TEXT_TO_VIDEO,
    output=OutputSpec(width=1280, height=720, duration_ms=4000),
)


def memory_deps(mem: MemoryDatabase, now: datetime) -> ExecutionDeps:
    """`ExecutionDeps` whose every port is `mem`, no adapters, no lease store, the clock at
    `now` and a seeded random source."""
    db: UnitSource = mem
    reads: ExecutionReads = mem
    tasks: TaskReads = mem
    return ExecutionDeps(
        db=db,
        reads=reads,
        tasks=tasks,
        adapters={},
        leases=LeaseKeeper(None),
        config=ExecutionConfig(),
        clock=lambda: now,
        rng=random.Random(1),
    )
