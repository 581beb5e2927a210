"""A bill a finance team can sign (issue 23 items 1-3) through the real stack.

Runway and the self-hosted cluster behind the shipped sidecars, a control plane on PostgreSQL
with Redis leases, every duration times one factor; their real bill formats (Runway's daily
credits per model, the cluster's GPU-second rows) as the emulators serve them. The day:

* Runway: a gen4.5 success (48 credits), a veo3.1 success (4 s, 80 credits) and a gen4.5 5 s
  job that fails (refunded: Runway's rule);
* the cluster: two successes (42 GPU s each) and two jobs that fail after running (21 GPU s,
  7,350 micros each, billed: the cluster's rule).

Unaltered, ``vidroute reconcile`` (a process) finds nothing: exit 0, no row, a zero delta per
provider; the later runs call the same command in the test's process.
Then the bills are altered one way at a time; after the cluster's four and after Runway's two,
the report is exactly the rows of the alterations so far (kind, provider, attempt, billed,
expected): each named with its attempt, nothing else invented, exit 1. Then two facts change
what Runway's daily total can say, and the report follows exactly:

* a price version of veo3.1 at 25 credits/s is published (scheduled a month ahead, as a price
  change announced by the provider): the 100 credits of the day's veo3.1 job are now exactly
  that version's, so the row becomes WRONG_PRICE_VERSION naming it;
* a second gen4.5 4 s clip runs (48 credits, as the one billed twice): the extra 48 credits
  fit either clip, so the difference is AGGREGATE_MISMATCH listing the candidates, never
  pinned on a guess.

Finally the exit code 2 of an account nobody serves, adapters keyed as ``make up`` keys them
still read, and a tenant settled twice (the one kind no bill can carry) refused by PostgreSQL
itself.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from controlplane.capabilities.publish import documents_from_file
from controlplane.persistence.database import Database
from controlplane.persistence.models import credit_ledger
from tests.conftest import PostgresServer
from tests.e2e.test_reconciliation_scenario import (
    _reconcile,
    _reconcile_process,
    _rows,
    _usage_fault,
)
from tests.support.module_stack import module_database, started_platform
from tests.support.stack import ControlPlane, ProviderFarm, describe, wait_for
from tests.support.workload import SUBMIT_ROUTE
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(600)]

TIME_SCALE = 0.02
MICROS_PER_CREDIT, GPU_RATE = 10_000, 350
GPU_FULL, GPU_HALF = 42, 21  # a 4 s job: 10 + 8 x 4 GPU s; a failed one ran half of it
Row = tuple[str, str, int | None, int, int]  # provider, kind, attempt, billed, expected
ROOT = Path(__file__).resolve().parents[2]
RUNWAY_FILE = ROOT / "adapter_sidecars/runway/capabilities/runway-2026-06.yaml"
#: The veo3.1 price version the provider bills early: 25 credits (USD 0.25) per output second.
ANNOUNCED_PRICE = "runway-2027-01"


@dataclass
class Day:
    farm: ProviderFarm
    cp: ControlPlane
    day: str
    attempts: dict[str, int]
    jobs: dict[str, str]
    clean: dict[str, Any]
    steps: list[tuple[str, list[Row], dict[str, Any]]] = field(default_factory=list)
    unserved: dict[str, Any] = field(default_factory=dict)
    rekeyed: dict[str, Any] = field(default_factory=dict)
    task_ids: dict[str, int] = field(default_factory=dict)
    gen45_attempts: set[int] = field(default_factory=set)
    announced: api.PublishCapabilitiesResponse | None = None


def _fail_next_create(farm: ProviderFarm, provider: str, code: str) -> None:
    emulator = farm.emulator(provider)
    emulator.add_faults(
        {"route": SUBMIT_ROUTE[provider], "nth": 1, "action": "fail_job", "code": code}
    )


def _announce_price(cp: ControlPlane) -> api.PublishCapabilitiesResponse:
    """Publish veo3.1 at `ANNOUNCED_PRICE` (25 credits/s), in effect a month from now: the
    price book knows the version, routing and reservations do not use it yet."""
    [veo] = [d for d in documents_from_file(RUNWAY_FILE) if d["model"] == "veo3.1"]
    veo["version"], veo["capability_version"] = "2027-01-01", "runway/veo3.1/2027-01-01"
    veo["commercial"].update(
        price_version=ANNOUNCED_PRICE,
        price_micros_per_output_second=250_000,
        price_micros_per_output_second_with_audio=500_000,
        provider_milliunits_per_output_second=25_000,
        provider_milliunits_per_output_second_with_audio=50_000,
    )
    at = Timestamp()
    at.FromDatetime(datetime.now(UTC) + timedelta(days=30))
    request = api.PublishCapabilitiesRequest(
        document=yaml.safe_dump(veo, sort_keys=False), source="e2e", activate_at=at
    )
    until = time.monotonic() + 90
    while True:  # as a client does: UNAVAILABLE (a sample compile timed out) is retried
        try:
            reply: api.PublishCapabilitiesResponse = cp._call(
                lambda s: s.PublishCapabilities(request, timeout=120)
            )
            return reply
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > until:
                raise


def _run(farm: ProviderFarm, cp: ControlPlane) -> Day:
    wait_for(
        lambda: datetime.now(UTC).strftime("%H:%M") < "23:55",
        timeout_s=400,
        interval_s=5,
        what="not within 5 minutes of midnight UTC",
    )
    day = datetime.now(UTC).date().isoformat()
    tag = secrets.token_hex(3)
    tasks: dict[str, sp.Task] = {}
    prompts: dict[str, str] = {}

    def create(name: str, provider: str, *, seconds: int = 4, model: str = "") -> str:
        prompts[name] = f"bill {name} {tag} a red kite over a green hill"
        return cp.create_task(provider, prompt=prompts[name], duration_s=seconds, model=model)

    def run(name: str, provider: str, *, seconds: int = 4, model: str = "", fail: str = "") -> None:
        if fail:
            _fail_next_create(farm, provider, fail)
        task_id = create(name, provider, seconds=seconds, model=model)
        tasks[name] = cp.wait_terminal(task_id, timeout_s=120)

    # The failures one at a time: an armed failure meets exactly its own create (a retry's
    # create comes before the next is armed). Then the successes, no fault armed, all at once.
    run("rw_failed", "runway", seconds=5, fail="INTERNAL.BAD_OUTPUT")
    run("gpu_failed_1", "self_hosted", fail="INVALID_INPUT")
    run("gpu_failed_2", "self_hosted", fail="INVALID_INPUT")
    created = {
        "rw_gen45": create("rw_gen45", "runway"),
        "rw_veo31": create("rw_veo31", "runway", model="veo3.1"),
        "gpu_ok_1": create("gpu_ok_1", "self_hosted"),
        "gpu_ok_2": create("gpu_ok_2", "self_hosted"),
    }
    tasks.update({name: cp.wait_terminal(task_id, 120) for name, task_id in created.items()})
    attempts: dict[str, int] = {}
    for name, task in tasks.items():
        want = sp.ATTEMPT_STATE_FAILED if "failed" in name else sp.ATTEMPT_STATE_SUCCEEDED
        found = [a for a in task.attempts if a.state == want]
        assert len(found) == 1, describe(task)
        attempts[name] = int(found[0].attempt_id)
    jobs = {
        name: next(
            j["id"]
            for j in farm.truth("runway" if name.startswith("rw") else "self_hosted")
            if prompts[name] in json.dumps(j.get("body", {}))
        )
        for name in tasks
    }
    clean = _reconcile_process(farm, cp, day, rc=0)
    result = Day(farm, cp, day, attempts, jobs, clean)
    a = attempts
    gpu = GPU_FULL * GPU_RATE
    alterations: list[tuple[str, str, dict[str, Any], Row]] = [
        (
            "a failed job billed all its GPU seconds, not the ones it ran",
            "self_hosted",
            {"kind": "charge_failed", "job_id": jobs["gpu_failed_1"]},
            ("self_hosted", "AMOUNT_MISMATCH", a["gpu_failed_1"], gpu, GPU_HALF * GPU_RATE),
        ),
        (
            "a success's GPU seconds turned into money at another rate",
            "self_hosted",
            {"kind": "conversion", "job_id": jobs["gpu_ok_1"], "micros_per_unit": 500},
            ("self_hosted", "WRONG_CONVERSION_RATE", a["gpu_ok_1"], GPU_FULL * 500, gpu),
        ),
        (
            "a success billed twice",
            "self_hosted",
            {"kind": "duplicate", "job_id": jobs["gpu_ok_2"]},
            ("self_hosted", "DUPLICATE_CHARGE", a["gpu_ok_2"], gpu, 0),
        ),
        (
            "a charge for a job nobody made",
            "self_hosted",
            {"kind": "orphan", "model": "wan2.2-t2v", "seconds": 10, "ref": f"ghost-{tag}"},
            ("self_hosted", "CHARGE_WITHOUT_LOCAL_JOB", None, 10 * GPU_RATE, 0),
        ),
        (
            "the day's only veo3.1 job billed 100 credits, not 80 (no version gives 100)",
            "runway",
            {"kind": "price", "job_id": jobs["rw_veo31"], "unit_price": 25},
            (
                "runway",
                "AMOUNT_MISMATCH",
                a["rw_veo31"],
                100 * MICROS_PER_CREDIT,
                80 * MICROS_PER_CREDIT,
            ),
        ),
        (
            "the gen4.5 success's credits twice in the day's total",
            "runway",
            {"kind": "duplicate", "job_id": jobs["rw_gen45"]},
            ("runway", "DUPLICATE_CHARGE", a["rw_gen45"], 48 * MICROS_PER_CREDIT, 0),
        ),
    ]
    # Read after the cluster's four (per-job bills) and after Runway's two (a daily total): two
    # runs instead of six, each report still exactly its rows. The runs after the clean one
    # call the command in this process (`_reconcile`): the same entry point and environment.
    truth: list[Row] = []
    for i, (what, provider, fault, row) in enumerate(alterations):
        _usage_fault(farm, provider, fault)
        truth.append(row)
        if i + 1 in (4, len(alterations)):
            result.steps.append((what, sorted(truth, key=repr), _reconcile(farm, cp, day, rc=1)))
    # What Runway's daily total is read against changes, the bill does not (module doc).
    result.announced = _announce_price(cp)
    run("rw_gen45_b", "runway")
    [again] = [x for x in tasks["rw_gen45_b"].attempts if x.state == sp.ATTEMPT_STATE_SUCCEEDED]
    a["rw_gen45_b"] = int(again.attempt_id)
    result.task_ids = {name: int(task.task_id) for name, task in tasks.items()}
    mpc = MICROS_PER_CREDIT
    # The failed 5 s task's retry (if it ran) is the day's other gen4.5 charge: 60 credits.
    retried = sum(x.state == sp.ATTEMPT_STATE_SUCCEEDED for x in tasks["rw_failed"].attempts)
    gen45 = (2 * 48 + retried * 60) * mpc
    result.gen45_attempts = {
        int(x.attempt_id)
        for n in ("rw_failed", "rw_gen45", "rw_gen45_b")
        for x in tasks[n].attempts
    }
    later: dict[Row, Row] = {
        ("runway", "AMOUNT_MISMATCH", a["rw_veo31"], 100 * mpc, 80 * mpc): (
            ("runway", "WRONG_PRICE_VERSION", a["rw_veo31"], 100 * mpc, 80 * mpc)
        ),
        ("runway", "DUPLICATE_CHARGE", a["rw_gen45"], 48 * mpc, 0): (
            ("runway", "AGGREGATE_MISMATCH", None, gen45 + 48 * mpc, gen45)
        ),
    }
    truth = [later.get(r, r) for r in truth]
    result.steps.append(
        (
            "a price version published, an identical gen4.5 clip",
            sorted(truth, key=repr),
            _reconcile(farm, cp, day, rc=1),
        )
    )
    only_runway = f"runway={farm.sidecars['runway'].address}"
    result.unserved = _reconcile(farm, cp, day, adapters=only_runway, rc=2)
    rekeyed = (
        f"rw={farm.sidecars['runway'].address},selfhosted={farm.sidecars['self_hosted'].address}"
    )
    result.rekeyed = _reconcile(farm, cp, day, adapters=rekeyed, rc=1)
    return result


@pytest.fixture(scope="module")
def bill_day(
    postgres_server: PostgresServer,
    migrated_postgres_template: str,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Day]:
    workdir = tmp_path_factory.mktemp("bill-rules")
    with (
        module_database(
            postgres_server, "postgresql", workdir, template=migrated_postgres_template
        ) as url,
        started_platform(
            workdir,
            url,
            redis_server_url,
            time_scale=TIME_SCALE,
            providers=["runway", "self_hosted"],
        ) as (farm, cp, _),
    ):
        cp.wait_capabilities()
        yield _run(farm, cp)


def test_the_unaltered_bills_are_clean_with_a_zero_delta(bill_day: Day) -> None:
    """Runway's refunded failure and the cluster's billed failures are their rules, not
    discrepancies: no row, every provider's billed equals expected, exit 0."""
    report = bill_day.clean
    assert report["errors"] == [], report
    assert report["exit_code"] == 0, report
    assert _rows(report) == []
    runs = {r["provider"]: r for r in report["runs"]}
    assert set(runs) == {"runway", "self_hosted", "credit_ledger"}
    for provider in ("runway", "self_hosted"):
        run = runs[provider]
        assert run["record_count"] > 0, run
        assert run["delta_micros"] == 0, run
        assert run["billed_micros"] == run["expected_micros"], run
    # The cluster's bill includes both failed jobs' 21 GPU s each: 7,350 micros apiece.
    assert runs["self_hosted"]["billed_micros"] == 2 * GPU_FULL * GPU_RATE + 2 * GPU_HALF * GPU_RATE


