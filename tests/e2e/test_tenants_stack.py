"""Issue 21's "Done when" for tenants, on the real stack: emulators, the shipped sidecars, a
control plane on PostgreSQL with Redis leases. Every task is created through the public API with
its tenant's own token; the tenants document is published once by the operator's
`vidroute tenants publish` (admin token), and the tests read what it does.

Contention (the entitlement and the 5:2:1 tests): every task is pinned to Veo (capacity 10 in
the shipped catalog) and created while an operator holds Veo's SUBMIT breaker open; forcing it
CLOSED lets the dispatcher meet the whole backlog at once, then only as fast as slots free up,
so the queue stays full for the whole measurement. Every tenant queues the same number of tasks
(so FIFO or equal weights would split evenly and the test can fail), more than it can get in
the window. Tasks are 8 s at 720p: 8 cost units, one quantum at weight 1, so one DRR cycle is
5+2+1 (or 1+3) dispatches. The window is the first 8 whole cycles after the release (64, or
32), in dispatch order: the tasks' first attempts by creation time and number (attempts of one
batch are numbered in the order they were picked). The rest of the backlog is cancelled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import partial
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import PostgresServer
from tests.support import sizes
from tests.support.module_stack import module_database
from tests.support.stack import ROOT, TERMINAL, wait_for
from tests.support.tenant_stack import (
    TenantPlatform,
    jain,
    percentile,
    tenant_platform,
)
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]

TIME_SCALE = 0.02
CONTENDED = "google"  # Veo: capacity 10 per account
WEIGHTS = {"gold": 5, "silver": 2, "bronze": 1}
# The first 64 dispatches are 8 whole DRR cycles of 5+2+1 tasks; 48 tasks each keep every
# tenant backlogged throughout (gold needs 40). Greedy against honest: 1+3 per cycle, 8 cycles.
WEIGHTS_WINDOW, WEIGHTS_BACKLOG = 64, 48
DISPATCH_BOUND_S = 600  # for a window to leave the queue (the tests' own timeout is above it)
ENTITLEMENT_WINDOW, ENTITLEMENT_BACKLOG = 32, 28
# The calm tenant's creates: 3 segments of 40 alone and 3 of 40 flooded (120 samples a side).
FLOOD_SEGMENTS, FLOOD_SEGMENT_CREATES = 3, 40
DOCUMENT = {
    "version": "tenants-e2e-1",
    "description": "tenants e2e: entitlement, weights, rate, regions",
    "default": {"service_classes": {"STANDARD": {"weight": 1}, "BATCH": {"weight": 1}}},
    "tenants": {
        # STANDARD only at weight 1, beside a tenant entitled to INTERACTIVE at weight 3.
        "greedy": {"service_classes": {"STANDARD": {"weight": 1}}},
        "honest": {"service_classes": {"INTERACTIVE": {"weight": 3}, "STANDARD": {"weight": 3}}},
        **{t: {"service_classes": {"STANDARD": {"weight": w}}} for t, w in WEIGHTS.items()},
        "flooder": {"create_rate": {"per_second": 2, "burst": 2}},
        "calm": {},
        "local": {"allowed_regions": ["us"]},
        "roamer": {"preferred_regions": ["asia-northeast1"]},
    },
}
TENANTS = tuple(DOCUMENT["tenants"])


@pytest.fixture(scope="module")
def platform(
    postgres_server: PostgresServer, redis_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TenantPlatform]:
    """The three providers, a control plane with one token per tenant, the document active."""
    workdir = tmp_path_factory.mktemp("tenants")
    with (
        module_database(postgres_server, "postgresql", workdir) as url,
        tenant_platform(
            workdir, url, redis_server_url, tenants=TENANTS, time_scale=TIME_SCALE
        ) as platform,
    ):
        platform.publish(DOCUMENT)
        yield platform


@pytest.fixture
def flood_platform(
    postgres_server: PostgresServer, redis_server_url: str, tmp_path: Path
) -> Iterator[TenantPlatform]:
    """The self-hosted provider alone on production timings (time scale 1): the flood test
    measures CreateTask, and at a small scale the control plane's idle polls, 1/scale times as
    frequent, would load a busy machine far more than production does."""
    with (
        module_database(postgres_server, "postgresql", tmp_path) as url,
        tenant_platform(
            tmp_path,
            url,
            redis_server_url,
            tenants=TENANTS,
            time_scale=1.0,
            providers=("self_hosted",),
        ) as platform,
    ):
        platform.publish(DOCUMENT)
        yield platform


def _status(err: grpc.RpcError) -> tuple[grpc.StatusCode, dict[str, object]]:
    """The code and the google.rpc details (by type name) of a failed call."""
    assert isinstance(err, grpc.Call)
    status = rpc_status.from_call(err)
    details: dict[str, object] = {}
    for any_detail in status.details if status else []:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo):
            message = kind()
            if any_detail.Is(message.DESCRIPTOR):
                any_detail.Unpack(message)
                details[kind.__name__] = message
    return err.code(), details


def _contend(platform: TenantPlatform, per_tenant: int, tenants: list[str]) -> dict[str, list[str]]:
    """`per_tenant` Veo tasks of each tenant created while the queue is held, then released."""

    def create(tenant: str, n: int) -> str:
        prompt = f"{tenant} contended {n} kite"
        return platform.create(tenant, prompt=prompt, provider=CONTENDED, duration_s=8)

    platform.hold(CONTENDED)
    try:
        # Four clients at once: the backlog is in sooner; its order does not matter, as the
        # window is whole DRR cycles from whichever tenant the ring starts with.
        with ThreadPoolExecutor(4) as pool:
            created = {t: list(pool.map(partial(create, t), range(per_tenant))) for t in tenants}
    finally:
        platform.release(CONTENDED)
    return created


def _first_dispatches(
    platform: TenantPlatform, created: dict[str, list[str]], window: int
) -> Counter[str]:
    """Per tenant, how many of the first `window` dispatches after the release were its tasks.

    Dispatch order is the first attempts' creation (a batch's attempts share an instant and are
    numbered in the order they were picked). Waits, polling with a deadline, until `window`
    tasks left the queue; then holds the queue again, reads the order and cancels the rest of
    the backlog, so it does not load the later tests."""

    def left_queue() -> list[tuple[str, str]] | None:
        out = []
        for tenant in created:
            request = api.ListTasksRequest(page_size=500)
            tasks = platform.stub(tenant).ListTasks(request, timeout=60).tasks
            out += [(tenant, t.task_id) for t in tasks if t.state != sp.TASK_STATE_QUEUED]
        return out if len(out) >= window else None

    # A liveness bound, not a speed one: capacity 10 lets a window of 64 through in ~7 job
    # lifetimes, ~140 s idle, 217 s at load 15 (CI); the shares do not depend on how long.
    went = wait_for(
        left_queue, timeout_s=DISPATCH_BOUND_S, interval_s=0.5, what=f"{window} dispatches"
    )
    platform.hold(CONTENDED)
    try:
        with ThreadPoolExecutor(4) as pool:
            seen = pool.map(lambda tt: _dispatched(platform, *tt), went)
            order = sorted(d for d in seen if d is not None)
            gone = {task_id for _, task_id in went}
            for tenant, ids in created.items():
                rest = [i for i in ids if i not in gone]
                list(pool.map(partial(_cancel_queued, platform, tenant), rest))
    finally:
        platform.release(CONTENDED)
    print("\ndispatch order:", " ".join(tenant for _, _, tenant in order))
    return Counter(tenant for _, _, tenant in order[:window])


def _dispatched(
    platform: TenantPlatform, tenant: str, task_id: str
) -> tuple[datetime, int, str] | None:
    """(when, attempt number, tenant) of the task's first attempt (its dispatch); None while
    it has none (taken off the queue, not yet given an attempt)."""
    attempts = platform.get(tenant, task_id).attempts
    if not attempts:
        return None
    first = min(attempts, key=lambda a: int(a.attempt_id))
    return first.created_at.ToDatetime(), int(first.attempt_id), tenant


def _cancel_queued(platform: TenantPlatform, tenant: str, task_id: str) -> None:
    """Cancel the task if it is still queued (what already went runs to its end)."""
    if platform.get(tenant, task_id).state == sp.TASK_STATE_QUEUED:
        request = api.CancelTaskRequest(task_id=task_id, reason="tenants e2e: measured")
        platform.stub(tenant).CancelTask(request, timeout=60)


def _one_refusal(platform: TenantPlatform, tenant: str) -> grpc.RpcError:
    """The refusal of one of `tenant`'s creates; the flood keeps its bucket empty, so one of a
    few tries is refused (a token refilled meanwhile may let one through)."""
    for _ in range(20):
        try:
            platform.create(tenant, prompt="one more kite", provider="self_hosted")
        except grpc.RpcError as err:
            return err
    raise AssertionError(f"{tenant}: 20 creates in a row admitted during its flood")


def test_a_tenant_allowed_only_one_region_never_runs_elsewhere(platform: TenantPlatform) -> None:
    """AUTO-routed tasks of a tenant allowed only region "us" all run on the one provider there
    (Runway), and the other providers' emulators never saw one of them."""
    prompts = [f"local only {n} kite" for n in range(4)]
    ids = [platform.create("local", prompt=p) for p in prompts]
    for task_id in ids:
        wait_for(
            lambda t=task_id: platform.get("local", t).state in TERMINAL,  # type: ignore[misc]  # defaults bind the loop variable; mypy cannot infer lambda defaults
            timeout_s=90,
            interval_s=0.2,
            what=f"task {task_id} terminal",
        )
    tasks = [platform.get("local", i) for i in ids]
    assert all(t.state == sp.TASK_STATE_SUCCEEDED for t in tasks), [t.failure for t in tasks]
    assert {a.provider for t in tasks for a in t.attempts} == {"runway"}
    for provider in ("google", "self_hosted"):
        bodies = [json.dumps(job.get("body")) for job in platform.farm.truth(provider)]
        assert not [b for b in bodies if "local only" in b], (provider, bodies)
    at_runway = [json.dumps(job.get("body")) for job in platform.farm.truth("runway")]
    assert all(any(p in b for b in at_runway) for p in prompts)


