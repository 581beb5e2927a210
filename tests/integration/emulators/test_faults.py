"""Fault injection observed from a real httpx client, checked against the emulator's truth."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from adapter_sidecars.emulators.faults import FaultRuleError
from adapter_sidecars.emulators.runway import RunwayEmulator

from .conftest import RUNWAY_HEADERS, T2V_BODY, eventually

CREATE = "POST /v1/text_to_video"


async def test_partial_body_drop_errors_and_creates_nothing(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """A connection dropped half way through the body fails the client and creates no job."""
    runway.add_faults({"route": CREATE, "action": "drop_after_partial_body"})
    with pytest.raises(httpx.TransportError):
        await rw.post("/v1/text_to_video", json={**T2V_BODY, "promptText": "x" * 900})
    assert runway.truth() == []


async def test_drop_after_body_errors_but_job_exists(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """A connection dropped after the full body fails the client yet the job was created."""
    runway.add_faults({"route": CREATE, "action": "drop_after_body"})
    with pytest.raises(httpx.TransportError):
        await rw.post("/v1/text_to_video", json=T2V_BODY)
    [job] = runway.truth()
    assert job["body"] == T2V_BODY
    assert job["route"] == CREATE


async def test_stalled_response_times_out_but_job_exists(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """A response stalled past the client timeout raises ReadTimeout while the job exists."""
    runway.add_faults({"route": CREATE, "action": "stall_response", "seconds": 3})
    with pytest.raises(httpx.ReadTimeout):
        await rw.post("/v1/text_to_video", json=T2V_BODY, timeout=0.3)
    assert len(runway.truth()) == 1


async def test_corrupt_json_is_2xx_with_unparseable_body(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """corrupt_json answers 200 with a body that is not JSON, after creating the job."""
    runway.add_faults({"route": CREATE, "action": "corrupt_json"})
    response = await rw.post("/v1/text_to_video", json=T2V_BODY)
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        response.json()
    assert len(runway.truth()) == 1


async def test_missing_id_is_2xx_json_without_id(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """missing_id answers 2xx JSON lacking the id while the job exists."""
    runway.add_faults({"route": CREATE, "action": "missing_id"})
    response = await rw.post("/v1/text_to_video", json=T2V_BODY)
    assert response.status_code == 200
    assert "id" not in response.json()
    assert len(runway.truth()) == 1


async def test_status_fault_uses_provider_envelope_and_retry_after(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """A status fault sends the code, Retry-After and Runway's error body; no job."""
    runway.add_faults({"route": CREATE, "action": "status", "code": 429, "retry_after": 7})
    response = await rw.post("/v1/text_to_video", json=T2V_BODY)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert isinstance(response.json()["error"], str)
    assert runway.truth() == []


async def test_status_fault_with_custom_body(runway: RunwayEmulator, rw: httpx.AsyncClient) -> None:
    """A status fault with `body` sends exactly that body."""
    runway.add_faults({"route": CREATE, "action": "status", "code": 503, "body": {"error": "shed"}})
    response = await rw.post("/v1/text_to_video", json=T2V_BODY)
    assert (response.status_code, response.json()) == (503, {"error": "shed"})


async def test_delay_accept_delays_but_succeeds(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """delay_accept holds the request before it is read, then serves it normally."""
    runway.add_faults({"route": CREATE, "action": "delay_accept", "ms": 300})
    started = time.monotonic()
    response = await rw.post("/v1/text_to_video", json=T2V_BODY)
    assert response.status_code == 200
    assert time.monotonic() - started >= 0.3


async def test_refuse_connection_then_recovers(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """refuse_connection makes new connects fail with ConnectError until the duration passes."""
    assert (await rw.get("/v1/organization")).status_code == 200  # leaves a keep-alive behind
    response = await rw.post(
        "/__emulator/faults", json=[{"action": "refuse_connection", "duration_ms": 400}]
    )
    assert response.status_code == 200
    await eventually(lambda: runway._server._server is None, within=2)
    with pytest.raises(httpx.ConnectError):
        await rw.post("/v1/text_to_video", json=T2V_BODY)

    async def reachable() -> bool:
        try:
            return (await rw.get("/v1/organization")).status_code == 200
        except httpx.ConnectError:
            return False

    await eventually(reachable, within=5)
    assert runway.truth() == []


async def test_nth_fires_only_on_that_request(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """A rule with nth=2 fires on the second matching request only."""
    runway.add_faults({"route": "POST /v1/*", "nth": 2, "action": "status", "code": 500})
    codes = [(await rw.post("/v1/text_to_video", json=T2V_BODY)).status_code for _ in range(3)]
    assert codes == [200, 500, 200]


async def test_times_fires_on_next_n_requests(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """A rule with times=2 fires on the next two matching requests, then is exhausted."""
    runway.add_faults({"route": CREATE, "times": 2, "action": "status", "code": 502})
    codes = [(await rw.post("/v1/text_to_video", json=T2V_BODY)).status_code for _ in range(3)]
    assert codes == [502, 502, 200]
    [rule] = runway.faults()
    assert rule["fired"] == 2
    assert rule["exhausted"]


async def test_admin_endpoints_manage_faults_and_reset(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """The /__emulator endpoints add, list, clear faults, reject bad rules and reset state."""
    bad = await rw.post("/__emulator/faults", json=[{"action": "explode"}])
    assert bad.status_code == 400
    added = await rw.post("/__emulator/faults", json=[{"route": CREATE, "action": "missing_id"}])
    assert added.json()["faults"][0]["action"] == "missing_id"
    assert len((await rw.get("/__emulator/faults")).json()["faults"]) == 1
    assert (await rw.delete("/__emulator/faults")).status_code == 204
    assert (await rw.get("/__emulator/faults")).json()["faults"] == []
    await rw.post("/v1/text_to_video", json=T2V_BODY)
    assert len((await rw.get("/__emulator/jobs")).json()["jobs"]) == 1
    assert (await rw.post("/__emulator/reset")).status_code == 204
    assert (await rw.get("/__emulator/jobs")).json()["jobs"] == []


def test_malformed_rules_are_rejected() -> None:
    """Rules missing required parameters raise FaultRuleError and add nothing."""
    emulator = RunwayEmulator()
    with pytest.raises(FaultRuleError):
        emulator.add_faults([{"action": "missing_id"}, {"action": "stall_response"}])
    assert emulator.faults() == []


async def test_injected_usage_charge_appears_in_export(
    runway: RunwayEmulator, rw: httpx.AsyncClient
) -> None:
    """A charge injected through the admin API shows in the usage export with no job."""
    charge = {"model": "gen4.5", "credits": 60}
    assert (await rw.post("/__emulator/usage", json=charge)).status_code == 201
    usage = (await rw.post("/v1/organization/usage", json={}, headers=RUNWAY_HEADERS)).json()
    assert usage["results"][0]["usedCredits"] == [{"model": "gen4.5", "amount": 60.0}]
    assert runway.truth() == []
