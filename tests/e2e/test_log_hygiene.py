"""The logs of a short faulted workload, as an operator greps them (issue 12, "Logs").

One platform (emulators whose outputs are signed ``?_jwt=`` links, the three sidecars, a
control plane on SQLite), every process on its default JSON logs. Three tasks: a self-hosted
submit whose answer is dropped after the body arrived (SUBMIT_UNKNOWN, then recovered), a Runway
task whose connections are refused for 30 s of production time (the attempt fails before
sending: a retry or failover), and a plain Veo task. Then every line of every process log must
parse as JSON, lines about an attempt or a task carry its ids, no signed query, signature or
bearer token appears, the unknown submit and the retry/failover each left an INFO line.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PostgresServer
from tests.support.evidence import wait_for_a_refused_submit
from tests.support.module_stack import module_database, started_platform
from tests.support.stack import ControlPlane, ProviderFarm, describe
from tests.support.workload import SUBMIT_ROUTE
from vidroute.scheduler.v1 import scheduler_pb2 as sp

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(120)]

TIME_SCALE = 0.02
REFUSED_FOR_S = 30.0  # production seconds; the runway attempt fails unsent, then succeeds
REFUSED_UNTIL_HIT_S = 3000.0  # production seconds: ended as soon as a submit was refused
# A long prompt: logged at all, it is cut to the filter's bound, never written out whole.
PROMPT_TAIL = " over a green hill, the camera slowly rising above the hedgerows" * 6
LEAKS = re.compile(r"_jwt=|X-Goog-Signature=|X-Goog-Credential=|(?i:bearer)\s+(?!<redacted>)\S{6,}")
ABOUT_ATTEMPT = re.compile(r"^attempt (\d+)\b")
ABOUT_TASK = re.compile(r"^task (\d+)\b")


@pytest.fixture(scope="module")
def workload(
    postgres_server: PostgresServer,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, sp.Task], list[dict[str, Any]]]]:
    """Run the three tasks; yield them and every log line of every process (parsed)."""
    workdir = tmp_path_factory.mktemp("log-hygiene")
    with (
        module_database(postgres_server, "sqlite", workdir) as url,
        started_platform(workdir, url, redis_server_url, time_scale=TIME_SCALE) as platform,
    ):
        farm, cp, _ = platform
        tasks = _run(farm, cp)
        yield tasks, _parsed(workdir)


def _run(farm: ProviderFarm, cp: ControlPlane) -> dict[str, sp.Task]:
    selfhosted = farm.emulator("self_hosted")
    selfhosted.add_faults([{"route": SUBMIT_ROUTE["self_hosted"], "action": "drop_after_body"}])
    runway = farm.emulator("runway")
    # Refused until the first submit has hit the refusal, then REFUSED_FOR_S more (see
    # wait_for_a_refused_submit: a window opened before CreateTask could close unhit).
    runway.call(runway.emulator.refuse_connections, farm.seconds(REFUSED_UNTIL_HIT_S) * 1000)
    created = {
        provider: cp.create_task(
            provider, prompt=f"kite {provider} {secrets.token_hex(4)}{PROMPT_TAIL}"
        )
        for provider in ("runway", "self_hosted", "google")  # runway first: inside its refusal
    }
    wait_for_a_refused_submit(cp.database_url, created["runway"], 30)
    runway.call(runway.emulator.refuse_connections, farm.seconds(REFUSED_FOR_S) * 1000)
    return {p: cp.wait_terminal(task_id, timeout_s=60) for p, task_id in created.items()}


def _parsed(workdir: Path) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in sorted(workdir.rglob("*.log")):
        for n, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if not raw.strip():
                continue
            try:
                doc = json.loads(raw)
            except json.JSONDecodeError:
                pytest.fail(f"{path.name}:{n} is not JSON: {raw[:300]}")
            assert isinstance(doc, dict), raw
            doc["_file"] = path.name
            lines.append(doc)
    return lines


def test_every_task_succeeded(workload: tuple[dict[str, sp.Task], list[dict[str, Any]]]) -> None:
    tasks, _ = workload
    for task in tasks.values():
        assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)


def test_every_line_is_json_with_the_core_fields(
    workload: tuple[dict[str, sp.Task], list[dict[str, Any]]],
) -> None:
    _, lines = workload
    files = {line["_file"] for line in lines}
    assert any(f.startswith("controlplane-") for f in files), files
    assert any(f.startswith("sidecar-") for f in files), files
    for line in lines:
        assert {"ts", "level", "logger", "msg"} <= set(line), line


def test_lines_about_a_task_or_attempt_carry_its_ids(
    workload: tuple[dict[str, sp.Task], list[dict[str, Any]]],
) -> None:
    tasks, lines = workload
    about = 0
    for line in lines:
        if not line["logger"].startswith("controlplane."):
            continue
        on_attempt, on_task = ABOUT_ATTEMPT.match(line["msg"]), ABOUT_TASK.match(line["msg"])
        if on_attempt:
            assert str(line.get("attempt_id")) == on_attempt.group(1), line
            assert "task_id" in line, line
            about += 1
        elif on_task:
            assert str(line.get("task_id")) == on_task.group(1), line
            about += 1
    assert about >= len(tasks)
    bound = {str(line["task_id"]) for line in lines if "task_id" in line}
    for task in tasks.values():
        if task.task_id.isdigit():  # the API id is the row id: its lines carry it
            assert task.task_id in bound, (task.task_id, sorted(bound))
    keys = [line for line in lines if "client_request_key" in line]
    assert keys, "no line carries a client_request_key"
    # The chain crosses the process boundary: the sidecar's lines about a submit carry its key.
    assert any(line["_file"].startswith("sidecar-") for line in keys), "no sidecar line has a key"


def test_no_signed_url_secret_or_long_prompt_is_logged(
    workload: tuple[dict[str, sp.Task], list[dict[str, Any]]],
) -> None:
    _, lines = workload
    text = "\n".join(json.dumps(line) for line in lines)
    leaks = [m.group(0) for m in LEAKS.finditer(text)]
    assert not leaks, leaks[:5]
    assert PROMPT_TAIL.strip() not in text
    # The signed links were fetched and logged (httpx's own INFO line), redacted.
    assert any("?<redacted>" in line["msg"] for line in lines if line["logger"] == "httpx")


def test_unknown_submit_and_retry_or_failover_leave_info_lines(
    workload: tuple[dict[str, sp.Task], list[dict[str, Any]]],
) -> None:
    _, lines = workload
    info = [line for line in lines if line["level"] == "INFO" and "task_id" in line]
    unknown = [line for line in info if "submit outcome unknown" in line["msg"]]
    assert unknown, "no INFO line for the unknown submit"
    moved = [
        line
        for line in info
        if "failover after attempt" in line["msg"] or "retry on the same candidate" in line["msg"]
    ]
    assert moved, "no INFO line for the refused runway attempt's retry or failover"
