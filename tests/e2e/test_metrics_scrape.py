"""/metrics of the control plane and of a sidecar after a workload with faults (design 9.24).

Emulators, sidecars and `vidroute serve` as in production (one time scale), each process serving
Prometheus on its own port. Three pinned tasks: a clean Runway one (ACCEPTED), a self-hosted one
whose create answer is lost after the body (UNKNOWN, then recovered through the provider's
idempotency-key listing) and a self-hosted one refused with 503 eight times (two attempts' sends
REJECTED, the SUBMIT breaker opened, then half open for the third attempt's probe, the task requeued
and routed again twice: failovers). The scrape must show exactly those outcomes, the failovers,
the breaker transitions, the gRPC server counts of the control plane and of the sidecars
(Submit and GetJob by method and code), and no id in any label.

The unknown submit is recovered by the cheapest evidence first (design 9.17.4): the job's own
webhook when it reached the control plane before the first recovery step, else the idempotent
re-send. Which one comes first is a race between the emulator's job clock and the control
plane's CPU, so the test reads which one the control plane recorded and expects the sidecar's
Submits to match it (one more ACCEPTED Submit for a re-send, none for the webhook).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import PostgresServer
from tests.support.evidence import task_events
from tests.support.module_stack import module_database
from tests.support.stack import ControlPlane, ProviderFarm, RedisDb, describe, logged_metrics_port
from tests.support.workload import SUBMIT_ROUTE
from vidroute.scheduler.v1 import scheduler_pb2 as sp

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(900)]

# Every RPC timeout of the run must stay above a loaded machine's RPC latency, or the workload
# changes: at 0.02 the dispatcher's Compile deadline (10 s) is 0.2 s and the sidecars' submit read
# (60 s) 1.2 s, and at load 40 a Compile went unanswered and the clean task failed
# NO_ELIGIBLE_CANDIDATE. At 0.05 they are 0.5 s and 3 s.
TIME_SCALE = 0.05
# A hang guard, not a speed claim: the workload is seconds of scaled timers, but its CPU work
# (three processes, emulator threads, the scaled poll loops) is not scaled and a machine at load
# 40 stretches it twenty-fold; the stack's start-up counts against the pytest timeout too.
HANG_GUARD_S = 240.0
RECOVERED_BY = ("recovered by early_callback", "recovered by idempotent_resubmit")
ID_LABELS = {"task_id", "attempt_id", "job_id", "provider_job_id", "client_request_key"}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert not set(s.labels) & ID_LABELS, (s.name, s.labels)
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s series whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def recovery_of(database_url: str, task_id: str) -> str:
    """How the control plane recovered `task_id`'s one unknown submit (its recorded reason)."""
    reasons = [
        str(payload.get("reason", ""))
        for kind, payload in task_events(database_url, task_id)
        if kind == "attempt.state_changed"
        and str(payload.get("reason", "")).startswith("recovered by")
    ]
    assert len(reasons) == 1, reasons
    assert reasons[0] in RECOVERED_BY, reasons
    return reasons[0]


def assert_sidecar_grpc_counts(sidecar: Samples, *, sent: float, resent: int) -> None:
    """The self-hosted sidecar's gRPC server families after the workload, which sent it `sent`
    Submits (the control plane's provider_submit_total), `resent` of them recovery re-sends."""
    # The sidecar's gRPC server, through the kernel's interceptor (the control plane's families):
    # every Submit the control plane sent (its provider_submit_total, recovery's re-send
    # included), each answered OK -- the outcome travels in the response -- and each journaled.
    adapter = {"grpc_service": "vidroute.adapter.v1.ProviderAdapterService"}
    assert sent == 10 + resent  # UNKNOWN 1 + REJECTED 8 + ACCEPTED 1, and the re-send
    submits = total(sidecar, "grpc_server_handled_total", **adapter, grpc_method="Submit")
    assert submits == sent
    assert total(sidecar, "grpc_server_handled_total", grpc_method="Submit", grpc_code="OK") == (
        submits
    )
    assert total(sidecar, "adapter_submit_total") == submits
    assert total(sidecar, "grpc_server_started_total", grpc_method="Submit") == submits
    assert total(sidecar, "grpc_server_handling_seconds_count", grpc_method="Submit") == submits
    # Polls: both self-hosted jobs (the recovered one and the requeued attempt's) followed to the
    # end; every poll answered OK and timed.
    polls = total(sidecar, "grpc_server_handled_total", grpc_method="GetJob")
    assert polls >= 2
    assert total(sidecar, "grpc_server_handled_total", grpc_method="GetJob", grpc_code="OK") == (
        polls
    )
    assert total(sidecar, "grpc_server_handling_seconds_count", grpc_method="GetJob") == polls
    assert total(sidecar, "grpc_server_handled_total", grpc_method="Describe", grpc_code="OK") >= 1