def test_each_alteration_is_found_with_its_kind_and_attempt_and_nothing_else(
    bill_day: Day,
) -> None:
    """After the cluster's alterations and after all of them the rows are exactly the
    alterations so far, row for row, and each run's delta is the sum of its rows' deltas."""
    for what, truth, report in bill_day.steps:
        assert report["errors"] == [], (what, report["errors"])
        assert _rows(report) == truth, (what, json.dumps(report, indent=1))
        for run in report["runs"]:
            assert run["delta_micros"] == sum(d["delta_micros"] for d in run["discrepancies"]), (
                what,
                run,
            )


def _veo31_row(report: dict[str, Any]) -> dict[str, Any]:
    rows = [d for run in report["runs"] for d in run["discrepancies"] if d["model"] == "veo3.1"]
    [row] = rows
    return dict(row)


def test_the_runway_price_error_names_its_attempt_from_the_daily_total(bill_day: Day) -> None:
    """Runway's total names no job, yet the veo3.1 difference is pinned on the day's one
    veo3.1 attempt, with the aggregate's figures as evidence: AMOUNT_MISMATCH while no
    published version gives 100 credits, WRONG_PRICE_VERSION naming the version once one does."""
    [(_, _, before), (_, _, after)] = bill_day.steps[1:]
    for report in (before, after):
        row = _veo31_row(report)
        assert row["evidence"]["matched_by"] == "aggregate"
        assert row["evidence"]["attributed"]["attempt_id"] == bill_day.attempts["rw_veo31"]
        assert row["evidence"]["billed_milliunits"] - row["evidence"]["expected_milliunits"] == (
            20_000
        )
    assert _veo31_row(before)["kind"] == "AMOUNT_MISMATCH"
    assert "billed_price_version" not in _veo31_row(before)["evidence"]
    assert _veo31_row(after)["kind"] == "WRONG_PRICE_VERSION"
    assert _veo31_row(after)["evidence"]["billed_price_version"] == ANNOUNCED_PRICE
    assert bill_day.announced is not None
    assert bill_day.announced.state == "SCHEDULED"


