"""Veo's bill is Google's Cloud Billing export, imported with ``vidroute usage import`` (issue 23:
a bill for every provider).

Veo behind the shipped Gemini sidecar (no usage API: ListUsage is UNSUPPORTED_CAPABILITY), a
control plane on PostgreSQL with Redis leases, every duration times one factor. The day: two
veo-3.1 successes, a veo-3.1-fast success and a veo-3.1 job that fails (Google bills no failed
generation). Google's billing pipeline is played by `_gemini_rows` / `_vertex_rows`: from what
the emulator really ran, the rows of the standard usage cost export (nested, newline-delimited
JSON as BigQuery writes it), at the shipped list prices:

* before any import the day is NOT RECONCILED (exit 2), as before;
* the Gemini API's rows (no labels: hourly per SKU) imported unaltered: exit 0, no row, a zero
  delta; the fast model-day's cost altered: WRONG_PRICE_VERSION on the fast attempt, alone;
* the same jobs billed as Vertex bills them (one row per request, labelled with the attempt's
  client request key): exit 0, then the failed job billed: FAILED_TASK_CHARGED on that attempt;
  then one success's row missing and a row labelled with a request nobody made:
  LOCAL_SUCCESS_WITHOUT_CHARGE on that success and CHARGE_WITHOUT_LOCAL_JOB, nothing else.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from controlplane.domain.reconciliation_cloud_billing import ATTEMPT_LABEL
from tests.conftest import PostgresServer
from tests.e2e.test_reconciliation_scenario import (
    _cli_here,
    _reconcile,
    _reconcile_process,
    _rows,
)
from tests.support.module_stack import module_database, started_platform
from tests.support.stack import ControlPlane, ProviderFarm, describe, wait_for
from tests.support.workload import SUBMIT_ROUTE
from vidroute.scheduler.v1 import scheduler_pb2 as sp

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(900)]

TIME_SCALE = 0.02
STANDARD, FAST = "veo-3.1-generate-preview", "veo-3.1-fast-generate-preview"
# The shipped list prices (adapter_sidecars/veo/capabilities/veo-2026-06.yaml), USD per second.
USD_PER_S = {STANDARD: Decimal("0.40"), FAST: Decimal("0.15")}
SKU = {STANDARD: "Veo 3.1 Video Generation", FAST: "Veo 3.1 Fast Video Generation"}
WRONG_FAST_USD_PER_S = Decimal("0.20")
Row = tuple[str, str, int | None, int, int]


@dataclass
class Day:
    day: str
    attempts: dict[str, int]
    keys: dict[str, str]
    before: dict[str, Any]
    imported: dict[str, Any]
    clean: dict[str, Any]
    repriced: dict[str, Any]
    vertex_clean: dict[str, Any]
    vertex_failed_billed: dict[str, Any]
    vertex_altered: dict[str, Any]
    billed_micros: int


def _model_of(job: dict[str, Any]) -> str:
    found = re.search(r"models/([^:/]+)", job["route"])
    assert found, job
    return found.group(1)


def _billed_jobs(farm: ProviderFarm) -> list[dict[str, Any]]:
    """The operations Google bills: the succeeded ones (blocked and failed are free)."""
    return [j for j in farm.truth("google") if j["phase"] == "succeeded"]


def _seconds(job: dict[str, Any]) -> Decimal:
    params = job["body"].get("parameters") or {}
    return Decimal(str(params.get("durationSeconds"))) * int(params.get("sampleCount") or 1)


def _row(  # noqa: PLR0917 - one row's columns, in the export's order
    service: str, sku: str, hour: datetime, seconds: Decimal, cost: Decimal, labels: list[Any]
) -> dict[str, Any]:
    start = hour.replace(minute=0, second=0, microsecond=0)
    return {
        "billing_account_id": "01ABCD-234567-89EF01",
        "service": {"id": "E2E-SVC", "description": service},
        "sku": {"id": "E2E-SKU", "description": sku},
        "usage_start_time": start.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "usage_end_time": start.replace(minute=59, second=59).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "project": {"id": "vidroute-e2e"},
        "labels": labels,
        "cost": str(cost),
        "currency": "USD",
        "usage": {"amount": str(seconds), "unit": "seconds"},
        "credits": [],
        "cost_type": "regular",
    }


def _finished(job: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(job["finished_at"].replace("Z", "+00:00")).astimezone(UTC)


def _gemini_rows(farm: ProviderFarm, price: dict[str, Decimal]) -> list[dict[str, Any]]:
    """The Gemini API's export: no labels, one row per (SKU, hour), plus a storage row."""
    hours: dict[tuple[str, datetime], Decimal] = defaultdict(Decimal)
    for job in _billed_jobs(farm):
        hour = _finished(job).replace(minute=0, second=0, microsecond=0)
        hours[(_model_of(job), hour)] += _seconds(job)
    rows = [
        _row("Generative Language API", SKU[model], hour, s, s * price[model], [])
        for (model, hour), s in sorted(hours.items())
    ]
    first = min(h for _, h in hours)
    rows.append(
        _row("Cloud Storage", "Standard Storage US", first, Decimal(3), Decimal("0.01"), [])
    )
    return rows


