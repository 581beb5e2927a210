"""`vidroute submit --wait --wait-timeout S` against a control plane whose tasks stay QUEUED
(the API alone, no scheduler): past S one line says the task goes on, exit code 1."""

from __future__ import annotations

import time

import pytest

from clients import cli
from tests.integration.sdk_client.conftest import Plane

pytestmark = [pytest.mark.timeout(60)]


def test_a_wait_timeout_says_the_task_goes_on_exit_1(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The wait ends after about its timeout with one error line naming the task, its state
    and the command that follows it, not a bare DEADLINE_EXCEEDED."""
    monkeypatch.setenv("VIDROUTE_TOKEN", plane.token)
    started = time.monotonic()
    code = cli.main(
        ["submit", "--target", plane.target, "--tenant", "acme", "--prompt", "a kite",
         "--wait", "--wait-timeout", "1"]
    )  # fmt: skip
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 1, err
    assert took >= 1
    (task_line,) = [line for line in out.splitlines() if line.startswith("task ")]
    task_id = task_line.split()[1]
    assert err.splitlines() == [
        f"error: gave up waiting after 1 s; task {task_id} is QUEUED and goes on "
        f"(vidroute watch {task_id})"
    ]