def test_a_preferred_region_ranks_the_candidates_outside_it_lower(
    platform: TenantPlatform,
) -> None:
    """A tenant preferring asia-northeast1: its task's explain gives the region component 1.0
    to the Veo candidate there and below 1.0 to every eligible candidate elsewhere."""
    task_id = platform.create("roamer", prompt="roaming kite")
    decisions = wait_for(
        lambda: (
            platform.stub("roamer")
            .ExplainRoute(api.ExplainRouteRequest(task_id=task_id), timeout=60)
            .decisions
        ),
        timeout_s=60,
        interval_s=0.2,
        what="a route decision",
    )
    eligible = [c for c in decisions[0].candidates if c.eligible]
    assert eligible, decisions[0]
    inside = [c for c in eligible if c.candidate_id.startswith("google/")]
    outside = [c for c in eligible if not c.candidate_id.startswith("google/")]
    assert inside, [c.candidate_id for c in eligible]
    assert outside, [c.candidate_id for c in eligible]
    assert all(c.components["region"] == 1.0 for c in inside), inside
    assert all(c.components["region"] < 1.0 for c in outside), outside
    # Why this one: the tenant's first task has no incumbent, so the best score decided it
    # (or a near tie settled by the tenant's hash).
    assert decisions[0].selection_reason in {"best_score", "bucketed_near_tie"}, decisions[0]


