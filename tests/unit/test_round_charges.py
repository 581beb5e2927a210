"""A round's fair-queue charges cover only the tasks that went (scheduling.round_charges)."""

from __future__ import annotations

import functools
from collections import Counter

from controlplane.domain import fairqueue as fq
from controlplane.scheduling.round_charges import RoundPops

WEIGHTS = {"light": 1.0, "heavy": 3.0}


def _task(tenant: str, n: int) -> fq.QueuedTask:
    return fq.QueuedTask(
        task_id=f"{tenant}-{n}",
        tenant_id=tenant,
        user_id="u",
        project_id="",
        service_class=fq.ServiceClass.STANDARD,
        priority=0.0,
        cost_units=8.0,
        enqueued_at=float(n),
    )


def _serve(rounds: int, free_per_round: int, *, replay: bool) -> Counter[str]:
    """Rounds as the dispatcher runs them behind a full provider: each pops a batch of 64 in
    fair order, only the first `free_per_round` find a slot, the rest stay queued."""
    config = fq.FairQueueConfig(tenant_weights=WEIGHTS)
    queued = {t: [_task(t, n) for n in range(200)] for t in WEIGHTS}
    snapshot: fq.FairQueueSnapshot | None = None
    went_by_tenant: Counter[str] = Counter()
    for _ in range(rounds):
        items = [t for tasks in queued.values() for t in tasks]
        pops = RoundPops(
            functools.partial(fq.FairQueue.rebuild, config, lambda: 0.0, items, snapshot=snapshot)
        )
        queue = pops.rebuild()
        picked = queue.pop_batch(64)
        went = picked[:free_per_round]
        for task in went:
            queued[task.tenant_id].remove(task)
            went_by_tenant[task.tenant_id] += 1
        if replay:
            queue = pops.charged_for({t.task_id for t in went})
        snapshot = queue.snapshot()
    return went_by_tenant


def test_tasks_left_queued_by_a_round_cost_their_tenant_nothing() -> None:
    """Behind two free slots a round, weights 1:3 give the dispatches 1:3 when only the tasks
    that went are charged; charging every popped task (as before) puts the shares far off
    (here every round opens on the heavy tenant's turn, so it takes every slot)."""
    fair = _serve(40, 2, replay=True)
    assert fair == Counter({"light": 20, "heavy": 60}), fair
    skewed = _serve(40, 2, replay=False)
    assert abs(skewed["light"] - 20) >= 10, skewed


def test_a_round_where_everything_went_keeps_the_popped_state() -> None:
    """When every popped task went, the replay charges the same tasks in the same order."""
    config = fq.FairQueueConfig(tenant_weights=WEIGHTS)
    items = [_task(t, n) for t in WEIGHTS for n in range(10)]
    pops = RoundPops(functools.partial(fq.FairQueue.rebuild, config, lambda: 0.0, items))
    queue = pops.rebuild()
    picked = queue.pop_batch(8)
    assert pops.charged_for({t.task_id for t in picked}).snapshot() == queue.snapshot()
