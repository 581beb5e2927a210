"""`vidroute explain`'s table without a server: each candidate's penalties beside its score."""

from __future__ import annotations

import pytest

from clients import cli_render
from vidroute.scheduler.v1 import scheduler_pb2


def test_explain_prints_each_candidates_penalties(capsys: pytest.CaptureFixture[str]) -> None:
    """A candidate scored down by GPU_UTILIZATION (and COLD_START) shows them by name and amount
    in the PENALTIES column; one without penalties shows "-"."""
    decision = scheduler_pb2.RouteDecision(
        decision_no=1,
        reason_code="BEST_SCORE",
        selected_candidate="runway/gen4.5/prod-us",
        candidates=[
            scheduler_pb2.CandidateScore(
                candidate_id="runway/gen4.5/prod-us", eligible=True, score=0.61
            ),
            scheduler_pb2.CandidateScore(
                candidate_id="self_hosted/wan2.2/gpu-a",
                eligible=True,
                score=0.42,
                penalties={"GPU_UTILIZATION": 0.25, "COLD_START": 0.05},
            ),
        ],
    )
    cli_render.print_explain([decision], "7")
    lines = capsys.readouterr().out.splitlines()
    assert "PENALTIES" in next(line for line in lines if "CANDIDATE" in line)
    plain = next(line for line in lines if line.startswith("runway/")).split()
    assert plain[:4] == ["runway/gen4.5/prod-us", "yes", "0.610", "-"]
    loaded = next(line for line in lines if line.startswith("self_hosted/")).split()
    assert loaded[:4] == [
        "self_hosted/wan2.2/gpu-a",
        "yes",
        "0.420",
        "COLD_START=-0.050,GPU_UTILIZATION=-0.250",
    ]


def test_explain_prints_the_selection_reason_and_each_candidates_inputs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The selected line names why it was chosen; below the table each eligible candidate with
    evidence lists what its components read (the p95 among them); one without lists nothing."""
    decision = scheduler_pb2.RouteDecision(
        decision_no=1,
        reason_code="SELECTED",
        selection_reason="beats_incumbent_by_delta",
        selected_candidate="runway/gen4.5/prod-us",
        candidates=[
            scheduler_pb2.CandidateScore(
                candidate_id="runway/gen4.5/prod-us",
                eligible=True,
                score=0.61,
                inputs={"p95_latency_s": 130.25, "window_samples": 42.0},
            ),
            scheduler_pb2.CandidateScore(
                candidate_id="google/veo-3.1-generate-preview/veo-prod-us", eligible=True, score=0.5
            ),
        ],
    )
    cli_render.print_explain([decision], "7")
    out = capsys.readouterr().out
    assert "selected: runway/gen4.5/prod-us (beats_incumbent_by_delta)" in out
    lines = [line.strip() for line in out.splitlines()]
    assert "runway/gen4.5/prod-us: p95_latency_s=130.2  window_samples=42" in lines
    assert not [line for line in lines if line.startswith("google/") and "=" in line]


def test_explain_prints_the_bucket_window_prior_source_baselines_and_breaker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The decision's quality bucket is printed under it; each candidate's health window,
    quality prior source, call baselines and a breaker opened on slow calls on its own line."""
    decision = scheduler_pb2.RouteDecision(
        decision_no=1,
        reason_code="SELECTED",
        selected_candidate="runway/gen4.5/prod-us",
        quality_bucket="audio=false,duration=short,refs=0,resolution=720p",
        candidates=[
            scheduler_pb2.CandidateScore(
                candidate_id="runway/gen4.5/prod-us",
                eligible=True,
                score=0.61,
                health_window="15m",
                quality_prior_source="capability_document",
                call_baselines_s={"SUBMIT": 1.25, "POLL": 0.3},
            ),
            scheduler_pb2.CandidateScore(
                candidate_id="google/veo-3.1-generate-preview/veo-prod-us",
                reject_reason="CIRCUIT_OPEN",
                reject_detail="breaker OPEN on slow_calls for 30 s more",
                breaker_opened_for="slow_calls",
                breaker_opened_on_slow_calls=True,
            ),
        ],
    )
    cli_render.print_explain([decision], "7")
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert "quality bucket: audio=false,duration=short,refs=0,resolution=720p" in lines
    assert (
        "runway/gen4.5/prod-us: health_window=15m  quality_prior_source=capability_document  "
        "baseline_POLL=0.3s  baseline_SUBMIT=1.25s"
    ) in lines
    assert (
        "google/veo-3.1-generate-preview/veo-prod-us: breaker_opened_for=slow_calls (slow calls)"
    ) in lines
