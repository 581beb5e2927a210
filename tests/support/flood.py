"""A tenant's client flooding CreateTask, as its own process (so the flood's client CPU is not
the measuring test's): ``python -m tests.support.flood TARGET TOKEN TENANT PROVIDER CONTROL``.

Open loop at `OFFERED_PER_S` calls a second (a fixed offered load, whatever the answers, as a
misbehaving client sends), while ``CONTROL.on`` exists; idle otherwise, so a test can turn the
flood on and off between its measurements. Stops when ``CONTROL.stop`` exists and prints one
JSON line of answer counts by status code name. ``CONTROL.answered`` appears once the first
answer of the flood came back.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import grpc

from tests.support.tenant_stack import tenant_spec
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc

OFFERED_PER_S = 100.0
IDLE_CHECK_S = 0.01  # how often an idle flooder looks for the `on` file


async def flood(target: str, token: str, tenant: str, provider: str, control: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    metadata = (("authorization", f"Bearer {token}"),)
    on, stop = control.with_suffix(".on"), control.with_suffix(".stop")
    answered = control.with_suffix(".answered")
    calls: set[asyncio.Task[None]] = set()
    async with grpc.aio.insecure_channel(target) as chan:
        stub = scheduler_service_pb2_grpc.SchedulerServiceStub(chan)

        async def one() -> None:
            request = api.CreateTaskRequest(
                spec=tenant_spec(tenant, prompt="flood kite", provider=provider),
                idempotency_key=uuid.uuid4().hex,
            )
            try:
                await stub.CreateTask(request, metadata=metadata, timeout=60)
                counts["OK"] += 1
            except grpc.aio.AioRpcError as err:
                counts[err.code().name] += 1
            answered.touch()  # a tiny local write; asyncio has no async one

        next_at = time.monotonic()
        while not stop.exists():  # a stat per tick; asyncio has no async one
            if not on.exists():  # as above
                await asyncio.sleep(IDLE_CHECK_S)
                next_at = time.monotonic()
                continue
            task = asyncio.create_task(one())
            calls.add(task)
            task.add_done_callback(calls.discard)
            next_at += 1 / OFFERED_PER_S
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*calls)
    return counts


def main() -> None:
    target, token, tenant, provider, control = sys.argv[1:6]
    counts = asyncio.run(flood(target, token, tenant, provider, Path(control)))
    print(json.dumps(dict(counts)))


if __name__ == "__main__":
    main()
