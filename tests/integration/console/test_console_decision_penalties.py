"""The console's decision table shows each candidate's penalties from the stored decision."""

from __future__ import annotations

import re
from datetime import timedelta

import httpx
import pytest

from controlplane.api.auth import Authenticator
from controlplane.console.app import Console
from controlplane.persistence.database import Database
from controlplane.persistence.records import NewRouteDecision
from controlplane.service.console_reads import ConsoleReads
from controlplane.service.tasks import TaskService
from tests.integration.persistence.builders import NOW, Scenario

pytestmark = pytest.mark.timeout(60)

SELECTED = "runway/gen4.5/prod-us"
LOADED = "self_hosted/wan2.2/gpu-a"


async def test_the_decision_table_shows_each_candidates_penalties(db: Database) -> None:
    """A stored decision whose self-hosted candidate carried a GPU_UTILIZATION penalty shows it
    (name and amount) in that candidate's Penalties cell; the other candidate's cell is empty."""
    build = Scenario(db)
    account = await build.account()
    task = await build.scheduling_task()
    decision = NewRouteDecision(
        policy_version="router-v17",
        reason_code="BEST_SCORE",
        candidate_snapshot={
            "selected": SELECTED,
            "candidates": [
                {"id": SELECTED, "eligible": True, "score": 0.61, "components": {"cost": 0.7}},
                {
                    "id": LOADED,
                    "eligible": True,
                    "score": 0.42,
                    "components": {"cost": 0.9},
                    "penalties": {"GPU_UTILIZATION": 0.25},
                },
            ],
        },
        selected_candidate=SELECTED,
    )
    async with db.unit(NOW + timedelta(seconds=1)) as u:
        await u.create_attempt(task.id, task.status_version, build.new_attempt(account), decision)
    console = Console(Authenticator({}), ConsoleReads(TaskService(db), db))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console.app), base_url="http://console.test"
    ) as browser:
        page = await browser.get(f"/tasks/{task.id}/decisions")
    assert page.status_code == 200, page.text[:300]
    assert "<th>Penalties</th>" in page.text
    rows = re.findall(r"<tr class=\"[^\"]*\">(.*?)</tr>", page.text, re.S)
    cells = {
        re.findall(r"<td>([^<✔]+)", row)[0].strip(): re.findall(
            r"<td class=\"penalties\">([^<]*)</td>", row
        )[0]
        for row in rows
    }
    assert cells == {SELECTED: "", LOADED: "GPU_UTILIZATION -0.2500"}


async def test_the_decision_table_shows_why_and_what_each_score_read(db: Database) -> None:
    """A stored decision's selection reason is shown beside the selected candidate, and each
    candidate's inputs cell lists the window figures its components read (samples, mean and
    p95 latency); a candidate without evidence has an empty cell."""
    build = Scenario(db)
    account = await build.account()
    task = await build.scheduling_task()
    decision = NewRouteDecision(
        policy_version="router-v17",
        reason_code="SELECTED",
        candidate_snapshot={
            "selected": SELECTED,
            "selection_reason": "bucketed_near_tie",
            "candidates": [
                {"id": SELECTED, "eligible": True, "score": 0.61, "components": {"latency": 0.9}},
                {"id": LOADED, "eligible": True, "score": 0.60, "components": {"latency": 0.5}},
            ],
            "facts": {"health": {SELECTED: [0.8, 42.0, 95.5, 0.9, 130.25]}},
        },
        selected_candidate=SELECTED,
    )
    async with db.unit(NOW + timedelta(seconds=1)) as u:
        await u.create_attempt(task.id, task.status_version, build.new_attempt(account), decision)
    console = Console(Authenticator({}), ConsoleReads(TaskService(db), db))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console.app), base_url="http://console.test"
    ) as browser:
        page = await browser.get(f"/tasks/{task.id}/decisions")
    assert page.status_code == 200, page.text[:300]
    assert f"<strong>{SELECTED}</strong> (<code>bucketed_near_tie</code>)" in page.text
    rows = re.findall(r"<tr class=\"[^\"]*\">(.*?)</tr>", page.text, re.S)
    cells = {
        re.findall(r"<td>([^<✔]+)", row)[0].strip(): re.findall(
            r"<td class=\"inputs\">(.*?)</td>", row, re.S
        )[0]
        for row in rows
    }
    assert cells[LOADED] == ""
    assert cells[SELECTED].split("<br>") == [
        "mean_latency_s 95.5",
        "p95_latency_s 130.2",
        "success_lower_bound 0.8",
        "success_rate 0.9",
        "window_samples 42",
    ]
