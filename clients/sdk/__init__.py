"""The vidroute Python SDK: typed clients of the scheduler API over its generated gRPC stubs.

    from clients.sdk import Client, AsyncClient, errors
    from vidroute.scheduler.v1 import scheduler_pb2

    with Client() as client:                # target: VIDROUTE_TARGET or localhost:8051
        made = client.create({"tenant_id": "acme", "prompt": "a red kite",
                              "mode": "MODE_TEXT_TO_VIDEO",
                              "output": {"width": 1280, "height": 720, "duration_ms": 4000}})
        task = client.wait(made.task.task_id, on_progress=lambda p: print(p.fraction))
        if task.state == scheduler_pb2.TASK_STATE_SUCCEEDED:
            client.download_output(task.task_id, "kite.mp4")

`Client` (blocking, `clients.sdk.sync`) and `AsyncClient` (asyncio, `clients.sdk.aio`) have the
same methods; their module docstrings hold one example per method. Results are the generated
protobuf messages (`vidroute.scheduler.v1.scheduler_pb2`) or the small frozen dataclasses
`Created` and `Cancelled` around them; failures raise `clients.sdk.errors` exceptions carrying
the server's BadRequest field violations and ErrorInfo numbers.

Unary calls have a deadline (`timeout=30.0`); read-only calls, and CreateTask with its
idempotency key (always sent unless `generate_key=False`), are retried on UNAVAILABLE through
the channel's gRPC service config (`SERVICE_CONFIG`); `watch` and `download_output` also resume
a stream dropped mid-way from where they were.
"""

from __future__ import annotations

from clients.sdk import errors
from clients.sdk._common import SERVICE_CONFIG, TERMINAL, Cancelled, Created
from clients.sdk.aio import AsyncClient
from clients.sdk.sync import Client

__all__ = ["SERVICE_CONFIG", "TERMINAL", "AsyncClient", "Cancelled", "Client", "Created", "errors"]