def test_an_ambiguous_runway_difference_lists_its_candidates(bill_day: Day) -> None:
    """Two identical gen4.5 clips and 48 credits too many in the day's total: either could be
    the one billed twice, so the row names no attempt and lists every gen4.5 attempt of the
    day as a candidate (the failed one and its retry too: a wrong bill could charge any)."""
    *_, last = bill_day.steps[-1]
    [row] = [d for run in last["runs"] for d in run["discrepancies"] if d["model"] == "gen4.5"]
    assert row["kind"] == "AGGREGATE_MISMATCH"
    assert row["attempt_id"] is None
    a = bill_day.attempts
    candidates = {c["attempt_id"] for c in row["evidence"]["candidates"]}
    assert candidates == bill_day.gen45_attempts
    assert {a["rw_gen45"], a["rw_gen45_b"], a["rw_failed"]} <= candidates
    assert row["evidence"]["billed_milliunits"] - row["evidence"]["expected_milliunits"] == 48_000


def test_an_account_nobody_serves_exits_2_and_rekeyed_adapters_are_read(bill_day: Day) -> None:
    """Without the cluster's sidecar its account is NOT RECONCILED (exit 2, not a short
    clean report); adapters keyed ``rw`` / ``selfhosted`` still serve runway / self_hosted
    because their Describe names the accounts."""
    errors = [(e["provider"], e["error_class"]) for e in bill_day.unserved["errors"]]
    assert errors == [("self_hosted", "NO_ADAPTER")]
    assert bill_day.unserved["exit_code"] == 2
    assert bill_day.rekeyed["errors"] == []
    *_, last = bill_day.steps[-1]
    assert _rows(bill_day.rekeyed) == _rows(last)


