"""`vidroute up` as a user runs it: the whole dev stack, a task submitted with the CLI, its
stored MP4 probed.

The stack runs in a temporary working directory (so ``./var`` with its SQLite database, logs and
objects is this test's own) with ``--ephemeral-ports``, so the emulators and sidecars never clash
with a developer's ``make up`` or another test on the fixed dev ports.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from standardwebhooks.webhooks import Webhook

from tests.support import processes
from tests.support.stack import local_path, probe_mp4, wait_for
from tests.support.webhook_receiver import Answer, Received, WebhookReceiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]


def _cli(workdir: Path, *args: str) -> dict[str, Any]:
    """Run ``vidroute <args> --json`` and parse its output."""
    done = subprocess.run(
        [sys.executable, "-m", "clients.cli", *args, "--json"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _cli_as(workdir: Path, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``vidroute <args>`` sending `token`."""
    return subprocess.run(
        [sys.executable, "-m", "clients.cli", *args],
        cwd=workdir,
        env={**os.environ, "VIDROUTE_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_vidroute_up_runs_a_cli_submitted_task_to_a_stored_mp4(tmp_path: Path) -> None:
    """`vidroute up` serves with the example tenants and accounts published; `vidroute submit`
    creates a 4 s task; `vidroute get` shows it SUCCEEDED; the stored file is an MP4 of 4 s
    within one frame; the callback ingress answers.
    """
    # The dev defaults (SQLite under ./var, in-process leases) are what `make up` uses.
    inherited = {k: "" for k in os.environ if k.startswith("VIDROUTE_")}
    up = processes.start(
        ["-m", "clients.cli", "up", "--listen", "127.0.0.1:0", "--ephemeral-ports"],
        workdir=tmp_path,
        name="up",
        env={**inherited, "PYTHONPATH": str(ROOT)},
        ready_timeout=120,
    )
    try:
        target = up.address
        # It runs authenticated: the dev tokens are printed (and left in ./var, where the CLI
        # finds the admin one); a wrong token is refused.
        assert "dev API tokens" in up.log()
        refused = _cli_as(tmp_path, "not-a-token", "get", "1", "--target", target)
        assert "UNAUTHENTICATED" in refused.stderr, refused.stderr
        created = _cli(
            tmp_path,
            "submit",
            "--target",
            target,
            "--tenant",
            "acme",
            "--prompt",
            "a red kite over a green hill",
            "--mode",
            "text-to-video",
            "--duration",
            "4",
        )
        task_id = created["task_id"]
        # The dev tenant token (tenant acme) reads acme's task but may not act for another tenant.
        member = (tmp_path / "var" / "dev-tenant-token").read_text().strip()
        assert _cli_as(tmp_path, member, "get", task_id, "--target", target).returncode == 0
        foreign = _cli_as(
            tmp_path, member, "submit", "--target", target, "--tenant", "globex", "--prompt", "x"
        )
        assert "PERMISSION_DENIED" in foreign.stderr, foreign.stderr
        # The example tenants are published (controlplane/tenants.example.yaml): acme may not
        # buy the INTERACTIVE lane, and the refusal names the classes it may use.
        fast = _cli_as(
            tmp_path, member, "submit", "--target", target, "--tenant", "acme", "--prompt", "x",
            "--service-class", "interactive",
        )  # fmt: skip
        assert "PERMISSION_DENIED" in fast.stderr, fast.stderr
        assert "entitled: STANDARD, BATCH" in fast.stderr, fast.stderr
        assert _cli(tmp_path, "tenants", "get", "--target", target)["version"] == (
            "tenants-example-1"
        )
        # And the example account limits (controlplane/accounts.example.yaml), with their use.
        assert _cli(tmp_path, "accounts", "get", "--target", target)["version"] == (
            "accounts-example-1"
        )
        usage = _cli(tmp_path, "accounts", "usage", "--target", target)["dimensions"]
        total = {(d["provider"], d["account"], d["dimension"]): d for d in usage}
        assert total[("runway", "prod-us", "account")]["limit"] == "3", usage

        def succeeded() -> dict[str, Any] | None:
            task = _cli(tmp_path, "get", task_id, "--target", target)
            assert task.get("state") not in ("TASK_STATE_FAILED", "TASK_STATE_CANCELLED"), task
            return task if task.get("state") == "TASK_STATE_SUCCEEDED" else None

        task = wait_for(succeeded, timeout_s=120, interval_s=0.5, what=f"task {task_id}")
        path = local_path(task["output"]["uri"])
        assert path.is_relative_to(tmp_path / "var"), path
        duration, fps = probe_mp4(path)
        assert abs(duration - 4.0) <= 1.0 / fps, (duration, fps)
        # The provider callback ingress runs too: an unsigned callback is answered 401.
        ingress = re.search(r"callback ingress listening on (http://[0-9.]+:[0-9]+)", up.log())
        assert ingress, up.log()
        unsigned = httpx.post(f"{ingress.group(1)}/callbacks/runway", content=b"{}", timeout=5)
        assert unsigned.status_code == 401
    finally:
        code = up.stop(timeout=30)
    assert code == 0, up.log()
    assert (tmp_path / "var" / "log" / "emulator-runway.log").exists()


async def test_vidroute_up_delivers_a_signed_webhook_to_webhook_url(tmp_path: Path) -> None:
    """On `vidroute up`, `vidroute submit --webhook-url` works: the stack wrote the dev tenant's
    signing file under ./var (owner-only) and the task's task.succeeded arrives signed with it."""
    inherited = {k: "" for k in os.environ if k.startswith("VIDROUTE_")}
    up = processes.start(
        ["-m", "clients.cli", "up", "--listen", "127.0.0.1:0", "--ephemeral-ports"],
        workdir=tmp_path,
        name="up",
        env={**inherited, "PYTHONPATH": str(ROOT)},
        ready_timeout=120,
    )
    try:
        signing_file = tmp_path / "var" / "dev-webhooks.yaml"
        assert signing_file.stat().st_mode & 0o077 == 0
        secret = yaml.safe_load(signing_file.read_text())["tenants"]["acme"]["secret"]
        async with WebhookReceiver([Answer(200)]) as receiver:
            created = await asyncio.to_thread(
                _cli,
                tmp_path,
                *("submit", "--target", up.address, "--tenant", "acme"),
                *("--prompt", "a red kite", "--duration", "4", "--webhook-url", receiver.url),
            )
            assert created["webhook"]["url"] == receiver.url

            def succeeded() -> Received | None:
                for request in receiver.requests:
                    if json.loads(request.body)["type"] == "task.succeeded":
                        return request
                return None

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120
            while (request := succeeded()) is None:
                assert loop.time() < deadline, f"no task.succeeded webhook: {receiver.requests}"
                await asyncio.sleep(0.1)
        payload = Webhook(secret).verify(request.body, request.headers)
        assert payload["data"]["task_id"] == created["task_id"]
    finally:
        code = up.stop(timeout=30)
    assert code == 0, up.log()