@pytest.fixture(scope="module")
def platform(
    e2e_backend: str,
    postgres_server: PostgresServer,
    redis_server_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ProviderFarm, ControlPlane, int]]:
    workdir: Path = tmp_path_factory.mktemp(f"metrics-{e2e_backend}")
    providers = ("runway", "self_hosted")
    with (
        module_database(postgres_server, e2e_backend, workdir) as url,
        ProviderFarm(workdir / "farm", time_scale=TIME_SCALE, providers=providers) as farm,
        RedisDb(redis_server_url) as redis,
    ):
        (workdir / "cp").mkdir()
        cp = ControlPlane(
            workdir / "cp",
            farm,
            database_url=url,
            redis_url=redis.url,
            env={"VIDROUTE_METRICS_LISTEN": "127.0.0.1:0"},
        )
        cp.start()
        assert cp.proc is not None
        try:
            yield farm, cp, logged_metrics_port(cp.proc)
        finally:
            cp.kill()


def test_scraped_families_match_the_workload(
    platform: tuple[ProviderFarm, ControlPlane, int],
) -> None:
    farm, cp, port = platform
    before = scrape(port)
    emulator = farm.emulator("self_hosted")
    emulator.add_faults([{"route": SUBMIT_ROUTE["self_hosted"], "action": "drop_after_body"}])
    clean = cp.create_task("runway", prompt=f"a kite {secrets.token_hex(4)}")
    unknown = cp.create_task("self_hosted", prompt=f"a fox {secrets.token_hex(4)}")
    cp.wait_terminal(unknown, HANG_GUARD_S)
    # Two attempts of one send and 3 re-sends each (FailoverLimits.max_same_candidate_retries)
    # refused: 8 failures in a row open the SUBMIT breaker; each attempt fails and the task is
    # requeued; after the cooldown the third attempt is the half-open probe, which closes it.
    emulator.add_faults(
        [{"route": SUBMIT_ROUTE["self_hosted"], "action": "status", "code": 503, "times": 8}]
    )
    refused = cp.create_task("self_hosted", prompt=f"a heron {secrets.token_hex(4)}")
    tasks = {tid: cp.wait_terminal(tid, HANG_GUARD_S) for tid in (clean, unknown, refused)}
    for task in tasks.values():
        assert task.state == sp.TASK_STATE_SUCCEEDED, describe(task)
    assert len(tasks[refused].attempts) == 3, describe(tasks[refused])

    after = scrape(port)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("provider_submit_total", provider="runway", outcome="ACCEPTED") == 1
    assert delta("provider_submit_total", provider="self_hosted", outcome="UNKNOWN") == 1
    # The refused attempts: each send and re-send REJECTED (PROVIDER_OVERLOADED).
    refusals = delta("provider_submit_total", provider="self_hosted", outcome="REJECTED")
    assert refusals == 8
    # The webhook, or a re-send under the attempt's key (self-hosted deduplicates by key, so it
    # names the one job). A re-send is a submit like any other (its breaker admits it, 9.15.2):
    # the control plane counts it, and the sidecar sees it as a Submit.
    resent = int(recovery_of(cp.database_url, unknown) == "recovered by idempotent_resubmit")
    # The requeued attempt, and the unknown one's re-send if recovery made one.
    assert delta("provider_submit_total", provider="self_hosted", outcome="ACCEPTED") == 1 + resent
    assert delta("scheduler_failover_total", to="self_hosted") == 2
    assert delta("scheduler_decision_total", provider="self_hosted") == 4  # 1 + 1 + 2 requeues
    # Each of those decisions' scores, observed once (the shipped weights sum to 1).
    assert delta("scheduler_route_score_count", provider="self_hosted") == 4
    assert 0 < delta("scheduler_route_score_sum", provider="self_hosted") <= 4
    submit_breaker = {"provider": "self_hosted", "operation": "SUBMIT"}
    model = tasks[refused].attempts[-1].model
    assert delta("provider_circuit_transitions_total", **submit_breaker, to="OPEN") >= 1
    assert delta("provider_circuit_transitions_total", **submit_breaker, to="HALF_OPEN") >= 1
    # One probe succeeded; closing takes BreakerConfig.half_open_successes_to_close (3).
    assert total(after, "provider_circuit_state", **submit_breaker, model=model) == 1
    assert delta("scheduler_decision_total", provider="runway") == 1
    assert delta("provider_generation_latency_seconds_count", provider="runway") == 1
    assert total(after, "provider_task_success_ratio", provider="runway") == 1.0
    assert delta("grpc_server_handled_total", grpc_method="CreateTask", grpc_code="OK") == 3
    assert delta("grpc_server_started_total", grpc_method="CreateTask") == 3
    assert total(after, "provider_capacity_slots", provider="runway") >= 1
    assert total(after, "provider_active_leases", provider="runway") == 0

    sidecar = scrape(farm.metrics_port("self_hosted"))
    assert total(sidecar, "adapter_submit_total", outcome="UNKNOWN") == 1
    assert total(sidecar, "adapter_submit_total", outcome="REJECTED") == refusals
    # The requeued attempt, and the re-send if recovery made one.
    assert total(sidecar, "adapter_submit_total", outcome="ACCEPTED") == 1 + resent
    assert total(sidecar, "adapter_provider_http_requests_total", status="503") == refusals
    assert total(sidecar, "adapter_provider_http_requests_total", route="/v1/jobs/{id}") >= 1

    sent = delta("provider_submit_total", provider="self_hosted")
    assert_sidecar_grpc_counts(sidecar, sent=sent, resent=resent)
    # The Runway sidecar saw only the clean task: one Submit.
    runway = scrape(farm.metrics_port("runway"))
    assert total(runway, "grpc_server_handled_total", grpc_method="Submit", grpc_code="OK") == 1
