"""The fair queue under a tenants document (9.12.1): per-class tenant weights, per-class
in-flight caps and project priority inside a tenant."""

from __future__ import annotations

from collections import Counter

import pytest

from controlplane.domain.fairqueue import FairQueue, FairQueueConfig, QueuedTask, ServiceClass
from controlplane.domain.tenants import parse_tenants_document

pytestmark = pytest.mark.timeout(30)

TENANTS = parse_tenants_document(
    """
version: t1
default: {service_classes: {STANDARD: {weight: 1}, BATCH: {weight: 1}}}
tenants:
  A: {service_classes: {STANDARD: {weight: 5}, BATCH: {weight: 1}}}
  B: {service_classes: {STANDARD: {weight: 2}, BATCH: {weight: 1, max_in_flight: 2}}}
  C:
    service_classes: {STANDARD: {weight: 1}}
    projects: {launch: {priority: 3}}
"""
)


def task(
    n: int, tenant: str, cls: ServiceClass = ServiceClass.STANDARD, project: str = "p"
) -> QueuedTask:
    return QueuedTask(f"{tenant}{n}", tenant, "u", project, cls, 0.0, 4.0, float(n))


def test_per_class_weights_give_5_2_1_in_standard_and_equal_in_batch() -> None:
    """STANDARD is served 5:2:1 by the document's weights; BATCH, where A and B weigh the same,
    1:1 (with B's cap lifted by finishing its tasks)."""
    queue = FairQueue(FairQueueConfig(tenants=TENANTS), lambda: 0.0)
    for tenant in "ABC":
        for n in range(400):
            queue.push(task(n, tenant))
    served = Counter(t.tenant_id for t in queue.pop_batch(400))
    assert served == Counter({"A": 250, "B": 100, "C": 50})
    batch = FairQueue(FairQueueConfig(tenants=TENANTS), lambda: 0.0)
    for tenant in "AB":
        for n in range(100):
            batch.push(task(n, tenant, ServiceClass.BATCH))
    taken: Counter[str] = Counter()
    for _ in range(100):
        picked = batch.pop_next()
        assert picked is not None
        taken[picked.tenant_id] += 1
        batch.on_finished(picked)
    assert taken == Counter({"A": 50, "B": 50})


def test_a_class_cap_skips_the_tenant_in_that_class_only() -> None:
    """B at its BATCH max_in_flight of 2 gets no third BATCH task until one finishes, while its
    STANDARD tasks and A's BATCH tasks go on."""
    queue = FairQueue.rebuild(
        FairQueueConfig(tenants=TENANTS),
        lambda: 0.0,
        [task(n, "B", ServiceClass.BATCH) for n in range(5)] + [task(n, "B") for n in range(5, 8)],
        class_in_flight_counts={("B", "BATCH"): 1},
    )
    served = queue.pop_batch(10)
    batch = [t for t in served if t.service_class is ServiceClass.BATCH]
    assert len(batch) == 1
    assert len(served) == 4  # one BATCH, three STANDARD
    assert queue.in_flight("B", ServiceClass.BATCH) == 2
    assert queue.on_finished(batch[0])
    assert queue.pop_next() is not None


def test_project_priority_orders_a_users_groups() -> None:
    """C's task of project launch (priority 3) goes before its older tasks of other projects
    when they head different priority groups; without the document FIFO holds."""
    older = QueuedTask("old", "C", "u", "misc", ServiceClass.STANDARD, 1.0, 4.0, 0.0)
    newer = QueuedTask("new", "C", "u", "launch", ServiceClass.STANDARD, 0.0, 4.0, 1.0)
    with_doc = FairQueue(FairQueueConfig(tenants=TENANTS), lambda: 2.0)
    without = FairQueue(FairQueueConfig(), lambda: 2.0)
    for queue in (with_doc, without):
        queue.push(older)
        queue.push(newer)
    assert [t.task_id for t in with_doc.pop_batch(2)] == ["new", "old"]
    assert [t.task_id for t in without.pop_batch(2)] == ["old", "new"]
