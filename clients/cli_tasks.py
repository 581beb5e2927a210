"""The task commands: submit (optionally --wait), get, list, cancel, watch, explain.

``submit --wait`` and ``watch`` follow WatchTask; a dropped stream resumes from the last cursor.
With a terminal, ``--wait`` draws a live progress bar (the provider's fraction, or its queue
position); piped, it prints one line per progress event. Then the state timeline and the task.
Exit status after waiting: 0 SUCCEEDED, 1 FAILED or CANCELLED (the failure reason is printed).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from clients import cli_render as render
from clients.cli_common import api, connection_options, json_option
from clients.cli_spec import (
    CAMERA_MOTIONS,
    CATEGORIES,
    MODES,
    ROUTING_MODES,
    SERVICE_CLASSES,
    STYLES,
    SubmitFlags,
    build_request,
)
from clients.sdk import Client, errors
from vidroute.scheduler.v1 import scheduler_pb2


class Integer(click.ParamType[int]):
    """An integer within the proto field's range; the range is said only in the error."""

    name = "integer"

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not an integer", param, ctx)
        if not self.low <= number <= self.high:
            self.fail(f"{number} is not within {self.low}..{self.high}", param, ctx)
        return number


UINT32 = Integer(0, 2**32 - 1)
INT32 = Integer(-(2**31), 2**31 - 1)
INT64 = Integer(-(2**63), 2**63 - 1)
_STATES = sorted(
    n.removeprefix("TASK_STATE_").lower().replace("_", "-")
    for n in scheduler_pb2.TaskState.keys()  # noqa: SIM118 - an enum wrapper, not a dict
    if n != "TASK_STATE_UNSPECIFIED"
)
_OUTCOME_NAMES = dict((number, name) for name, number in scheduler_pb2.CancelOutcome.items())
_CANCEL_OUTCOMES = {
    scheduler_pb2.CANCEL_OUTCOME_CANCELLED: "cancelled",
    scheduler_pb2.CANCEL_OUTCOME_REQUESTED: "cancel requested (the provider is asked to stop)",
    scheduler_pb2.CANCEL_OUTCOME_ALREADY_FINISHED: "already finished, nothing changed",
}


def _asset_help(slot: str, modes: str) -> str:
    return f"{slot} asset URI ({modes}); URI#mime/type, else the MIME type from the extension."


