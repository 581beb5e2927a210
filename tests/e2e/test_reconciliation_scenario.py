"""Daily bill reconciliation through the real stack (issue 11's Done-when, design 9.23.3/9.23.4).

Emulators (Runway daily credit totals per model, Veo per-operation billing lines, self-hosted
GPU-second rows) behind the shipped sidecars over gRPC, a control plane on PostgreSQL with Redis
leases, every duration times one factor. The scenario:

* jobs that succeed on all three providers;
* a Runway job that fails (billed nothing: no row) and a Veo job that fails but is billed anyway
  (``charge_failed`` in the export: FAILED_TASK_CHARGED);
* a Veo create whose answer is corrupt although Google accepted it: the attempt is
  SUBMIT_UNKNOWN, then ABANDONED, and its job is billed (COST_AFTER_UNKNOWN, tied back to that
  attempt by account + model + window + amount: 9.17.5's background reconciliation);
* two Veo creates of 8 s cut off mid-body (Google never got them; the platform cannot know):
  both SUBMIT_UNKNOWN, then ABANDONED; then Google bills one 8 s operation the platform never
  heard of: it fits both lost attempts equally (model, window, amount), so it is
  AMBIGUOUS_MATCH listing both, adopted by neither;
* in the usage export: one Veo job billed twice (DUPLICATE_CHARGE), one charge with no job
  (CHARGE_WITHOUT_LOCAL_JOB), one job billed at another USD/second (WRONG_PRICE_VERSION), one
  self-hosted job's GPU seconds converted at another rate (WRONG_CONVERSION_RATE).

``vidroute reconcile --date D --json`` runs as operators run it (a process with the control
plane's environment; exit 1: discrepancies found, 2: an account unread). Its rows equal the
injected truth row for row (kind, provider, attempt, amounts): none missed, none invented.
Running the same day again writes nothing and prints the same report. The first run and the
two concurrent ones are processes; the runs between them call the command's own entry point
(`clients.cli.main`) in this process, on the environment a process gets: the same code and
report without a Python start each (seconds of CPU on a loaded 2-core host).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from clients import cli
from tests.conftest import PostgresServer
from tests.support.module_stack import module_database, started_platform
from tests.support.stack import ControlPlane, ProviderFarm, describe, wait_for
from tests.support.workload import SUBMIT_ROUTE
from vidroute.scheduler.v1 import scheduler_pb2 as sp

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(600)]

TIME_SCALE = 0.02
DURATION_S = 4
# Shipped prices of the pinned models (capabilities): Veo 3.1 preview USD 0.40/s, the self-hosted
# GPU second 350 micros, a 4 s self-hosted job = 10 + 8 x 4 = 42 GPU seconds (emulator default).
VEO_MICROS = 400_000 * DURATION_S
VEO_WRONG_PRICE_USD_PER_S = "0.30"
GPU_SECONDS = 42
GPU_RATE, GPU_WRONG_RATE = 350, 500
RUNWAY_CREDITS_PER_S, RUNWAY_MICROS_PER_CREDIT = 12, 10_000  # gen4.5; 1 credit = USD 0.01
RUNWAY_UNKNOWN_S, RUNWAY_FAILED_S = 3, 5
ORPHAN = {"model": "veo-3.1-generate-preview", "seconds": 6, "usd": 2.4, "ref": "ghost-operation"}
#: Two Veo creates lost alike (8 s: no other Veo attempt or charge of the day costs 3.2 USD),
#: and the one 8 s operation Google bills that fits both.
LOST_TWINS, LOST_S = ("veo_lost_a", "veo_lost_b"), 8
LOST_CHARGE = {"model": "veo-3.1-generate-preview", "seconds": 8, "usd": 3.2, "ref": "lost-op"}
LATE_ORPHAN = {"model": "veo-3.1-generate-preview", "seconds": 2, "usd": 0.8, "ref": "late-op"}


@dataclass
class Scenario:
    farm: ProviderFarm
    cp: ControlPlane
    day: str
    tasks: dict[str, sp.Task]
    truth_rows: list[tuple[str, str, int | None, int, int]]
    first: dict[str, Any]
    second: dict[str, Any]
    third: dict[str, Any]  # after a late line in Google's export
    runs: list[tuple[int, str, int | None]]  # (id, provider, superseded_by) after the third
    delta: dict[str, int]  # delta_by_provider after the third
    unreachable: dict[str, Any]  # a fourth run with the Runway sidecar away
    together: list[dict[str, Any]]  # two concurrent runs after one more late line


def _job_of(
    farm: ProviderFarm, provider: str, prompt: str, phase: str | None = None
) -> dict[str, Any]:
    """The one job the provider really created for `prompt` (of `phase`: a failed task's
    retry may have made another)."""
    jobs = [
        j
        for j in farm.truth(provider)
        if prompt in json.dumps(j.get("body", {})) and phase in (None, j["phase"])
    ]
    assert len(jobs) == 1, f"{provider} jobs for {prompt!r}: {jobs}"
    return jobs[0]


def _usage_fault(farm: ProviderFarm, provider: str, fault: dict[str, Any]) -> None:
    """Through the emulator's admin route, as a test client of the real export would."""
    url = farm.emulator(provider).emulator.url
    reply = httpx.post(f"{url}/__emulator/usage/faults", json=fault, timeout=5)
    assert reply.status_code == 201, reply.text


