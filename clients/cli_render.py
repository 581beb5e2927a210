"""How the client commands print: rich tables for people, the messages as JSON for machines.

``--json`` prints the response messages with proto field names (what grpcurl and the SDK
show); the tables are for reading. Piped output gets a wide console so columns are not folded.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message
from rich import box
from rich.console import Console
from rich.table import Table

from vidroute.adapter.v1 import adapter_pb2
from vidroute.common.v1 import error_pb2, generation_pb2
from vidroute.scheduler.v1 import capability_release_pb2, scheduler_pb2, scheduler_service_pb2

PIPED_WIDTH = 320


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(
        file=stream, width=None if stream.isatty() else PIPED_WIDTH, highlight=False, soft_wrap=True
    )


def to_dict(message: Message) -> dict[str, Any]:
    return dict(json_format.MessageToDict(message, preserving_proto_field_name=True))


def print_json(data: object) -> None:
    if isinstance(data, Message):
        data = to_dict(data)
    print(json.dumps(data, indent=2, sort_keys=True))


def short(enum: Any, value: int, prefix: str) -> str:
    """An enum value without its prefix: ``TASK_STATE_RUNNING`` -> ``RUNNING``."""
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def task_state(value: int) -> str:
    return short(scheduler_pb2.TaskState, value, "TASK_STATE_")


def attempt_state(value: int) -> str:
    return short(scheduler_pb2.AttemptState, value, "ATTEMPT_STATE_")


def mode(value: int) -> str:
    return short(generation_pb2.Mode, value, "MODE_").lower().replace("_", "-")


def when(ts: timestamp_pb2.Timestamp) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return ts.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")


def _table(*columns: str, right: Iterable[str] = ()) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in set(right) else "left", overflow="fold")
    return table


def table(*columns: str, right: Iterable[str] = ()) -> Table:
    """A table in the commands' style; `right` names the right-aligned (number) columns."""
    return _table(*columns, right=right)


def failure_line(task: scheduler_pb2.Task) -> str:
    """``failed: CODE: message  [ERROR_CLASS]`` of a FAILED task (Task.failure)."""
    f = task.failure
    kind = short(error_pb2.ErrorClass, f.error_class, "ERROR_CLASS_")
    return f"failed: {f.code or kind}: {f.message or '(no message)'}" + (
        f"  [{kind}]" if f.code and f.error_class else ""
    )


def print_task(task: scheduler_pb2.Task) -> None:
    out = console()
    spec = task.spec
    out.print(
        f"task {task.task_id}  {task_state(task.state)}  tenant={spec.tenant_id}  "
        f"mode={mode(spec.mode)}  created {when(task.created_at)}"
    )
    out.print(f"  prompt: {spec.prompt[:120]}")
    for att in task.attempts:
        error = f"  {att.error.code}: {att.error.message}" if att.error.code else ""
        out.print(
            f"  attempt {att.attempt_no}: {att.provider}/{att.model} "
            f"{attempt_state(att.state)}{error}"
        )
    if task.state == scheduler_pb2.TASK_STATE_FAILED:
        out.print(f"  {failure_line(task)}")
    outputs = list(task.outputs) or ([task.output] if task.HasField("output") else [])
    for o in outputs:
        out.print(
            f"  output[{o.sample_index}]: {o.uri}  {o.mime_type} {o.size_bytes} bytes "
            f"{o.width}x{o.height} {o.duration_ms / 1000:g} s"
        )
    if task.webhook.url:
        out.print(f"  webhook: {task.webhook.url} {' '.join(task.webhook.events)}")


def print_tasks(tasks: Sequence[scheduler_pb2.Task], more: bool) -> None:
    table = _table("TASK", "STATE", "TENANT", "MODE", "CREATED", "PROMPT", right=("TASK",))
    for t in tasks:
        table.add_row(
            t.task_id,
            task_state(t.state),
            t.spec.tenant_id,
            mode(t.spec.mode),
            when(t.created_at),
            t.spec.prompt[:48],
        )
    out = console()
    out.print(table)
    if more:
        out.print(f"(more tasks after these {len(tasks)}: raise --limit)")


def progress_text(event: scheduler_pb2.TaskEvent) -> str:
    """``42%`` / ``queue position 3`` of a progress event, else ''."""
    if not event.HasField("progress"):
        return ""
    p = event.progress
    parts = []
    if p.HasField("fraction"):
        parts.append(f"{p.fraction * 100:.0f}%")
    if p.HasField("queue_position"):
        parts.append(f"queue position {p.queue_position}")
    return " ".join(parts)


