"""Quality feedback and what routing learned from it: ``feedback``, ``quality``, and the canary
table that ``vidroute routing canaries`` prints (`print_canaries`).

vidroute feedback TASK_ID accepted|rejected|regenerated [--tag T ...] [--comment C]
vidroute quality [--model M] [--json]     # admin: aggregates per (model, mode, tag bucket)

Feedback is open to the task's own tenant and needs a SUCCEEDED task; the same verdict twice
records nothing the second time (said so, exit 0). Calls go through the SDK
(`clients.sdk.routing`); failures are `clients.cli_errors` lines.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from clients import cli_render as render
from clients.cli_common import api, connection_options, json_option
from vidroute.scheduler.v1 import routing_pb2

VERDICTS = ("accepted", "rejected", "regenerated")


class _Verdict(click.Choice[str]):
    """click's Choice, its missing-argument message on one line like every other error."""

    def get_missing_message(self, param: click.Parameter, ctx: click.Context | None) -> str:
        return f"choose from {', '.join(VERDICTS)}"


@click.command("feedback")
@click.argument("task_id")
@click.argument("verdict", type=_Verdict(VERDICTS, case_sensitive=False))
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="TAG",
    help="A free tag on what was good or wrong, e.g. text_rendering (repeatable, at most 16).",
)
@click.option("--comment", default="", help="A note (at most 1,000 characters).")
@json_option
@connection_options
def feedback(*, task_id: str, verdict: str, tags: tuple[str, ...], comment: str, as_json: bool,
             target: str | None, tls: bool | None, debug: bool) -> int:  # fmt: skip
    """Record your verdict on a SUCCEEDED task's output; routing learns quality from it."""
    with api(target, tls, debug) as client:
        recorded = client.feedback(task_id, verdict, tags=tags, comment=comment)
    if as_json:
        render.print_json({"task_id": task_id, "verdict": verdict.upper(), "recorded": recorded})
    elif recorded:
        print(f"task {task_id}: {verdict.lower()} recorded")
    else:
        print(f"task {task_id}: {verdict.lower()} was already recorded; nothing changed")
    return 0


def _share(ratio: float) -> str:
    return f"{ratio:.0%}"


def print_quality(buckets: Sequence[routing_pb2.QualityBucket]) -> None:
    if not buckets:
        print("no quality signals yet (routing uses the catalog prior)")
        return
    table = render._table(
        "PROVIDER", "MODEL", "MODE", "BUCKET", "ACC/REJ/REGEN", "DEFECTS", "SCORE [LOW, HIGH]",
        "ACCEPTANCE", "REGENERATION",
        right=("ACC/REJ/REGEN", "DEFECTS", "ACCEPTANCE", "REGENERATION"),
    )  # fmt: skip
    for b in buckets:
        table.add_row(
            b.provider,
            b.model,
            b.mode,
            b.bucket or "(whole mode)",
            f"{b.accepted}/{b.rejected}/{b.regenerated}",
            f"{b.technical_defects}/{b.technical_checks}",
            f"{b.score:.3f} [{b.score_low:.3f}, {b.score_high:.3f}]",
            _share(b.user_acceptance_ratio),
            _share(b.regeneration_ratio),
        )
    render.console().print(table)


@click.command("quality")
@click.option("--model", default="", help="Only this model's buckets (default: every model).")
@json_option
@connection_options
def quality(*, model: str, as_json: bool, target: str | None, tls: bool | None,
            debug: bool) -> int:  # fmt: skip
    """Admin: the quality aggregates routing reads, per (model, mode, tag bucket)."""
    with api(target, tls, debug) as client:
        buckets = client.quality(model=model)
    if as_json:
        render.print_json({"buckets": [render.to_dict(b) for b in buckets]})
    else:
        print_quality(buckets)
    return 0


def _gates(state: routing_pb2.CanaryState) -> str:
    if not state.gates:
        return "-"
    return ", ".join(f"{g} {'ok' if ok else 'FAILED'}" for g, ok in sorted(state.gates.items()))


def print_canaries(canaries: Sequence[routing_pb2.CanaryState]) -> None:
    if not canaries:
        print("no canaries")
        return
    table = render._table("CANDIDATE", "STAGE", "STAGES", "STATUS", "LAST GATES",
                          "LAST TRANSITION", "UPDATED", right=("STAGE",))  # fmt: skip
    for s in canaries:
        last = s.history[-1] if s.history else None
        table.add_row(
            s.candidate_id,
            f"{s.traffic_percent:g}%",
            " -> ".join(f"{p:g}%" for p in s.stages) or "-",
            render.short(routing_pb2.CanaryStatus, s.status, "CANARY_STATUS_"),
            _gates(s),
            f"{last.action}: {last.reason}" if last else "-",
            render.when(s.updated_at),
        )
    render.console().print(table)


COMMANDS = (feedback, quality)