@pytest.mark.timeout(DISPATCH_BOUND_S + 300)
def test_a_tenant_not_entitled_to_interactive_is_refused_and_held_to_its_share(
    platform: TenantPlatform,
) -> None:
    """A STANDARD-only tenant asking for INTERACTIVE is PERMISSION_DENIED naming its classes,
    nothing is created, and under contention it gets no more than its weight's share (1 of 4,
    within DRR's one quantum)."""
    with pytest.raises(grpc.RpcError) as caught:
        platform.create(
            "greedy", prompt="jump the queue", service_class=gen.SERVICE_CLASS_INTERACTIVE
        )
    code, details = _status(caught.value)
    assert code == grpc.StatusCode.PERMISSION_DENIED, caught.value
    info = details["ErrorInfo"]
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert info.reason == "SERVICE_CLASS_NOT_ENTITLED", info
    assert info.metadata["entitled_service_classes"] == "STANDARD", info
    assert "entitled: STANDARD" in str(caught.value.details())
    listed = platform.stub("greedy").ListTasks(api.ListTasksRequest(), timeout=60).tasks
    assert not listed, "a refused CreateTask wrote a task"

    created = _contend(platform, ENTITLEMENT_BACKLOG, ["greedy", "honest"])
    shares = _first_dispatches(platform, created, ENTITLEMENT_WINDOW)
    print(f"entitlement: first {ENTITLEMENT_WINDOW} dispatches {dict(shares)}")
    # DRR's own bound: a tenant is never more than one quantum (one task here) ahead of its
    # share at any point, so a window of 8 cycles holds at most 8 + 1 of greedy's (equal
    # weights would give it 16; the INTERACTIVE lane it asked for, more).
    assert shares["greedy"] <= ENTITLEMENT_WINDOW // 4 + 1, shares