def event_line(event: scheduler_pb2.TaskEvent) -> str:
    kind = short(scheduler_pb2.TaskEventKind, event.kind, "TASK_EVENT_KIND_")
    line = f"{when(event.created_at)}  {kind:<22} {task_state(event.task_state):<16}"
    if event.attempt_id:
        line += f" attempt {event.attempt_id} {attempt_state(event.attempt_state)}"
    progress = progress_text(event)
    return f"{line} {progress}".rstrip()


def timeline(events: Sequence[scheduler_pb2.TaskEvent]) -> list[str]:
    """Each task state the task went through, with its time since creation."""
    lines, last, start = [], -1, None
    for e in events:
        at: datetime = e.created_at.ToDatetime()
        start = start or at
        if e.task_state and e.task_state != last:
            since = f"+{(at - start).total_seconds():.1f}s"
            lines.append(f"  {since:>8}  {task_state(e.task_state)}")
            last = e.task_state
    return lines


def print_explain(decisions: Sequence[scheduler_pb2.RouteDecision], task_id: str) -> None:
    out = console()
    if not decisions:
        out.print(f"task {task_id}: no routing decision yet")
    for d in decisions:
        shadow = f"  shadow: {d.shadow_selected_candidate}" if d.shadow_selected_candidate else ""
        out.print(
            f"decision {d.decision_no}  {d.reason_code}  policy={d.policy_version}  "
            f"capability={d.capability_version}\n  selected: {d.selected_candidate or '-'}"
            + (f" ({d.selection_reason})" if d.selection_reason else "")
            + shadow
            + (f"\n  quality bucket: {d.quality_bucket}" if d.quality_bucket else "")
        )
        table = _table(
            "CANDIDATE", "OK", "SCORE", "PENALTIES", "COST", "REASON", right=("SCORE", "COST")
        )
        ranked = sorted(d.candidates, key=lambda c: (not c.eligible, -c.score))
        for c in ranked:
            cost = c.estimated_cost
            money = (
                f"{cost.amount_micros // 1_000_000}.{cost.amount_micros % 1_000_000:06d} "
                f"{cost.currency_code}"
                if c.HasField("estimated_cost")
                else "-"
            )
            reason = "" if c.eligible else f"{c.reject_reason}: {c.reject_detail}"
            # Subtracted from the weighted sum (`score` includes them), e.g. GPU_UTILIZATION.
            penalties = ",".join(f"{k}=-{v:.3f}" for k, v in sorted(c.penalties.items()))
            table.add_row(
                c.candidate_id,
                "yes" if c.eligible else "no",
                f"{c.score:.3f}" if c.eligible else "-",
                penalties or "-",
                money,
                reason,
            )
        out.print(table)
        for c in ranked:  # what each eligible candidate's components read
            if c.eligible and c.inputs:
                inputs = "  ".join(f"{k}={v:.4g}" for k, v in sorted(c.inputs.items()))
                out.print(f"  {c.candidate_id}: {inputs}")
            signals = _signals(c)
            if signals:
                out.print(f"  {c.candidate_id}: {signals}")


def _signals(c: scheduler_pb2.CandidateScore) -> str:
    """A candidate's non-numeric explain fields: window, prior source, baselines, breaker."""
    parts = []
    if c.health_window:
        parts.append(f"health_window={c.health_window}")
    if c.quality_prior_source:
        parts.append(f"quality_prior_source={c.quality_prior_source}")
    parts += [f"baseline_{op}={s:.4g}s" for op, s in sorted(c.call_baselines_s.items())]
    if c.breaker_opened_for:
        slow = " (slow calls)" if c.breaker_opened_on_slow_calls else ""
        parts.append(f"breaker_opened_for={c.breaker_opened_for}{slow}")
    return "  ".join(parts)


