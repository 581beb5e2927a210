"""Operator commands: providers, breakers, force-breaker, health, capabilities publish, and the
outputs of a task (download, url)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients import cli_common
from clients import cli_render as render
from clients.cli_client import channel
from clients.cli_common import api, connection_options, json_option
from clients.cli_tasks import UINT32

HEALTH_SERVICES = ("", "vidroute.scheduler.v1.SchedulerService", "liveness")
_FORCE: dict[str, str | None] = {"open": "OPEN", "closed": "CLOSED", "release": None}


@click.command("providers")
@json_option
@connection_options
def providers(*, target: str | None, tls: bool | None, debug: bool, as_json: bool) -> int:
    """Admin: provider accounts and their capability matrix (models, versions, modes)."""
    with api(target, tls, debug) as client:
        found = client.providers()
    if as_json:
        render.print_json({"providers": [render.to_dict(p) for p in found]})
    else:
        render.print_providers(found)
    return 0


@click.command("breakers")
@click.option("--provider", default="", help="Only this provider's breakers.")
@json_option
@connection_options
def breakers(*, provider: str, target: str | None, tls: bool | None, debug: bool,
             as_json: bool) -> int:  # fmt: skip
    """Admin: circuit breaker states (provider/account/region/model/operation)."""
    with api(target, tls, debug) as client:
        found = client.health(provider)
    if as_json:
        render.print_json({"breakers": [render.to_dict(b) for b in found]})
    else:
        render.print_breakers(found)
    return 0


@click.command("force-breaker")
@click.argument("provider")
@click.option("--account", default="", help="Provider account.")
@click.option("--region", default="", help="Region.")
@click.option("--model", default="", help="Model (empty: the account's breaker).")
@click.option("--operation", default="SUBMIT", show_default=True, help="Operation.")
@click.option(
    "--state",
    "forced",
    type=click.Choice(sorted(_FORCE)),
    required=True,
    help="Force open or closed, or release the override.",
)
@click.option("--reason", required=True, help="Why, for the audit trail.")
@json_option
@connection_options
def force_breaker(*, provider: str, account: str, region: str, model: str, operation: str,
                  forced: str, reason: str, target: str | None, tls: bool | None, debug: bool,
                  as_json: bool) -> int:  # fmt: skip
    """Admin: force a circuit breaker open or closed, or release the override."""
    with api(target, tls, debug) as client:
        breaker = client.force_breaker(
            provider, account, region, model, state=_FORCE[forced], reason=reason,
            operation=operation,
        )  # fmt: skip
    render.print_json(breaker) if as_json else render.print_breakers([breaker])
    return 0


@click.command("health")
@json_option
@connection_options
def health(*, target: str | None, tls: bool | None, debug: bool, as_json: bool) -> int:
    """The server's gRPC health: readiness ("" and SchedulerService) and liveness."""
    conn = cli_common.connection(target, tls, debug)
    answers: dict[str, str] = {}
    with channel(conn) as chan:
        stub = health_pb2_grpc.HealthStub(chan)
        for service in HEALTH_SERVICES:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            answers[service] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if as_json:
        render.print_json({"target": conn.target, "services": answers})
    else:
        for service, status in answers.items():
            print(f"{service or '(server)':<42} {status}")
    return 0 if all(s == "SERVING" for s in answers.values()) else 1


@click.group("capabilities")
def capabilities() -> None:
    """Admin: capability documents."""


_AT = click.DateTime(formats=["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"])


def _utc(at: datetime | None) -> datetime | None:
    """A --at time; one without an offset is UTC."""
    if at is None:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@capabilities.command("publish")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--dry-run", is_flag=True, help="Check everything (sample compile too), write nothing."
)
@click.option("--version", "name", default="", help="The release's name (default: its digest).")
@click.option("--at", "at", type=_AT, default=None, help="Take effect at this time (UTC ISO).")
@click.option("--staged", is_flag=True, help="Check and keep it; `capabilities activate` applies.")
@click.option("--force", is_flag=True, help="Publish even if a serving model would break.")
@click.option("--reason", default="", help="Why it is forced (required with --force; recorded).")
@json_option
@connection_options
def publish(*, file: Path, dry_run: bool, name: str, at: datetime | None, staged: bool,
            force: bool, reason: str, target: str | None, tls: bool | None, debug: bool,
            as_json: bool) -> int:  # fmt: skip
    """Publish a capability release (YAML/JSON): checked, sample-compiled on the live
    sidecars, diffed; refused whole when any entry is bad or a serving model would break."""
    if force and not reason.strip():
        raise click.UsageError("--force needs --reason (it is recorded in the history)")
    with api(target, tls, debug) as client:
        reply = client.publish_capabilities(
            file, source=file.name, dry_run=dry_run, version=name, activate_at=_utc(at),
            staged=staged, force_reason=reason if force else "",
        )  # fmt: skip
    if as_json:
        render.print_json(reply)
        return 0
    counts = ", ".join(f"{k} {v}" for k, v in sorted(reply.counts.items())) or "nothing"
    verb = "would write" if reply.dry_run else "unchanged" if reply.unchanged else "published"
    print(f"{verb}: release {reply.version} {reply.state}: {counts} ({file.name})")
    print(f"  {reply.samples_compiled} sample specs compiled on the live sidecars")
    render.print_capability_changes(reply.changes)
    return 0


