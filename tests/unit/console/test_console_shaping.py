"""What the console's pages show, from records: money without float, the explain table of a
decision (components, hard-filter reasons, selected and shadow), and one time-ordered timeline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane.console.shaping import explain, money, timeline
from controlplane.domain.states import AttemptState, TaskState
from controlplane.persistence.records import (
    AttemptRecord,
    Failure,
    RouteDecisionRecord,
    TaskDetail,
    TaskEventRecord,
    TaskRecord,
)
from tests.integration.persistence.builders import make_spec

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def test_money_renders_integer_micros_exactly() -> None:
    """Micros become a fixed six-decimal amount, negative ones too, with no float rounding."""
    assert money(480_000) == "0.480000 USD"
    assert money(-1_000_001, "EUR") == "-1.000001 EUR"
    assert money(12_345_678_901_234_567) == "12345678901.234567 USD"
    assert money(None) == ""


def test_explain_lists_every_candidate_with_components_and_the_shadow_pick() -> None:
    """Every candidate is a row: the eligible with score, components and penalties (by name),
    the rejected with their reason and detail; the selected and the shadow pick are marked;
    columns are the union."""
    decision = RouteDecisionRecord(
        id=1,
        task_id=7,
        decision_no=2,
        policy_version="router-v1",
        selected_candidate="runway/gen4.5/prod-us",
        candidate_snapshot={
            "capability_version": "v9",
            "shadow_selected": "runway/veo3.1/prod-us",
            "candidates": [
                {
                    "id": "runway/gen4.5/prod-us",
                    "eligible": True,
                    "score": 0.53,
                    "components": {"cost": 1.0, "quality": 0.5},
                    "estimated_cost_micros": 480000,
                },
                {
                    "id": "runway/veo3.1/prod-us",
                    "eligible": True,
                    "score": 0.46,
                    "components": {"cost": 0.55, "latency": 0.5},
                    "penalties": {"GPU_UTILIZATION": 0.12, "COLD_START": 0.05},
                },
                {
                    "id": "self_hosted/wan/a",
                    "eligible": False,
                    "reason": "EXCLUDED_BY_FAILOVER",
                    "detail": "endpoint failed earlier for this task (soft)",
                },
            ],
        },
        reason_code="SELECTED",
        created_at=T0,
    )
    table = explain(decision)
    assert table.component_names == ("cost", "quality", "latency")
    assert [(r.candidate_id, r.selected, r.shadow) for r in table.rows] == [
        ("runway/gen4.5/prod-us", True, False),
        ("runway/veo3.1/prod-us", False, True),
        ("self_hosted/wan/a", False, False),
    ]
    rejected = table.rows[2]
    assert (rejected.eligible, rejected.reason, rejected.score) == (
        False,
        "EXCLUDED_BY_FAILOVER",
        None,
    )
    assert table.rows[0].cost == "0.480000 USD"
    assert table.rows[0].penalties == ()
    assert table.rows[1].penalties == (("COLD_START", 0.05), ("GPU_UTILIZATION", 0.12))
    assert table.shadow_selected == "runway/veo3.1/prod-us"


def _attempt(no: int, state: AttemptState, at: datetime, failure: Failure | None) -> AttemptRecord:
    return AttemptRecord(
        id=no, task_id=7, attempt_no=no, provider_account_id=no, provider_model=f"m{no}",
        provider_model_version="1", capability_version="c", price_version="p",
        routing_policy_version="r", client_request_key=f"k{no}", normalized_spec_hash="h",
        request_hash=None, compile_plan={}, route_decision_id=None, state=state, status_version=1,
        estimated_cost_micros=10, actual_cost_micros=None, currency="USD", lease_token=None,
        fencing_token=None, request_started_at=None, request_body_sent_at=None,
        transport_error_stage=None, failure=failure, created_at=at,
        updated_at=at + timedelta(seconds=2),
    )  # fmt: skip


def test_timeline_merges_events_and_attempts_in_time_order_with_the_reasons() -> None:
    """Events and attempt entries interleave by time; the requeue shows its failover reason and
    the failed attempt its failure class, code and message, on the right account."""
    task = TaskRecord(
        id=7, tenant_id="acme", user_id="", project_id="", idempotency_key="k",
        spec=make_spec("acme"), spec_hash="h", service_class=make_spec("acme").service_class,
        priority=0, state=TaskState.SUCCEEDED, status_version=9, failure=None,
        adopted_attempt_id=2, output_asset=None, queue_deadline_at=None, deadline_at=None,
        created_at=T0, updated_at=T0,
    )  # fmt: skip
    refused = Failure("PROVIDER_OVERLOADED", "UNAVAILABLE", "HTTP 503")
    detail = TaskDetail(
        task,
        (
            _attempt(1, AttemptState.FAILED, T0 + timedelta(seconds=1), refused),
            _attempt(2, AttemptState.SUCCEEDED, T0 + timedelta(seconds=5), None),
        ),
        (),
        (),
    )
    events = (
        TaskEventRecord(7, 1, "task.queued", {"state": "QUEUED"}, T0),
        TaskEventRecord(
            7, 5, "task.state_changed", {"state": "QUEUED", "reason": "FAIL_OVER"},
            T0 + timedelta(seconds=4),
        ),
    )  # fmt: skip
    entries = timeline(detail, events, {1: "self_hosted/gpu-a", 2: "runway/prod-us"})
    assert [e.at for e in entries] == sorted(e.at for e in entries)
    titles = [e.title for e in entries]
    assert titles.index("attempt 1 FAILED") < titles.index("task.state_changed -> QUEUED")
    assert titles.index("task.state_changed -> QUEUED") < titles.index("attempt 2 SUCCEEDED")
    requeue = entries[titles.index("task.state_changed -> QUEUED")]
    assert requeue.detail.startswith("reason: FAIL_OVER")
    failed = entries[titles.index("attempt 1 FAILED")]
    assert failed.detail == "PROVIDER_OVERLOADED UNAVAILABLE: HTTP 503"
    assert failed.css == "bad"
    assert "attempt 1 created on self_hosted/gpu-a m1" in titles
