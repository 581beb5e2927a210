"""The outbox's topics: the one place a topic's name is spelled.

An outbox message is written in the same transaction as the state it announces (9.10.1) and
names work for one consumer. Every writer and consumer uses `Topic`; a test fails if a topic's
string appears anywhere else in the control plane or the tests.

``task.queued``     {task_id, tenant_id, service_class, priority}: a new task. Written with the
                    task; a wake-up for the dispatcher, which upkeep completes (the dispatcher
                    reads the QUEUED tasks themselves).
``task.requeue``    {task_id, failed_attempt_id}: the task is QUEUED again for a new attempt.
                    Only a wake-up, completed like ``task.queued``: what the next decision must
                    avoid is stored as rows in the same transaction (`controlplane.domain.requeue`).
``attempt.submit``  {task_id, attempt_id, [supports_idempotency_key]}: written by the dispatcher
                    with the attempt (READY_TO_SUBMIT, holding the lease whose token is on the
                    attempt row); consumed by the submit worker.
``attempt.cancel``  {task_id, attempt_id}: written by `CancelService`, consumed by the cancel
                    worker.
``output.fetch``    {task_id, attempt_id, provider_job_id}: written by the event normalizer when a
                    job succeeded, consumed by the output fetcher.
``webhook.deliver`` never a row of ``outbox``: a wake-up only, for a caller-webhook message
                    committed in ``webhook_messages`` (its own outbox); the delivery worker
                    (`controlplane.webhooks`) takes it.
"""

from __future__ import annotations

import enum

__all__ = ["Topic"]


class Topic(enum.StrEnum):
    """An outbox topic; the value is what the ``outbox.topic`` column holds."""

    QUEUED = "task.queued"
    REQUEUE = "task.requeue"
    SUBMIT = "attempt.submit"
    CANCEL = "attempt.cancel"
    OUTPUT_FETCH = "output.fetch"
    WEBHOOK = "webhook.deliver"
