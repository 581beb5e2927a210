"""`vidroute feedback`, `quality` and `canaries` without a server: their tables and their
usage errors (`clients.cli_quality`)."""

from __future__ import annotations

import pytest
from google.protobuf import timestamp_pb2

from clients import cli, cli_quality
from tests.support.stack import free_port
from vidroute.scheduler.v1 import routing_pb2


def test_the_quality_table_shows_counts_score_interval_and_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One row per bucket: provider, model, mode, bucket (empty is the whole mode), verdict
    and defect counts, the score with its interval, acceptance and regeneration shares."""
    cli_quality.print_quality(
        [
            routing_pb2.QualityBucket(
                provider="runway", model="gen4.5", mode="text_to_video", accepted=3, rejected=1,
                technical_checks=4, technical_defects=1, score=0.8125, score_low=0.61,
                score_high=0.93, user_acceptance_ratio=0.75,
            ),
            routing_pb2.QualityBucket(
                provider="runway", model="gen4.5", mode="text_to_video",
                bucket="audio=false,duration=short,refs=0,resolution=720p", regenerated=2,
                score=0.5, score_low=0.2, score_high=0.8, regeneration_ratio=1.0,
            ),
        ]
    )  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    whole = next(line for line in lines if "(whole mode)" in line).split()
    assert whole[:4] == ["runway", "gen4.5", "text_to_video", "(whole"]
    assert whole[5:] == ["3/1/0", "1/4", "0.812", "[0.610,", "0.930]", "75%", "0%"]
    tagged = next(line for line in lines if "resolution=720p" in line).split()
    assert tagged[4:] == ["0/0/2", "0/0", "0.500", "[0.200,", "0.800]", "0%", "100%"]
    cli_quality.print_quality([])
    assert "no quality signals yet" in capsys.readouterr().out


def test_the_canary_table_shows_stage_status_gates_and_last_transition(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A canary's row: candidate, current share, its stages, status, each gate's last result
    (failed ones in capitals) and the last transition's action and reason."""
    at = timestamp_pb2.Timestamp(seconds=1_764_000_000)
    cli_quality.print_canaries(
        [
            routing_pb2.CanaryState(
                candidate_id="runway/prod-us/gen5", stages=[0.5, 2, 5], traffic_percent=2,
                status=routing_pb2.CANARY_STATUS_ACTIVE, gates={"success": True, "p95": False},
                history=[
                    routing_pb2.CanaryTransition(
                        from_percent=0.5, to_percent=2, action="PROMOTE", reason="all gates passed"
                    )
                ],
                updated_at=at,
            )
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("runway/prod-us/gen5"))
    assert row.split()[1:7] == ["2%", "0.5%", "->", "2%", "->", "5%"]
    assert "ACTIVE" in row
    assert "p95 FAILED, success ok" in row
    assert "PROMOTE: all gates passed" in row
    cli_quality.print_canaries([])
    assert capsys.readouterr().out.strip() == "no canaries"


@pytest.mark.parametrize(
    "argv",
    [["feedback", "7", "loved"], ["feedback", "7"], ["quality", "--nope"]],
)
def test_bad_feedback_and_quality_usage_is_one_line_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown verdict, a missing one or an unknown option: one line, exit 2, no call."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: vidroute")


def test_feedback_to_an_unreachable_server_names_the_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Nothing listens on the target: one line naming it, exit 1."""
    target = f"127.0.0.1:{free_port()}"
    assert cli.main(["feedback", "7", "accepted", "--target", target]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach the control plane at {target} "), err
    assert len(err.strip().splitlines()) == 1, err
