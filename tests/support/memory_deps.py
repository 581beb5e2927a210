"""The execution engine's collaborators over the in-memory fake, for tests of its steps without
a database or a provider."""

from __future__ import annotations

import random
from datetime import datetime

from controlplane.execution.config import ExecutionConfig
from controlplane.execution.leasing import LeaseKeeper
from controlplane.execution.outcomes import ExecutionDeps
from controlplane.persistence.memory import MemoryDatabase
from controlplane.persistence.ports import ExecutionReads, TaskReads, UnitSource

__all__ = ["memory_deps"]


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
