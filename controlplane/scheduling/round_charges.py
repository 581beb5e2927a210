"""A round's fair-queue charges for the tasks that went, not for every task it popped (9.12.2).

A round pops its take in fair order before routing it, and routing may then park some of the
take: no free slot (NO_CAPACITY), a breaker refusing. Those tasks stay queued, so charging
their tenants for them is paying for work never done: with a backlog deeper than the free
slots, each round charged every tenant for its whole popped share while only the first few
went, and 1:3 weights came out 20:21 on the real stack (tests/e2e/test_tenants_stack.py).
`FairQueue.pop_next`'s rule is that it returns only tasks that can go, and the parked ones
could not, so the state the dispatcher carries to the next round is the queue's as if they had
been ineligible: `RoundPops.charged_for` rebuilds the queue as it stood before the first pop and
pops again, in the same order, only the tasks that went (feeding it the same refills).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from controlplane.domain import fairqueue as fq


@dataclass(slots=True)
class RoundPops:
    """How to get a round's queue back as before its first pop, and the rows it refilled."""

    rebuild: Callable[[], fq.FairQueue]
    refills: list[tuple[fq.GroupKey, list[fq.QueuedTask], bool]] = field(default_factory=list)

    def refilled(self, group: fq.GroupKey, tasks: list[fq.QueuedTask], partial: bool) -> None:
        """Record a refill of the round, in order."""
        self.refills.append((group, list(tasks), partial))

    def charged_for(self, went: Collection[str]) -> fq.FairQueue:
        """The queue after popping, in fair order, only the tasks (ids) in `went`.

        A replay that would need rows the round never read (a group's later rows, now ahead
        of parked ones) stops there: those few went uncharged, a smaller error than charging
        every parked task."""
        queue = self.rebuild()
        pending = list(self.refills)

        def eligible(task: fq.QueuedTask) -> bool:
            return task.task_id in went

        taken = len(queue.pop_batch(len(went), eligible))
        while taken < len(went) and (group := queue.drained) is not None:
            refill = next((r for r in pending if r[0] == group), None)
            if refill is None:
                break
            pending.remove(refill)
            queue.refill(group, refill[1], partial=refill[2])
            taken += len(queue.pop_batch(len(went) - taken, eligible))
        return queue