def test_a_tenant_settled_twice_is_refused_by_postgresql(bill_day: Day) -> None:
    """USER_SETTLED_TWICE is the one kind no bill carries: a second settlement of a settled
    task, written straight into the stack's PostgreSQL, is refused by the one-settlement index,
    and every tenant-side run of the day reported no row."""
    task_id = bill_day.task_ids["rw_gen45"]

    async def second_charge() -> None:
        db = Database.from_url(bill_day.cp.database_url)
        try:
            async with db.reading() as conn:
                query = select(credit_ledger).where(
                    credit_ledger.c.task_id == task_id, credit_ledger.c.kind == "CHARGE"
                )
                first = dict((await conn.execute(query)).mappings().one())
            again = {k: v for k, v in first.items() if k not in ("id", "created_at")}
            again["idempotency_key"] = f"{first['idempotency_key']}:again"
            with pytest.raises(IntegrityError, match="uq_credit_ledger_one_settlement"):
                async with db.engine.begin() as conn:
                    await conn.execute(insert(credit_ledger).values(**again))
        finally:
            await db.dispose()

    asyncio.run(second_charge())
    for _, _, report in bill_day.steps:
        [tenant_side] = [r for r in report["runs"] if r["provider"] == "credit_ledger"]
        assert tenant_side["discrepancies"] == [], tenant_side