def print_providers(providers: Sequence[scheduler_pb2.ProviderInfo]) -> None:
    table = _table(
        "PROVIDER", "ACCOUNT", "REGION", "MODEL", "VERSION", "CAPABILITY", "LIFECYCLE", "MODES",
        "RESOLUTIONS", "DURATIONS", "AUDIO", "ADAPTER",
    )  # fmt: skip
    for p in providers:
        for c in p.capabilities or [adapter_pb2.CapabilityEntry()]:
            table.add_row(
                p.provider,
                p.account,
                p.region or "-",
                c.model or "-",
                c.model_version or "-",
                c.capability_version or "-",
                short(adapter_pb2.Lifecycle, c.lifecycle, "LIFECYCLE_") if c.model else "-",
                ",".join(mode(m) for m in c.modes) or "-",
                ",".join(c.resolutions) or "-",
                ",".join(str(s) for s in c.durations_seconds) or "-",
                "yes" if c.native_audio else "no",
                p.adapter_address,
            )
    console().print(table)


def print_breakers(breakers: Sequence[scheduler_pb2.BreakerStatus]) -> None:
    table = _table("PROVIDER", "ACCOUNT", "REGION", "MODEL", "OPERATION", "STATE", "FORCED",
                   "OPEN UNTIL")  # fmt: skip
    for b in breakers:
        table.add_row(
            b.provider,
            b.account,
            b.region or "-",
            b.model or "-",
            b.operation,
            short(scheduler_pb2.BreakerState, b.state, "BREAKER_STATE_"),
            "yes" if b.forced else "no",
            when(b.open_until),
        )
    console().print(table)


def print_deliveries(deliveries: Sequence[scheduler_pb2.WebhookDelivery], task_id: str) -> None:
    out = console()
    if not deliveries:
        out.print(f"task {task_id}: no webhook messages")
        return
    table = _table("WEBHOOK ID", "EVENT", "STATE", "ATTEMPTS", "LAST", "NEXT", "URL",
                   right=("ATTEMPTS",))  # fmt: skip
    for d in deliveries:
        last = d.attempts[-1] if d.attempts else None
        answer = (
            "-"
            if last is None
            else f"{last.status_code or last.error or 'no answer'} at {when(last.sent_at)}"
        )
        table.add_row(
            d.webhook_id,
            d.event_type,
            short(scheduler_pb2.WebhookDeliveryState, d.state, "WEBHOOK_DELIVERY_STATE_"),
            str(len(d.attempts)),
            answer,
            when(d.next_attempt_at),
            d.url,
        )
    out.print(table)


def print_capability_changes(changes: Sequence[capability_release_pb2.CapabilityChange]) -> None:
    """A release's diff: per model what changes (fields, versions, price)."""
    table = _table("MODEL", "ACCOUNT", "CHANGE", "CAPABILITY VERSION", "PRICE", "FIELDS")
    for c in changes:
        versions = c.new_capability_version or c.old_capability_version
        if c.old_capability_version and c.old_capability_version != c.new_capability_version:
            versions = f"{c.old_capability_version} -> {c.new_capability_version or '-'}"
        price = f"{c.new_price_version} {c.new_price_micros_per_unit}"
        if c.old_price_version and (c.old_price_version, c.old_price_micros_per_unit) != (
            c.new_price_version,
            c.new_price_micros_per_unit,
        ):
            price = f"{c.old_price_version} {c.old_price_micros_per_unit} -> {price}"
        fields = ", ".join(f for f in c.fields if not f.startswith("commercial.")) or "-"
        table.add_row(f"{c.provider}/{c.model}", c.account, c.kind, versions, price, fields)
    console().print(table)
    for c in changes:
        for flag in c.price_flags:  # priced below what a delivery costs: said, not refused
            console().print(f"price below cost: {c.provider}/{c.model}@{c.account} {flag}")


def print_capability_history(reply: scheduler_service_pb2.ListCapabilityHistoryResponse) -> None:
    """Releases, then every activation with who, when, from when and what it replaced."""
    table = _table("RELEASE", "STATE", "SOURCE", "BY", "PUBLISHED", "EFFECTIVE FROM", "FORCED")
    for r in reply.releases:
        table.add_row(r.version, r.state, r.source, r.actor, when(r.published_at),
                      when(r.effective_from), r.forced_reason or "-")  # fmt: skip
    console().print(table)
    table = _table(
        "AT", "ACTION", "RELEASE", "REPLACED", "BY", "EFFECTIVE FROM", "REASON", "MODELS"
    )
    for a in reply.activations:
        models = ", ".join(f"{c.model}@{c.account} {c.kind}" for c in a.replaced) or "-"
        table.add_row(when(a.at), a.action, a.version, a.previous_version or "-", a.actor,
                      when(a.effective_from), a.reason or "-", models)  # fmt: skip
    console().print(table)
