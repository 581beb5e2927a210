"""The web console in a real browser: playwright-core drives Debian's chromium (headless, no
sandbox) against a running stack (emulators, sidecars, `vidroute serve` with the console on).

A task whose first provider refuses every send fails over: the first attempt FAILED with the
refusal, the task requeued with its reason, a second attempt SUCCEEDED elsewhere. The browser
signs in with the admin token before the task exists, sees it appear in the open list, opens its
timeline while it runs and watches it reach SUCCEEDED without a reload (server-sent task events),
then reads both attempts and the reason, the stored clip (playable, ranged reads 206), the
decision table, the breakers, providers and tenants pages, and keeps a screenshot of each in the
artifacts directory it prints (``$VIDROUTE_TEST_ARTIFACTS/console_browser`` when set, else under
the test's tmp_path).

Without chromium or playwright-core the test is skipped, except under CI=true where it fails:
scripts/ensure_services.sh installs chromium, `make test` runs `npm ci`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, describe, free_port
from tests.support.workload import SUBMIT_ROUTE
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(180)]

TIME_SCALE = 0.02
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("console_browser.mjs")
CHROMIUM = os.environ.get("VIDROUTE_CHROMIUM", "/usr/bin/chromium")
REFUSED, FALLBACK = "self_hosted", "runway"


def _missing_tools() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no chromium at {CHROMIUM} (scripts/ensure_services.sh installs it)"
    if shutil.which("node") is None:
        return "no node on PATH"
    if not (ROOT / "node_modules" / "playwright-core" / "package.json").exists():
        return "playwright-core is not installed (npm ci)"
    return None


@pytest.fixture
def tools() -> None:
    missing = _missing_tools()
    if missing is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser test needs its tools under CI: {missing}")
    pytest.skip(missing)


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    base = os.environ.get("VIDROUTE_TEST_ARTIFACTS")
    out = Path(base) / "console_browser" if base else tmp_path / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    print(f"\nconsole screenshots: {out}")
    return out


@pytest.fixture
def stack(
    tools: None, fresh_postgres_url: str, redis_server_url: str, tmp_path: Path
) -> Iterator[tuple[ProviderFarm, ControlPlane, int]]:
    port = free_port()
    with (
        ProviderFarm(
            tmp_path / "farm", time_scale=TIME_SCALE, providers=(REFUSED, FALLBACK)
        ) as farm,
        RedisDb(redis_server_url) as redis,
    ):
        (tmp_path / "cp").mkdir()
        cp = ControlPlane(
            tmp_path / "cp",
            farm,
            database_url=fresh_postgres_url,
            redis_url=redis.url,
            env={"VIDROUTE_CONSOLE_LISTEN": f"127.0.0.1:{port}"},
        )
        cp.start()
        try:
            yield farm, cp, port
        finally:
            cp.kill()


def _create_failover_task(farm: ProviderFarm, cp: ControlPlane) -> str:
    """A task that prefers the refusing provider and may go elsewhere: it fails over (and the
    fallback's job answers throttled a few polls, so a browser sees it running)."""
    farm.emulator(REFUSED).add_faults(
        [{"route": SUBMIT_ROUTE[REFUSED], "action": "status", "code": 503, "times": 4}]
    )
    farm.emulator(FALLBACK).add_faults(
        [{"route": SUBMIT_ROUTE[FALLBACK], "action": "throttle_polls", "n": 3, "times": 1}]
    )
    spec = gen.GenerationSpec(
        tenant_id="acme",
        prompt=f"a heron at dawn {secrets.token_hex(4)}",
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
        routing=gen.RoutingPolicy(preferred_providers=[REFUSED]),
    )
    request = api.CreateTaskRequest(spec=spec, idempotency_key=uuid.uuid4().hex)
    return str(cp._call(lambda s: s.CreateTask(request, timeout=10)).task.task_id)


def _browse(env: dict[str, str], farm: ProviderFarm, cp: ControlPlane) -> tuple[str, str]:
    """Run the browser script; once it is signed in with the list open, create the task and
    hand it the id. Its stdout and stderr."""
    browser = subprocess.Popen(
        ["node", str(SCRIPT)],
        env=env,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert browser.stdin is not None
    assert browser.stdout is not None
    try:
        ready = browser.stdout.readline()  # the script exits (EOF) if it cannot sign in
        assert ready.strip() == "READY", ready + browser.communicate(timeout=30)[1][-3000:]
        browser.stdin.write(_create_failover_task(farm, cp) + "\n")
        browser.stdin.flush()
        out, err = browser.communicate(timeout=120)
    finally:
        if browser.poll() is None:
            browser.kill()
            browser.wait()
    assert browser.returncode == 0, err[-3000:]
    return out, err


def test_console_shows_a_failed_over_task_in_a_real_browser(
    stack: tuple[ProviderFarm, ControlPlane, int], artifacts: Path
) -> None:
    """The browser sees the new task appear in the open list and its open timeline follow it live
    to SUCCEEDED; then both attempts and the failover reason, the decision table with every
    candidate, the breakers page with a forced breaker and its history, a playable clip, and the
    task's tenant on the tenants page (the built-in document's default entry: every class)."""
    farm, cp, port = stack
    # An operator's override first: an OPEN breaker, its recorded transition (routing skips it).
    forced = api.ForceBreakerRequest(
        provider=FALLBACK,
        account="prod-us",
        region="us",
        model="veo3.1",
        operation="SUBMIT",
        state=sp.BREAKER_STATE_OPEN,
        reason="console e2e: maintenance window",
    )
    cp._call(lambda s: s.ForceBreaker(forced, timeout=10))
    env = {
        **os.environ,
        "CONSOLE_URL": f"http://127.0.0.1:{port}",
        "CONSOLE_TOKEN": cp.token,
        "ARTIFACTS": str(artifacts),
        "CHROMIUM": CHROMIUM,
    }
    out, _ = _browse(env, farm, cp)
    seen = json.loads(out.strip().splitlines()[-1])
    (artifacts / "seen.json").write_text(json.dumps(seen, indent=1), encoding="utf-8")
    task = cp.wait_terminal(seen["taskId"], 30)
    assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    assert len(task.attempts) == 2, describe(task)

    # Live: the task appeared in the open list, and the open timeline followed it from a
    # running state to SUCCEEDED, neither page reloaded.
    assert (seen["listKept"], seen["timelineKept"]) == ("list", "timeline")
    assert len(seen["liveStates"]) >= 2, seen["liveStates"]
    assert seen["liveStates"][-1] == "SUCCEEDED"
    assert seen["eventStreams"] >= 1  # the timeline listened to the task's events (SSE)
    assert seen["loginUrl"] == "/login"
    assert seen["consoleErrors"] == []  # no script error, nothing the CSP had to refuse
    assert seen["byProvider"] == {"first": [task.task_id], "second": [task.task_id], "none": []}
    _check_timeline(seen, task)
    _check_decisions_and_breakers(seen)
    assert seen["healthRows"] >= 4
    assert seen["tenantClasses"] == [["INTERACTIVE", "yes"], ["STANDARD", "yes"], ["BATCH", "yes"]]
    assert "(no limit)" in seen["tenantRate"], seen["tenantRate"]
    for name in (
        "01-task-list",
        "02-timeline-failover",
        "03-decisions",
        "04-breakers",
        "06-tenants",
    ):
        shot = artifacts / f"{name}.png"
        assert shot.stat().st_size > 5_000, shot


def _check_timeline(seen: dict[str, Any], task: sp.Task) -> None:
    """Both attempts, the refusal, the failover's reason, the raw observations, the clip."""
    assert seen["taskState"] == "SUCCEEDED"
    attempts = seen["attempts"]
    assert [row[0] for row in attempts] == ["1", "2"]
    assert attempts[0][3] == "FAILED"
    assert REFUSED in attempts[0][1]
    assert attempts[1][3] == "SUCCEEDED"
    refusal = task.attempts[0].error
    assert refusal.code
    assert refusal.code in attempts[0][6]
    timeline = "\n".join(" | ".join(row) for row in seen["timeline"])
    assert "attempt 1 FAILED" in timeline
    assert "attempt 2 SUCCEEDED" in timeline
    requeues = [row for row in seen["timeline"] if row[3] == "task.state_changed -> QUEUED"]
    assert any("reason: FAIL_OVER" in row[4] for row in requeues), timeline  # why it moved
    # Each stored poll answer or callback of the provider job, with its raw status.
    observed = [row for row in seen["timeline"] if row[1] in ("poll", "callback")]
    assert any("raw status 'SUCCEEDED'" in row[3] and row[2] == "2" for row in observed), timeline
    assert seen["videos"] == 1
    assert seen["rangeStatus"] == 206
    assert seen["rangeLength"] == 100
    assert seen["contentRange"].startswith("bytes 0-99/")
    size = int(seen["contentRange"].rsplit("/", 1)[1])
    assert seen["ranges"] == {
        "whole": [200, size, "bytes"],
        "suffix": [206, 10, f"bytes {size - 10}-{size - 1}/{size}"],
        "beyond": [416, f"bytes */{size}"],
    }
    assert seen["videoDuration"] > 3.5  # the 4 s clip, loaded by the browser


def _check_decisions_and_breakers(seen: dict[str, Any]) -> None:
    """Every candidate of both decisions with the failover's exclusion; the forced breaker."""
    assert seen["decisions"] >= 2  # the first route and the failover's
    ids = {row[0].split()[0] for row in seen["explainRows"]}
    assert any(REFUSED in i for i in ids), ids
    assert any(FALLBACK in i for i in ids), ids
    assert any("selected" in row[0] for row in seen["explainRows"])
    # The failover's decision names why the first provider was left out.
    assert any("EXCLUDED_BY_FAILOVER" in row[2] for row in seen["explainRows"]), seen["explainRows"]
    assert "Hard-filter reason" in seen["explainHeaders"]
    breakers = {(row[0], row[4]) for row in seen["breakers"]}
    assert (REFUSED, "SUBMIT") in breakers, seen["breakers"]
    opened = [row for row in seen["breakers"] if row[3:5] == ["veo3.1", "SUBMIT"]]
    assert [(row[5], row[6]) for row in opened] == [("OPEN", "yes")], seen["breakers"]
    history = [row for row in seen["breakerHistory"] if "maintenance window" in row[6]]
    assert [(row[2], row[5]) for row in history] == [("veo3.1", "OPEN")], seen["breakerHistory"]
    # One provider's breakers and history: only its own.
    assert set(seen["runwayBreakers"]) == {FALLBACK}, seen["runwayBreakers"]
    assert seen["runwayHistory"]
    assert all(a.startswith(f"{FALLBACK}/") for a in seen["runwayHistory"]), seen["runwayHistory"]