@click.command("submit")
@click.option(
    "--spec",
    "spec_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML/JSON file: a GenerationSpec or a CreateTaskRequest (proto JSON shape); "
    "flags override its fields.",
)
@click.option("--tenant", help="Tenant that owns the task (required unless in --spec).")
@click.option("--user", help="End user within the tenant (fairness).")
@click.option("--project", help="Project within the tenant (project priority).")
@click.option("--prompt", help="What to generate (required unless in --spec).")
@click.option("--negative-prompt", help="What to avoid.")
@click.option(
    "--mode", type=click.Choice(sorted(MODES)), help="Generation mode (default text-to-video)."
)
@click.option("--width", type=UINT32, help="Width in pixels, even (default 1280).")
@click.option("--height", type=UINT32, help="Height in pixels, even (default 720).")
@click.option("--duration", "duration_s", type=float, help="Seconds (default 4).")
@click.option("--fps", type=UINT32, help="Frames per second (default 24).")
@click.option("--audio/--no-audio", default=None, help="Require native audio (default: no).")
@click.option("--samples", type=UINT32, help="Videos to generate, 1..4 (default 1).")
@click.option("--seed", type=INT64, help="Seed, 0..4294967295.")
@click.option("--safety-profile", help="Safety profile name (default: the tenant's).")
@click.option(
    "--routing",
    type=click.Choice(sorted(ROUTING_MODES)),
    help="Routing mode (default: strict-model with --model, preferred with --prefer, else auto).",
)
@click.option("--provider", help="Provider that must run the task, e.g. runway.")
@click.option("--model", help="Model that must run the task, e.g. gen4.5.")
@click.option("--prefer", multiple=True, help="Preferred provider, best first (repeatable).")
@click.option("--max-cost", help="Budget cap of one attempt, e.g. 0.50 or 0.50USD.")
@click.option(
    "--max-queue-delay",
    "max_queue_delay_s",
    type=float,
    help="Longest acceptable queue wait, seconds.",
)
@click.option("--region", help="Region the work must run in, e.g. us.")
@click.option(
    "--degrade/--no-degrade",
    default=None,
    help="Accept semantic degrades (e.g. 7 s rounded to 8 s).",
)
@click.option(
    "--service-class",
    type=click.Choice(sorted(SERVICE_CLASSES)),
    help="Fair-scheduling class (default standard).",
)
@click.option("--priority", type=INT32, help="Priority within the tenant, -100..100.")
@click.option(
    "--category",
    type=click.Choice(sorted(CATEGORIES)),
    help="Content tag: what the clip shows (picks the quality bucket routing reads).",
)
@click.option("--style", type=click.Choice(sorted(STYLES)), help="Content tag: how it looks.")
@click.option(
    "--human/--no-human", "has_human", default=None, help="Content tag: people appear in it."
)
@click.option(
    "--camera-motion",
    type=click.Choice(sorted(CAMERA_MOTIONS)),
    help="Content tag: how the camera moves.",
)
@click.option("--idempotency-key", help="Retry-safe key (default: a new one, printed).")
@click.option("--webhook-url", help="Caller webhook URL for this task's events.")
@click.option(
    "--webhook-event",
    "webhook_events",
    multiple=True,
    help="Extra webhook event type, e.g. task.progress (repeatable).",
)
@click.option("--first-frame", help=_asset_help("First frame", "image-to-video, first-last"))
@click.option("--last-frame", help=_asset_help("Last frame", "first-last-to-video"))
@click.option("--source-video", help=_asset_help("Source video", "video-to-video, extend"))
@click.option(
    "--reference", "references", multiple=True, help=_asset_help("Reference image", "repeatable")
)
@click.option("--wait", is_flag=True, help="Follow the task to its end: progress, timeline.")
@click.option(
    "--wait-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Give up waiting after this long (the task goes on; exit 1).",
)
@json_option
@connection_options
def submit(*, target: str | None, tls: bool | None, debug: bool, as_json: bool, wait: bool,
           wait_timeout: float | None, **fields: Any) -> int:  # fmt: skip
    """Create a task from flags and/or a spec file."""
    request = build_request(SubmitFlags(**fields))
    with api(target, tls, debug) as client:
        created = client.create(
            request.spec,
            idempotency_key=request.idempotency_key or None,
            webhook=request.webhook if request.HasField("webhook") else None,
        )
        task = created.task
        if not wait:
            if as_json:
                render.print_json(task)
            else:
                verb = "created" if created.created else "exists (same idempotency key)"
                print(f"{verb}: task {task.task_id}  key {created.idempotency_key}")
                render.print_task(task)
            return 0
        if not as_json:
            print(f"task {task.task_id} created (key {created.idempotency_key}); waiting")
        return _follow(client, task.task_id, as_json, wait_timeout)


def _follow(client: Client, task_id: str, as_json: bool, timeout: float | None) -> int:
    """Wait for the task's end showing progress; then the timeline and the task. Past
    `timeout` (--wait-timeout) one line says the task goes on, and how to follow it: exit 1."""
    try:
        events = _watch(client, task_id, as_json, timeout)
    except errors.DeadlineExceeded:
        if timeout is None:
            raise
        state = render.task_state(client.get(task_id).state)
        print(
            f"error: gave up waiting after {timeout:g} s; task {task_id} is {state} and goes on "
            f"(vidroute watch {task_id})",
            file=sys.stderr,
        )
        return 1
    task = client.get(task_id)
    if as_json:
        render.print_json(task)
    else:
        print("timeline:")
        print("\n".join(render.timeline(events)))
        render.print_task(task)
    return 0 if task.state == scheduler_pb2.TASK_STATE_SUCCEEDED else 1