def _arm(farm: ProviderFarm, provider: str, fault: dict[str, Any]) -> int:
    """A fault on the provider's next create; returns its index in the fault book."""
    emulator = farm.emulator(provider)
    index = len(emulator.call(emulator.emulator.faults))
    emulator.add_faults({"route": SUBMIT_ROUTE[provider], "nth": 1, **fault})
    return index


def _fired(farm: ProviderFarm, provider: str, index: int) -> bool:
    emulator = farm.emulator(provider)
    return bool(emulator.call(emulator.emulator.faults)[index]["fired"] >= 1)


def _cli_env(farm: ProviderFarm, cp: ControlPlane, adapters: str = "") -> dict[str, str]:
    """What a ``vidroute`` CronJob pod gets besides the host's environment: the control
    plane's database, the sidecars (`adapters`, else every one) and the one time scale."""
    return {
        **farm.env,
        "VIDROUTE_DATABASE_URL": cp.database_url,
        "VIDROUTE_ADAPTERS": adapters or farm.adapters_env,
        "VIDROUTE_LOG_LEVEL": "WARNING",
    }


def _cli_here(env: dict[str, str], argv: list[str], rc: int) -> dict[str, Any]:
    """``vidroute ARGV`` through the command's own entry point (`clients.cli.main`) in this
    process, with `env` set for the call: what its process would print, without the Python
    start. Asserts the exit status `rc`; returns the JSON it printed."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(out), redirect_stderr(err):
        for name, value in env.items():
            patch.setenv(name, value)
        code = cli.main(argv)
    assert code == rc, f"rc {code}\n{out.getvalue()}\n{err.getvalue()}"
    return dict(json.loads(out.getvalue()))


def _reconcile(
    farm: ProviderFarm, cp: ControlPlane, day: str, *, adapters: str = "", rc: int = 1
) -> dict[str, Any]:
    """``vidroute reconcile --date DAY --json`` in this process (`_cli_here`)."""
    argv = ["reconcile", "--date", day, "--json"]
    return _cli_here(_cli_env(farm, cp, adapters), argv, rc)


def _reconcile_process(
    farm: ProviderFarm, cp: ControlPlane, day: str, *, adapters: str = "", rc: int = 1
) -> dict[str, Any]:
    """One ``vidroute reconcile`` process, as an operator or a CronJob runs it."""
    [report] = _reconcile_together(farm, cp, day, adapters=adapters, rc=rc, n=1)
    return report


def _reconcile_together(
    farm: ProviderFarm, cp: ControlPlane, day: str, *, adapters: str = "", rc: int = 1, n: int
) -> list[dict[str, Any]]:
    """`n` ``vidroute reconcile`` processes started at once (two CronJob pods, say)."""
    env = {**os.environ, **_cli_env(farm, cp, adapters)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "clients.cli", "reconcile", "--date", day, "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == rc, f"rc {proc.returncode}\n{out}\n{err}"
        reports.append(json.loads(out))
    return reports


def _run(farm: ProviderFarm, cp: ControlPlane) -> Scenario:
    # A day boundary inside the scenario would split its bills: start after midnight passed.
    wait_for(
        lambda: datetime.now(UTC).strftime("%H:%M") < "23:55",
        timeout_s=400,
        interval_s=5,
        what="not within 5 minutes of midnight UTC",
    )
    day = datetime.now(UTC).date().isoformat()
    tag = secrets.token_hex(3)
    prompts: dict[str, str] = {}
    created: dict[str, str] = {}

    def create(name: str, provider: str, duration_s: int = DURATION_S) -> str:
        prompts[name] = f"reconcile {name} {tag} a red kite over a green hill"
        created[name] = cp.create_task(provider, prompt=prompts[name], duration_s=duration_s)
        return created[name]

    # The unknown submits first: their 1800 s (36 s here) recovery windows run while the rest
    # do. Veo bills the lost operation on its own line; Runway only in the model's daily total,
    # so its clip is 3 s (36 credits): no other Runway attempt of the day costs that much, and
    # the aggregate's difference can be pinned on it alone.
    for name, provider, fault, seconds in (
        ("veo_unknown", "google", "corrupt_json", DURATION_S),
        ("runway_unknown", "runway", "drop_after_body", RUNWAY_UNKNOWN_S),
        *((name, "google", "drop_after_partial_body", LOST_S) for name in LOST_TWINS),
    ):
        index = _arm(farm, provider, {"action": fault})
        create(name, provider, seconds)
        wait_for(lambda: _fired(farm, provider, index), timeout_s=60, what=f"{fault} create")  # noqa: B023
    # Failures, one at a time so a retry's create never meets the next armed fault. Runway's
    # failed clip is 5 s (60 credits), so its cost is unlike every other Runway attempt's.
    for name, provider, code, seconds in (
        ("runway_failed", "runway", "INTERNAL.BAD_OUTPUT", RUNWAY_FAILED_S),
        ("veo_failed", "google", "INTERNAL", DURATION_S),
    ):
        index = _arm(farm, provider, {"action": "fail_job", "code": code})
        cp.wait_terminal(create(name, provider, seconds), timeout_s=90)
        assert _fired(farm, provider, index), name
    plain = {
        "runway_ok_1": "runway",
        "runway_ok_2": "runway",
        "veo_ok": "google",
        "veo_twice": "google",
        "veo_price": "google",
        "gpu_ok": "self_hosted",
        "gpu_rate": "self_hosted",
    }
    for name, provider in plain.items():
        create(name, provider)
    tasks = {name: cp.wait_terminal(task_id, timeout_s=120) for name, task_id in created.items()}
    for name in plain:
        assert tasks[name].state == sp.TASK_STATE_SUCCEEDED, describe(tasks[name])
    for name in ("veo_unknown", "runway_unknown", *LOST_TWINS):
        unknown = tasks[name]
        assert [a.state for a in unknown.attempts] == [sp.ATTEMPT_STATE_ABANDONED], describe(
            unknown
        )
    failed_attempt = tasks["veo_failed"].attempts[0]
    assert failed_attempt.state == sp.ATTEMPT_STATE_FAILED, describe(tasks["veo_failed"])

    # The bill, falsified the way real bills go wrong.
    twice = _job_of(farm, "google", prompts["veo_twice"])["id"]
    _usage_fault(farm, "google", {"kind": "duplicate", "job_id": twice})
    priced = _job_of(farm, "google", prompts["veo_price"])["id"]
    _usage_fault(
        farm, "google", {"kind": "price", "job_id": priced, "unit_price": VEO_WRONG_PRICE_USD_PER_S}
    )
    billed_failed = _job_of(farm, "google", prompts["veo_failed"], phase="failed")
    _usage_fault(farm, "google", {"kind": "charge_failed", "job_id": billed_failed["id"]})
    _usage_fault(farm, "google", {"kind": "orphan", **ORPHAN})
    # Billed after both lost submits were sent: it fits either.
    _usage_fault(farm, "google", {"kind": "orphan", **LOST_CHARGE})
    converted = _job_of(farm, "self_hosted", prompts["gpu_rate"])["id"]
    _usage_fault(
        farm,
        "self_hosted",
        {"kind": "conversion", "job_id": converted, "micros_per_unit": GPU_WRONG_RATE},
    )

    def attempt(name: str, n: int = 0) -> int:
        return int(tasks[name].attempts[n].attempt_id)

    truth_rows = [
        ("google", "COST_AFTER_UNKNOWN", attempt("veo_unknown"), VEO_MICROS, 0),
        (
            "runway",
            "COST_AFTER_UNKNOWN",
            attempt("runway_unknown"),
            RUNWAY_MICROS_PER_CREDIT * RUNWAY_CREDITS_PER_S * RUNWAY_UNKNOWN_S,
            0,
        ),
        ("google", "DUPLICATE_CHARGE", attempt("veo_twice"), VEO_MICROS, 0),
        ("google", "FAILED_TASK_CHARGED", attempt("veo_failed"), VEO_MICROS, 0),
        ("google", "WRONG_PRICE_VERSION", attempt("veo_price"), 300_000 * DURATION_S, VEO_MICROS),
        ("google", "CHARGE_WITHOUT_LOCAL_JOB", None, 2_400_000, 0),
        ("google", "AMBIGUOUS_MATCH", None, 400_000 * LOST_S, 0),
        (
            "self_hosted",
            "WRONG_CONVERSION_RATE",
            attempt("gpu_rate"),
            GPU_SECONDS * GPU_WRONG_RATE,
            GPU_SECONDS * GPU_RATE,
        ),
    ]
    first = _reconcile_process(farm, cp, day)
    second = _reconcile(farm, cp, day)
    # A line that arrives late: the day's Google import changes, its run is superseded.
    _usage_fault(farm, "google", {"kind": "orphan", **LATE_ORPHAN})
    third = _reconcile(farm, cp, day)
    runs, delta = asyncio.run(_stored_runs(cp.database_url))
    # The Runway sidecar away: exit 2, Runway not reconciled, nothing else written or changed.
    away = ",".join(
        f"{name}=127.0.0.1:1" if name == "runway" else f"{name}={proc.address}"
        for name, proc in farm.sidecars.items()
    )
    unreachable = _reconcile(farm, cp, day, adapters=away, rc=2)
    # Two runs at once over a changed import: one new run between them, the same report.
    _usage_fault(farm, "google", {"kind": "orphan", **LATE_ORPHAN, "ref": "later-op"})
    together = _reconcile_together(farm, cp, day, n=2)
    return Scenario(
        farm, cp, day, tasks, truth_rows, first, second, third, runs, delta, unreachable, together
    )


async def _stored_runs(url: str) -> tuple[list[tuple[int, str, int | None]], dict[str, int]]:
    from sqlalchemy import text

    from controlplane.persistence.database import Database
    from controlplane.reconciliation import delta_by_provider

    db = Database.from_url(url)
    try:
        async with db.reading() as conn:
            rows = await conn.execute(
                text("SELECT id, provider, superseded_by FROM reconciliation_runs ORDER BY id")
            )
            runs = [(int(i), str(p), None if s is None else int(s)) for i, p, s in rows]
        return runs, await delta_by_provider(db)
    finally:
        await db.dispose()


@pytest.fixture(scope="module")
def scenario(
    postgres_server: PostgresServer,
    migrated_postgres_template: str,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Scenario]:
    workdir = tmp_path_factory.mktemp("reconciliation")
    with (
        module_database(
            postgres_server, "postgresql", workdir, template=migrated_postgres_template
        ) as url,
        started_platform(
            workdir,
            url,
            redis_server_url,
            time_scale=TIME_SCALE,
            extensions={"google": ["billing_export"]},
        ) as (farm, cp, _),
    ):
        cp.wait_capabilities()
        yield _run(farm, cp)


def _rows(report: dict[str, Any]) -> list[tuple[str, str, int | None, int, int]]:
    return sorted(
        (
            (d["provider"], d["kind"], d["attempt_id"], d["billed_micros"], d["expected_micros"])
            for run in report["runs"]
            for d in run["discrepancies"]
        ),
        key=repr,
    )


def test_report_rows_are_exactly_the_injected_truth(scenario: Scenario) -> None:
    """Row by row (provider, kind, attempt, billed, expected): none missed, none invented."""
    report = scenario.first
    assert report["errors"] == [], report["errors"]
    assert _rows(report) == sorted(scenario.truth_rows, key=repr), json.dumps(report, indent=1)


def test_every_account_is_reconciled_and_deltas_add_up(scenario: Scenario) -> None:
    """Each provider has a run; its billed-minus-expected equals the sum of its rows' deltas
    (every cent of difference is a row)."""
    runs = {r["provider"]: r for r in scenario.first["runs"]}
    assert set(runs) >= {"runway", "google", "self_hosted", "credit_ledger"}, sorted(runs)
    for provider in ("runway", "google", "self_hosted"):
        run = runs[provider]
        rows = run["discrepancies"]
        assert run["delta_micros"] == sum(d["delta_micros"] for d in rows), run
        assert run["record_count"] > 0, run
    # Runway's one aggregate line (gen4.5, the day) is disputed: the lost submit's credits.
    assert runs["runway"]["status_counts"] == {"disputed": 1}, runs["runway"]
    [aggregate] = runs["runway"]["discrepancies"]
    assert aggregate["evidence"]["matched_by"] == "aggregate"
    assert aggregate["evidence"]["attributed"]["state"] == "ABANDONED"
    google = runs["google"]["status_counts"]
    assert google.get("duplicate") == 1, google
    assert google.get("unmatched") == 1, google


def _unknown_row(scenario: Scenario, provider: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [
        d
        for run in scenario.first["runs"]
        for d in run["discrepancies"]
        if d["kind"] == "COST_AFTER_UNKNOWN" and d["provider"] == provider
    ]
    [row] = rows
    return row


def test_unknown_submit_cost_links_back_to_the_abandoned_attempt(scenario: Scenario) -> None:
    """The ABANDONED attempt's job, billed under an id the platform never learned, is tied to
    that attempt (9.17.5) with the evidence of how, and is never adopted as its job."""
    row = _unknown_row(scenario, "google")
    task = scenario.tasks["veo_unknown"]
    assert row["attempt_id"] == int(task.attempts[0].attempt_id)
    assert row["task_id"] == int(task.task_id)
    assert row["evidence"]["matched_by"] == "window_amount"
    assert row["evidence"]["attempt"]["state"] == "ABANDONED"
    assert "platform loss" in row["suggested_action"]
    job = _job_of(scenario.farm, "google", "veo_unknown")
    assert row["provider_job_id"] == job["id"]
    assert not scenario.cp.get_task(task.task_id).attempts[0].provider_job.provider_job_id


def test_a_charge_two_lost_submits_fit_alike_lists_both(scenario: Scenario) -> None:
    """An 8 s operation billed under an id we never learned fits both 8 s lost submits
    (model, window, amount): the row names no attempt, lists both as candidates, and neither
    attempt adopts the job."""
    lost = {int(scenario.tasks[n].attempts[0].attempt_id) for n in LOST_TWINS}
    [row] = [
        d
        for run in scenario.first["runs"]
        for d in run["discrepancies"]
        if d["kind"] == "AMBIGUOUS_MATCH"
    ]
    assert row["attempt_id"] is None
    assert row["provider_job_id"] == LOST_CHARGE["ref"]
    assert row["evidence"]["matched_by"] == "window_amount"
    assert {c["attempt_id"] for c in row["evidence"]["candidates"]} == lost
    for name in LOST_TWINS:
        task = scenario.cp.get_task(scenario.tasks[name].task_id)
        assert not task.attempts[0].provider_job.provider_job_id


def test_runway_daily_total_pins_the_lost_submit_only_by_its_unique_cost(
    scenario: Scenario,
) -> None:
    """Runway's total names no job: the gen4.5 day is billed 36 credits more than the local
    successes, exactly the ABANDONED 3 s attempt's estimate and no other attempt's, so the row
    names that attempt, records no job id, and says it was attributed from the aggregate."""
    row = _unknown_row(scenario, "runway")
    task = scenario.tasks["runway_unknown"]
    assert row["attempt_id"] == int(task.attempts[0].attempt_id)
    assert row["provider_job_id"] == ""
    evidence = row["evidence"]
    assert evidence["matched_by"] == "aggregate"
    assert evidence["attributed"]["attempt_id"] == row["attempt_id"]
    credits = RUNWAY_CREDITS_PER_S * RUNWAY_UNKNOWN_S
    assert evidence["billed_milliunits"] - evidence["expected_milliunits"] == credits * 1000
    assert not scenario.cp.get_task(task.task_id).attempts[0].provider_job.provider_job_id


def test_running_the_same_day_again_changes_nothing(scenario: Scenario) -> None:
    """The second run writes no run and no row, and reports exactly the same."""
    first, second = scenario.first, scenario.second
    assert first["written_runs"], "the first run wrote nothing"
    assert second["written_runs"] == []
    strip = {k: v for k, v in first.items() if k != "written_runs"}
    assert {k: v for k, v in second.items() if k != "written_runs"} == strip


def test_a_changed_import_supersedes_the_run_visibly(scenario: Scenario) -> None:
    """A late line changes only Google's import: one new run with one more row, the old run
    kept and pointing at it; the other providers' runs are untouched."""
    first = {r["provider"]: r for r in scenario.first["runs"]}
    third = {r["provider"]: r for r in scenario.third["runs"]}
    assert scenario.third["written_runs"] == [third["google"]["run_id"]]
    assert third["google"]["run_id"] != first["google"]["run_id"]
    late = [
        d
        for d in third["google"]["discrepancies"]
        if d["kind"] == "CHARGE_WITHOUT_LOCAL_JOB" and d["billed_micros"] == 800_000
    ]
    assert len(late) == 1, third["google"]["discrepancies"]
    assert len(third["google"]["discrepancies"]) == len(first["google"]["discrepancies"]) + 1
    for provider in ("runway", "self_hosted", "credit_ledger"):
        assert third[provider] == first[provider]
    superseded = {i: s for i, _, s in scenario.runs}
    assert superseded[first["google"]["run_id"]] == third["google"]["run_id"]
    assert superseded[third["google"]["run_id"]] is None
    assert scenario.delta["google"] == third["google"]["delta_micros"]
    assert scenario.delta["runway"] == third["runway"]["delta_micros"] == 360_000


def test_a_sidecar_away_is_reported_not_taken_for_an_empty_bill(scenario: Scenario) -> None:
    """ListUsage failing is an error of that account (exit 2), never "billed nothing": no run is
    written, and the report still shows the last good runs of every account."""
    report = scenario.unreachable
    assert [(e["provider"], e["error_class"]) for e in report["errors"]] == [
        ("runway", "UNAVAILABLE")
    ]
    assert report["written_runs"] == []
    assert report["runs"] == scenario.third["runs"]


def test_concurrent_runs_write_one_run_and_agree(scenario: Scenario) -> None:
    """Two reconcile processes at once over a changed Google import: exactly one new run is
    written between them (the partial unique index plus a retry), and both print it."""
    a, b = scenario.together
    written = a["written_runs"] + b["written_runs"]
    assert len(written) == 1, (a["written_runs"], b["written_runs"])
    strip = [{k: v for k, v in r.items() if k != "written_runs"} for r in (a, b)]
    assert strip[0] == strip[1]
    google = {r["provider"]: r for r in a["runs"]}["google"]
    assert google["run_id"] == written[0]
