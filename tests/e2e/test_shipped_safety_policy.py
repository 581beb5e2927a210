"""The shipped safety policy rejects before any provider call, through real processes (9.9.2).

`vidroute serve` with its default configuration (the shipped ``controlplane/safety_policy.yaml``)
in front of the three sidecars and their emulators. A prompt the policy blocks is refused at
CreateTask for every provider it is pinned to; the emulators' truth and request counters show
that no provider saw it, while a compliant task through the same stack does reach one.
"""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.support.stack import PROVIDERS, ControlPlane, ProviderFarm, spec_for, wait_for
from vidroute.scheduler.v1 import scheduler_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(180)]
BLOCKED = "a beheading in the town square at dawn"


def provider_posts(farm: ProviderFarm) -> dict[str, int]:
    """POST requests each emulator received (health probes are GETs)."""
    out: dict[str, int] = {}
    for name in farm.providers:
        emulator = farm.emulator(name)
        counts = emulator.call(lambda e=emulator: dict(e.emulator.counters))
        out[name] = sum(n for path, n in counts.items() if path.startswith("POST"))
    return out


def test_the_shipped_policy_refuses_before_any_provider_sees_the_request(
    farm: ProviderFarm, make_control_plane: Any, fresh_postgres_url: str
) -> None:
    """Blocked for every provider: FAILED_PRECONDITION naming the rule, zero provider jobs."""
    cp: ControlPlane = make_control_plane(farm, fresh_postgres_url, None)
    cp.start()
    assert cp.stub is not None
    farm.reset()
    for provider in PROVIDERS:
        request = api.CreateTaskRequest(
            spec=spec_for(provider, BLOCKED), idempotency_key=uuid.uuid4().hex
        )
        with pytest.raises(grpc.RpcError) as caught:
            cp.stub.CreateTask(request, timeout=10)
        status = rpc_status.from_call(caught.value)
        assert status is not None
        assert status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        info = error_details_pb2.ErrorInfo()
        assert status.details[0].Unpack(info)
        assert info.reason == "SAFETY_POLICY_VIOLATION"
        assert (info.metadata["rule"], info.metadata["field"]) == ("graphic-violence", "prompt")
    listed = cp.stub.ListTasks(api.ListTasksRequest(), timeout=10).tasks
    assert list(listed) == []

    allowed = cp.create_task("runway")
    wait_for(lambda: farm.truth("runway"), timeout_s=60, what="the allowed task's provider job")
    assert cp.get_task(allowed).state != scheduler_pb2.TASK_STATE_FAILED

    assert {name: len(farm.truth(name)) for name in PROVIDERS} == {
        "runway": 1,
        "google": 0,
        "self_hosted": 0,
    }
    assert BLOCKED not in repr(farm.truth("runway"))
    assert provider_posts(farm) == {"runway": 1, "google": 0, "self_hosted": 0}