def _watch(
    client: Client, task_id: str, as_json: bool, timeout: float | None
) -> list[scheduler_pb2.TaskEvent]:
    """The task's events until its end: a live bar on a terminal, else a line per progress."""
    events: list[scheduler_pb2.TaskEvent] = []
    live = sys.stdout.isatty() and not as_json
    if live:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
        ) as bar:
            row = bar.add_task(f"task {task_id}", total=1.0, note="")
            for event in client.watch(task_id, timeout=timeout):
                events.append(event)
                done = event.progress.fraction if event.progress.HasField("fraction") else None
                if event.task_state == scheduler_pb2.TASK_STATE_SUCCEEDED:
                    done = 1.0
                note = render.progress_text(event) or render.task_state(event.task_state)
                bar.update(row, completed=done, note=note)
    else:
        for event in client.watch(task_id, timeout=timeout):
            events.append(event)
            if not as_json and (text := render.progress_text(event)):
                print(f"progress {text}  ({render.task_state(event.task_state)})", flush=True)
    return events


@click.command("get")
@click.argument("task_id")
@json_option
@connection_options
def get(*, task_id: str, target: str | None, tls: bool | None, debug: bool, as_json: bool) -> int:
    """Show a task: state, attempts, outputs, the failure reason."""
    with api(target, tls, debug) as client:
        task = client.get(task_id)
    render.print_json(task) if as_json else render.print_task(task)
    return 0


@click.command("list")
@click.option("--tenant", default="", help="Only this tenant's tasks (default: all visible).")
@click.option("--state", type=click.Choice(_STATES), help="Only tasks in this state.")
@click.option(
    "--limit", type=click.IntRange(1), default=50, show_default=True, help="Tasks to print at most."
)
@click.option(
    "--page-size",
    type=click.IntRange(1, 500),
    default=50,
    show_default=True,
    help="Tasks per ListTasks call.",
)
@json_option
@connection_options
def list_(*, tenant: str, state: str | None, limit: int, page_size: int, target: str | None,
          tls: bool | None, debug: bool, as_json: bool) -> int:  # fmt: skip
    """List tasks, newest first (pages fetched as needed, up to --limit)."""
    with api(target, tls, debug) as client:
        wanted = state.replace("-", "_") if state else None
        found = client.list(tenant_id=tenant, state=wanted, page_size=min(page_size, limit + 1))
        tasks = list(itertools.islice(found, limit + 1))
    more = len(tasks) > limit
    del tasks[limit:]
    if as_json:
        render.print_json({"tasks": [render.to_dict(t) for t in tasks], "more": more})
    else:
        render.print_tasks(tasks, more)
    return 0


@click.command("cancel")
@click.argument("task_id")
@click.option("--reason", default="", help="Why, for the audit trail.")
@json_option
@connection_options
def cancel(*, task_id: str, reason: str, target: str | None, tls: bool | None, debug: bool,
           as_json: bool) -> int:  # fmt: skip
    """Cancel a task and say what happened."""
    with api(target, tls, debug) as client:
        reply = client.cancel(task_id, reason)
    if as_json:
        outcome_name = _OUTCOME_NAMES[reply.outcome]
        render.print_json({"task": render.to_dict(reply.task), "outcome": outcome_name})
    else:
        outcome = _CANCEL_OUTCOMES.get(reply.outcome, "unknown outcome")
        print(f"task {task_id}: {outcome}; now {render.task_state(reply.task.state)}")
    return 0


@click.command("watch")
@click.argument("task_id")
@click.option("--after", "after_cursor", default="", help="Resume after this event cursor.")
@json_option
@connection_options
def watch(*, task_id: str, after_cursor: str, target: str | None, tls: bool | None, debug: bool,
          as_json: bool) -> int:  # fmt: skip
    """Stream a task's events, one line each, until it ends."""
    with api(target, tls, debug) as client:
        for event in client.watch(task_id, after_cursor=after_cursor):
            if as_json:
                print(json.dumps(render.to_dict(event), sort_keys=True), flush=True)
            else:
                print(render.event_line(event), flush=True)
    return 0


@click.command("explain")
@click.argument("task_id")
@json_option
@connection_options
def explain(*, task_id: str, target: str | None, tls: bool | None, debug: bool,
            as_json: bool) -> int:  # fmt: skip
    """Show the route decisions of a task: every candidate, its score or why it was rejected."""
    with api(target, tls, debug) as client:
        decisions = client.explain(task_id)
    if as_json:
        render.print_json({"decisions": [render.to_dict(d) for d in decisions]})
    else:
        render.print_explain(decisions, task_id)
    return 0


COMMANDS = (submit, get, list_, cancel, watch, explain)
