"""The submit worker checks its lease's fencing token right before the provider call (9.11.1).

A lease the store no longer holds for the attempt (lost with Redis's data, or rebuilt under another
fencing token) means the slot is not this attempt's. The control plane wires a lease source, so
such an attempt is sent under a new lease instead (tests/integration/execution/
test_submit_admission.py); an engine built without one, as here, sends nothing: the attempt fails
as PROVEN_ABSENT ("never sent") and the task is requeued without excluding the candidate.
"""

from __future__ import annotations

from controlplane.domain.outbox import Topic
from controlplane.domain.states import AttemptState, TaskState
from controlplane.execution.outcomes import PROVEN_ABSENT
from controlplane.leases.base import HeldLease
from controlplane.leases.memory_store import MemoryLeaseStore
from tests.integration.execution.exec_harness import Harness, lite

__all__ = ["lite"]


async def _assert_not_sent_and_requeued(h: Harness, attempt_id: int, task_id: int) -> None:
    assert h.fake.submit_calls == []
    failed = await h.attempt(attempt_id)
    assert failed.state is AttemptState.FAILED
    assert failed.failure is not None
    assert failed.failure.code == PROVEN_ABSENT
    assert (await h.detail(task_id)).task.state is TaskState.QUEUED
    [message] = await h.messages(Topic.REQUEUE)
    assert message.payload == {"task_id": task_id, "failed_attempt_id": attempt_id}
    [requeue] = await h.requeues(task_id)
    assert requeue.reason == PROVEN_ABSENT
    assert await h.excluded(task_id) == []


async def test_submit_is_not_sent_when_the_store_lost_the_lease(lite: Harness) -> None:
    """After the lease store lost its data, a READY_TO_SUBMIT attempt sends nothing."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-never"))
    assert isinstance(lite.leases, MemoryLeaseStore)
    lite.leases.forget_everything()
    await lite.engine().run_until_idle()
    await _assert_not_sent_and_requeued(lite, attempt.id, attempt.task_id)


async def test_submit_is_not_sent_under_a_stale_fencing_token(lite: Harness) -> None:
    """A lease with the attempt's token but another fencing token does not authorise a submit."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-never"))
    [lease] = (await lite.leases.snapshot(f"runway-{attempt.provider_account_id}")).leases
    assert isinstance(lite.leases, MemoryLeaseStore)
    lite.leases.forget_everything()
    await lite.leases.restore(
        lease.account,
        [
            HeldLease(
                lease.attempt_id,
                lease.account,
                lease.token,
                lease.fencing_token + 1,
                lease.dimensions,
            )
        ],
        ttl_ms=lease.ttl_ms,
        max_term_ms=lease.max_term_ms,
    )
    await lite.engine().run_until_idle()
    await _assert_not_sent_and_requeued(lite, attempt.id, attempt.task_id)
    # The rebuilt lease belongs to someone else's fence: the failed attempt did not release it.
    assert await lite.leases.used(lease.account, "all") == 1


async def test_submit_is_sent_while_the_lease_is_held(lite: Harness) -> None:
    """With the lease held under its fencing token, the submit goes out once, as before."""
    attempt = await lite.task_with_attempt()
    lite.fake.script_submit(lite.fake.accepted("job-a"))
    await lite.engine().run_until_idle()
    assert [c.client_request_key for c in lite.fake.submit_calls] == [attempt.client_request_key]
    assert (await lite.attempt(attempt.id)).state is AttemptState.ACCEPTED