def _vertex_rows(farm: ProviderFarm, keys: dict[str, str], also: list[str]) -> list[Any]:
    """Vertex's export: one row per request, labelled with our attempt (`also`: operation ids
    of jobs Google wrongly bills besides the succeeded ones)."""
    by_op = {op: key for key, op in keys.items()}
    jobs = _billed_jobs(farm) + [j for j in farm.truth("google") if j["id"] in also]
    rows = []
    for job in jobs:
        label = [{"key": ATTEMPT_LABEL, "value": by_op[job["id"]]}]
        s = _seconds(job)
        model = _model_of(job)
        rows.append(_row("Vertex AI", SKU[model], _finished(job), s, s * USD_PER_S[model], label))
    return rows


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _import_env(cp: ControlPlane) -> dict[str, str]:
    return {"VIDROUTE_DATABASE_URL": cp.database_url, "VIDROUTE_LOG_LEVEL": "WARNING"}


def _import(cp: ControlPlane, path: Path) -> dict[str, Any]:
    """``vidroute usage import PATH --json`` in this process (`_cli_here`)."""
    return _cli_here(_import_env(cp), ["usage", "import", str(path), "--json"], rc=0)


def _import_process(cp: ControlPlane, path: Path) -> dict[str, Any]:
    """One ``vidroute usage import`` process, as a finance team runs it."""
    env = {**os.environ, **_import_env(cp)}
    proc = subprocess.run(
        [sys.executable, "-m", "clients.cli", "usage", "import", str(path), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # a process start and an import on a loaded 2-core host
        check=False,
    )
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return dict(json.loads(proc.stdout))


def _run(farm: ProviderFarm, cp: ControlPlane, workdir: Path) -> Day:
    wait_for(
        lambda: datetime.now(UTC).strftime("%H:%M") < "23:55",
        timeout_s=400,
        interval_s=5,
        what="not within 5 minutes of midnight UTC",
    )
    day = datetime.now(UTC).date().isoformat()
    tag = secrets.token_hex(3)
    tasks: dict[str, sp.Task] = {}

    def create(name: str, model: str = STANDARD) -> str:
        prompt = f"cloud bill {name} {tag} a red kite over a green hill"
        return cp.create_task("google", prompt=prompt, model=model)

    # The failure alone first, so its armed fault meets exactly its own create.
    farm.emulator("google").add_faults(
        {"route": SUBMIT_ROUTE["google"], "nth": 1, "action": "fail_job", "code": "INTERNAL"}
    )
    tasks["failed"] = cp.wait_terminal(create("failed"), 120)
    created = {
        name: create(name, model)
        for name, model in (("ok_1", STANDARD), ("ok_2", STANDARD), ("fast", FAST))
    }
    tasks.update({name: cp.wait_terminal(task_id, 120) for name, task_id in created.items()})
    attempts: dict[str, int] = {}
    keys: dict[str, str] = {}
    ops: dict[str, str] = {}
    for name, task in tasks.items():
        want = sp.ATTEMPT_STATE_FAILED if name == "failed" else sp.ATTEMPT_STATE_SUCCEEDED
        found = [a for a in task.attempts if a.state == want]
        assert len(found) == 1, describe(task)
        attempts[name] = int(found[0].attempt_id)
        ops[name] = found[0].provider_job.provider_job_id
        keys.update({a.client_request_key: a.provider_job.provider_job_id for a in task.attempts})
    billed = sum(int(_seconds(j) * USD_PER_S[_model_of(j)] * 1_000_000) for j in _billed_jobs(farm))
    # The first reconcile and the first import are processes, as operators run them; the
    # later ones call the same commands in this process (the same entry point, environment
    # and report, without a Python start each).
    before = _reconcile_process(farm, cp, day, rc=2)
    imported = _import_process(cp, _write(workdir / "gemini.json", _gemini_rows(farm, USD_PER_S)))
    clean = _reconcile(farm, cp, day, rc=0)
    wrong = {**USD_PER_S, FAST: WRONG_FAST_USD_PER_S}
    _import(cp, _write(workdir / "gemini-repriced.json", _gemini_rows(farm, wrong)))
    repriced = _reconcile(farm, cp, day, rc=1)
    _import(cp, _write(workdir / "vertex.json", _vertex_rows(farm, keys, [])))
    vertex_clean = _reconcile(farm, cp, day, rc=0)
    _import(cp, _write(workdir / "vertex-failed.json", _vertex_rows(farm, keys, [ops["failed"]])))
    vertex_failed = _reconcile(farm, cp, day, rc=1)
    # ok_2's row lost by Google's pipeline, and a row labelled with a request nobody made.
    key_of = {op: key for key, op in keys.items()}
    kept = [
        r for r in _vertex_rows(farm, keys, []) if r["labels"][0]["value"] != key_of[ops["ok_2"]]
    ]
    ok_1 = next(j for j in _billed_jobs(farm) if j["id"] == ops["ok_1"])
    foreign = [{"key": ATTEMPT_LABEL, "value": f"foreign-{tag}"}]
    seconds = Decimal(4)
    kept.append(
        _row(
            "Vertex AI",
            SKU[STANDARD],
            _finished(ok_1),
            seconds,
            seconds * USD_PER_S[STANDARD],
            foreign,
        )
    )
    _import(cp, _write(workdir / "vertex-altered.json", kept))
    vertex_altered = _reconcile(farm, cp, day, rc=1)
    return Day(
        day,
        attempts,
        keys,
        before,
        imported,
        clean,
        repriced,
        vertex_clean,
        vertex_failed,
        vertex_altered,
        billed,
    )


@pytest.fixture(scope="module")
def veo_day(
    postgres_server: PostgresServer,
    migrated_postgres_template: str,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Day]:
    workdir = tmp_path_factory.mktemp("veo-bill")
    with (
        module_database(
            postgres_server, "postgresql", workdir, template=migrated_postgres_template
        ) as url,
        started_platform(
            workdir, url, redis_server_url, time_scale=TIME_SCALE, providers=["google"]
        ) as (farm, cp, _),
    ):
        cp.wait_capabilities()
        yield _run(farm, cp, workdir)


def _google_run(report: dict[str, Any]) -> dict[str, Any]:
    [run] = [r for r in report["runs"] if r["provider"] == "google"]
    return dict(run)


def test_without_an_imported_bill_veo_is_not_reconciled(veo_day: Day) -> None:
    """The Gemini API has no usage export: before an import the day exits 2, saying so."""
    errors = [(e["provider"], e["error_class"]) for e in veo_day.before["errors"]]
    assert errors == [("google", "UNSUPPORTED_CAPABILITY")]
    assert "vidroute usage import" in veo_day.before["errors"][0]["message"]


def test_the_import_counts_our_rows_and_leaves_other_skus_aside(veo_day: Day) -> None:
    """Three succeeded operations' rows are ours (by SKU); the storage row is left aside."""
    got = veo_day.imported
    assert got["created"] is True
    assert got["covers_from"] == got["covers_to"] == veo_day.day
    assert got["other_skus"] == {"Standard Storage US": 1}
    assert got["labelled"] == 0
    assert got["cost_micros"] == veo_day.billed_micros >= 2 * 1_600_000 + 600_000


def test_the_unaltered_gemini_export_is_clean_with_a_zero_delta(veo_day: Day) -> None:
    """Fed unaltered: exit 0, no row, billed equals expected (the failed job is free)."""
    report = veo_day.clean
    assert report["errors"] == [], report
    assert report["exit_code"] == 0, report
    assert _rows(report) == []
    run = _google_run(report)
    assert run["delta_micros"] == 0
    assert run["billed_micros"] == run["expected_micros"] == veo_day.billed_micros


def test_a_repriced_model_day_names_the_attempt(veo_day: Day) -> None:
    """The fast model-day billed at 0.20/s instead of 0.15/s, the same seconds: one row,
    WRONG_PRICE_VERSION on the fast attempt, nothing else."""
    a = veo_day.attempts
    truth: list[Row] = [("google", "WRONG_PRICE_VERSION", a["fast"], 800_000, 600_000)]
    assert _rows(veo_day.repriced) == truth, json.dumps(veo_day.repriced, indent=1)


def test_labelled_vertex_rows_attribute_per_job(veo_day: Day) -> None:
    """Rows labelled with our attempts: clean unaltered; the failed job billed is
    FAILED_TASK_CHARGED on exactly that attempt, matched by its client request key."""
    assert veo_day.vertex_clean["exit_code"] == 0
    assert _rows(veo_day.vertex_clean) == []
    a = veo_day.attempts
    truth: list[Row] = [("google", "FAILED_TASK_CHARGED", a["failed"], 1_600_000, 0)]
    report = veo_day.vertex_failed_billed
    assert _rows(report) == truth, json.dumps(report, indent=1)
    [row] = _google_run(report)["discrepancies"]
    assert row["evidence"]["matched_by"] == "client_request_key"


def test_a_missing_vertex_row_and_a_foreign_one_are_named(veo_day: Day) -> None:
    """One success's row missing: LOCAL_SUCCESS_WITHOUT_CHARGE on that attempt; a row labelled
    with a request we never sent: CHARGE_WITHOUT_LOCAL_JOB with no attempt; nothing else."""
    a = veo_day.attempts
    truth: list[Row] = sorted(
        [
            ("google", "LOCAL_SUCCESS_WITHOUT_CHARGE", a["ok_2"], 0, 1_600_000),
            ("google", "CHARGE_WITHOUT_LOCAL_JOB", None, 1_600_000, 0),
        ],
        key=repr,
    )
    report = veo_day.vertex_altered
    assert report["errors"] == [], report["errors"]
    assert _rows(report) == truth, json.dumps(report, indent=1)
    run = _google_run(report)
    assert run["delta_micros"] == sum(d["delta_micros"] for d in run["discrepancies"]) == 0
