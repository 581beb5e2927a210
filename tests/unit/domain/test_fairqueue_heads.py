"""The fair queue fed with group heads (9.12.4): partial groups, in-flight counts, checkpoints."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest

from controlplane.domain.fairqueue import (
    FairQueue,
    FairQueueConfig,
    GroupKey,
    QueuedTask,
    ServiceClass,
    parse_snapshot,
)


def task(task_id: str, tenant: str, *, user: str = "u", at: float = 0.0) -> QueuedTask:
    return QueuedTask(task_id, tenant, user, "p", ServiceClass.STANDARD, 0.0, 8.0, at)


def _heads() -> list[QueuedTask]:
    return [task(f"a{i}", "A", at=i) for i in range(2)] + [
        task(f"b{i}", "B", at=i) for i in range(5)
    ]


def test_draining_a_partial_group_pauses_the_round() -> None:
    """Once the last loaded head of a group known to hold more is popped, nothing more pops
    until a refill: the queue would otherwise take that group for empty and give its share
    away."""
    partial = [(ServiceClass.STANDARD.value, "A", "u", 0.0)]
    queue = FairQueue.rebuild(FairQueueConfig(), lambda: 0.0, _heads(), partial=partial)
    assert [t.task_id for t in queue.pop_batch(10)] == ["a0", "b0", "a1"]
    assert queue.drained == partial[0]  # A's turn came: its next rows are needed
    assert queue.pop_next() is None
    assert len(queue) == 4
    queue.refill(partial[0], [], partial=False)  # nothing more after all: A leaves
    assert [t.task_id for t in queue.pop_batch(10)] == ["b1", "b2", "b3", "b4"]


def test_without_partial_groups_every_head_pops() -> None:
    """The same heads, all complete groups: the round takes all seven."""
    queue = FairQueue.rebuild(FairQueueConfig(), lambda: 0.0, _heads())
    assert len(queue.pop_batch(10)) == 7
    assert not queue.drained


def test_in_flight_counts_from_the_database_hold_a_tenant_at_its_limit() -> None:
    """A tenant whose counted in-flight tasks reach its limit is skipped; others still go."""
    config = FairQueueConfig(default_max_in_flight=2)
    queue = FairQueue.rebuild(config, lambda: 0.0, _heads(), in_flight_counts={"A": 2, "B": 1})
    assert queue.in_flight("A") == 2
    assert [t.tenant_id for t in queue.pop_batch(10)] == ["B"]
    assert queue.in_flight("B") == 2


def test_a_checkpoint_survives_json_and_bad_ones_are_refused() -> None:
    """A snapshot round-trips through JSON as a valid checkpoint; malformed ones read as None."""
    queue = FairQueue.rebuild(FairQueueConfig(tenant_weights={"A": 3}), lambda: 0.0, _heads())
    queue.pop_batch(3)
    stored = json.loads(json.dumps(queue.snapshot()))
    assert parse_snapshot(stored) == queue.snapshot()
    assert parse_snapshot(None) is None
    assert parse_snapshot({"classes": {}}) is None
    broken = json.loads(json.dumps(queue.snapshot()))
    broken["tenants"]["STANDARD"]["deficits"] = {"A": "lots"}
    assert parse_snapshot(broken) is None


@pytest.mark.parametrize("seed", range(6))
def test_heads_with_refills_pop_exactly_what_the_whole_backlog_would(seed: int) -> None:
    """Loading k rows per group and refilling a drained group with its next k gives the very
    order of a queue holding every row: the durable queue's view loses nothing."""
    rng = random.Random(seed)
    config = FairQueueConfig(tenant_weights={"A": 5, "B": 2, "C": 1})
    backlog = [
        QueuedTask(
            f"{tenant}{i}",
            tenant,
            f"u{rng.randrange(3)}",
            "p",
            rng.choice([ServiceClass.STANDARD, ServiceClass.BATCH]),
            float(rng.randrange(2)),
            rng.choice([4.0, 8.0, 12.0, 27.0]),
            float(i),
        )
        for tenant, n in (("A", 120), ("B", 60), ("C", 40))
        for i in range(n)
    ]
    whole = FairQueue.rebuild(config, lambda: 0.0, backlog)
    expected = [t.task_id for t in whole.pop_batch(len(backlog))]

    k = rng.choice([1, 2, 3])
    rows: dict[GroupKey, list[QueuedTask]] = defaultdict(list)
    for t in sorted(backlog, key=lambda t: t.enqueued_at):
        rows[(t.service_class.value, t.tenant_id, t.user_id, t.priority)].append(t)
    heads = [t for group in rows.values() for t in group[:k]]
    partial = [g for g, ts in rows.items() if len(ts) > k]
    read = {g: min(k, len(ts)) for g, ts in rows.items()}
    queue = FairQueue.rebuild(config, lambda: 0.0, heads, partial=partial)
    got: list[str] = []
    refills = 0
    while len(got) < len(backlog):
        got += [t.task_id for t in queue.pop_batch(len(backlog))]
        if (group := queue.drained) is None:
            break
        more = rows[group][read[group] : read[group] + k]
        read[group] += len(more)
        queue.refill(group, more, partial=len(rows[group]) > read[group])
        refills += 1
    assert got == expected
    assert refills > 0