@capabilities.command("activate")
@click.argument("version")
@click.option("--at", "at", type=_AT, default=None, help="Take effect at this time (UTC ISO).")
@click.option("--force", is_flag=True, help="Activate even if a serving model would break.")
@click.option("--reason", default="", help="Why it is forced (required with --force; recorded).")
@json_option
@connection_options
def activate(*, version: str, at: datetime | None, force: bool, reason: str,
             target: str | None, tls: bool | None, debug: bool, as_json: bool) -> int:  # fmt: skip
    """Activate a staged capability release, through every check again."""
    if force and not reason.strip():
        raise click.UsageError("--force needs --reason (it is recorded in the history)")
    with api(target, tls, debug) as client:
        reply = client.activate_capabilities(
            version, activate_at=_utc(at), force_reason=reason if force else ""
        )
    if as_json:
        render.print_json(reply)
        return 0
    print(f"activated: release {reply.release.version} ({reply.samples_compiled} samples)")
    render.print_capability_changes(reply.release.changes)
    return 0


@capabilities.command("rollback")
@click.argument("version", default="")
@click.option("--force", is_flag=True, help="Roll back even if a serving model would break.")
@click.option("--reason", default="", help="Why it is forced (required with --force; recorded).")
@json_option
@connection_options
def rollback(*, version: str, force: bool, reason: str, target: str | None, tls: bool | None,
             debug: bool, as_json: bool) -> int:  # fmt: skip
    """Return the catalog to an earlier release (default: the one the current one replaced)."""
    if force and not reason.strip():
        raise click.UsageError("--force needs --reason (it is recorded in the history)")
    with api(target, tls, debug) as client:
        reply = client.rollback_capabilities(version, force_reason=reason if force else "")
    if as_json:
        render.print_json(reply)
        return 0
    print(f"rolled back to release {reply.version}")
    render.print_capability_changes(reply.changes)
    return 0


@capabilities.command("history")
@json_option
@connection_options
def history(*, target: str | None, tls: bool | None, debug: bool, as_json: bool) -> int:
    """Every capability release and activation: who, when, from when, what it replaced."""
    with api(target, tls, debug) as client:
        reply = client.capability_history()
    if as_json:
        render.print_json(reply)
    else:
        render.print_capability_history(reply)
    return 0


@click.command("download")
@click.argument("task_id")
@click.option(
    "-o",
    "--output",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File to write (default: task-<id>-<sample>.<ext> here; - for stdout).",
)
@click.option("--sample", type=UINT32, default=0, show_default=True, help="Which sample.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print what was written (path, size, task, sample) as JSON on stdout.",
)
@connection_options
def download(*, task_id: str, out: Path | None, sample: int, target: str | None, tls: bool | None,
             debug: bool, as_json: bool) -> int:  # fmt: skip
    """Download a stored output (GetOutput); its size and SHA-256 are checked."""
    if as_json and out is not None and str(out) == "-":
        raise click.UsageError("--json and -o - both want stdout: write to a file with -o FILE")
    with api(target, tls, debug) as client:
        if out is not None and str(out) == "-":
            client.download_output(task_id, sys.stdout.buffer, sample_index=sample)
            return 0
        if out is None:
            task = client.get(task_id)
            stored = [o for o in task.outputs if o.sample_index == sample]
            mime = stored[0].mime_type if stored else task.output.mime_type
            out = Path(f"task-{task_id}-{sample}{_extension(mime)}")
        size = client.download_output(task_id, out, sample_index=sample)
    if as_json:
        done = {"path": str(out), "size_bytes": size, "task_id": task_id, "sample_index": sample}
        render.print_json(done)
    else:
        print(f"{out}  {size} bytes", file=sys.stderr)
    return 0


def _extension(mime: str) -> str:
    return {"video/mp4": ".mp4", "video/webm": ".webm", "video/quicktime": ".mov"}.get(mime, "")


@click.command("url")
@click.argument("task_id")
@click.option("--sample", type=UINT32, default=0, show_default=True, help="Which sample.")
@click.option("--expires-in", type=UINT32, default=0, help="Lifetime in seconds "
              "(default: the server's).")  # fmt: skip
@json_option
@connection_options
def url(*, task_id: str, sample: int, expires_in: int, target: str | None, tls: bool | None,
        debug: bool, as_json: bool) -> int:  # fmt: skip
    """A time-limited URL another service can GET the output from (S3 presigned)."""
    with api(target, tls, debug) as client:
        reply = client.output_url(task_id, sample_index=sample, expires_in_s=expires_in)
    if as_json:
        render.print_json(reply)
    else:
        print(reply.url)
        print(f"expires {render.when(reply.expires_at)} UTC", file=sys.stderr)
    return 0


@click.command("webhooks")
@click.argument("task_id")
@json_option
@connection_options
def webhooks(*, task_id: str, target: str | None, tls: bool | None, debug: bool,
             as_json: bool) -> int:  # fmt: skip
    """The task's caller webhook messages and every delivery attempt."""
    with api(target, tls, debug) as client:
        deliveries = client.webhook_deliveries(task_id)
    if as_json:
        render.print_json({"deliveries": [render.to_dict(d) for d in deliveries]})
    else:
        render.print_deliveries(deliveries, task_id)
    return 0


COMMANDS = (providers, breakers, force_breaker, health, capabilities, download, url, webhooks)