@pytest.mark.timeout(DISPATCH_BOUND_S + 300)
def test_weights_5_2_1_give_their_shares_under_contention(platform: TenantPlatform) -> None:
    """Three tenants weighted 5:2:1 in STANDARD, equal backlogs: the contended dispatches split
    within 2% of 5/8, 2/8, 1/8, and Jain's index of the weight-normalised shares is >= 0.99."""
    started = time.monotonic()
    created = _contend(platform, WEIGHTS_BACKLOG, list(WEIGHTS))
    shares = _first_dispatches(platform, created, WEIGHTS_WINDOW)
    window, total = WEIGHTS_WINDOW, sum(WEIGHTS.values())
    measured = {t: shares[t] / window for t in WEIGHTS}
    normalised = [measured[t] / (w / total) for t, w in WEIGHTS.items()]
    index = jain(normalised)
    print(
        f"\nweights 5:2:1: window {window} dispatches, shares {measured},"
        f" Jain {index:.4f}, {time.monotonic() - started:.1f} s"
    )
    for tenant, weight in WEIGHTS.items():
        assert abs(measured[tenant] - weight / total) <= 0.02, (tenant, measured, window)
    assert index >= 0.99, (index, measured)


def test_a_flooding_tenant_does_not_slow_another_tenants_creates(
    flood_platform: TenantPlatform, tmp_path: Path
) -> None:
    """A tenant flooding CreateTask at 50x its 2/s gets RESOURCE_EXHAUSTED with RetryInfo while
    another tenant's creates are all answered; under ``--long`` (a quiet machine), that tenant's
    CreateTask p99 during the flood also stays within 2x of its p99 without it.

    The flood is a separate process offering 100 calls/s, turned on and off between segments
    of the calm tenant's sequential creates (alone, flooded, alone, flooded, ...), so a change
    in the machine's other load falls on both sides alike. Every task here is pinned to the
    self-hosted model with its SUBMIT breaker held open: both sides measure CreateTask, not the
    work the tasks cause."""
    platform = flood_platform
    platform.hold("self_hosted")
    control = tmp_path / "flood"
    on, answered = control.with_suffix(".on"), control.with_suffix(".answered")
    samples: dict[bool, list[float]] = {False: [], True: []}

    def calm_creates(n: int, flooded: bool) -> None:
        for i in range(n):
            start = time.perf_counter()
            platform.create("calm", prompt=f"calm {i} kite", provider="self_hosted")
            samples[flooded].append(time.perf_counter() - start)

    calm_creates(10, False)  # warm the channel and the server's paths
    samples[False].clear()
    assert platform.cp.proc is not None
    flooder = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.support.flood", platform.cp.proc.address),
            *(platform.tokens["flooder"], "flooder", "self_hosted", str(control)),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(FLOOD_SEGMENTS):
            calm_creates(FLOOD_SEGMENT_CREATES, flooded=False)
            on.touch()
            wait_for(answered.exists, timeout_s=60, what="the flood answered")
            refusal = _one_refusal(platform, "flooder")
            calm_creates(FLOOD_SEGMENT_CREATES, flooded=True)
            on.unlink()
            answered.unlink()
    finally:
        control.with_suffix(".stop").touch()
        out, _ = flooder.communicate(timeout=60)
    counts = json.loads(out.strip().splitlines()[-1])
    alone, during = percentile(samples[False], 0.99), percentile(samples[True], 0.99)
    print(
        f"\nflood: calm p99 alone {alone * 1000:.1f} ms, flooded {during * 1000:.1f} ms;"
        f" p50 {percentile(samples[False], 0.5) * 1000:.1f} / "
        f"{percentile(samples[True], 0.5) * 1000:.1f} ms; flooder's answers {counts}"
    )
    code, details = _status(refusal)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, refusal
    retry = details["RetryInfo"]
    assert isinstance(retry, error_details_pb2.RetryInfo)
    assert 0 < retry.retry_delay.ToTimedelta().total_seconds() <= 1.0, retry
    assert counts.get("RESOURCE_EXHAUSTED", 0) > 5 * counts.get("OK", 0), counts
    # The p99 ratio is a latency figure: beside the rest of a 3-worker suite on 2 cores, other
    # workers' bursts move a 120-sample p99 more than the flood does (3.7x once, below 1x in
    # three runs alone), so `make test` proves the isolation (every calm create answered, the
    # flooder refused with RetryInfo) and `make test-long` also holds the 2x bound.
    if sizes.LONG:
        assert during <= 2 * alone, (alone, during, counts)
