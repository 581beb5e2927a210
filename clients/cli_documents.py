"""What the commands over a versioned document share (``vidroute routing``, ``vidroute
tenants``): the ``publish``, ``activate`` and ``rollback`` commands themselves (`add_release_
commands`: ``publish``'s file and options -- ``--dry-run``, ``--source``, and when it takes
effect: ``--at``, ``--staged``, ``--reason`` -- and its outcome with the diff against the
active version), a version's and an activation's history line, and the response printed as
JSON as the server sent it (proto field order, not sorted)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
from google.protobuf import json_format, timestamp_pb2

from clients.cli_client import channel
from clients.cli_common import connection, connection_options, json_option
from clients.cli_render import when

F = TypeVar("F", bound=Callable[..., Any])

_RELATIVE = re.compile(r"^\+(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def print_message(message: Any) -> None:
    print(
        json.dumps(json_format.MessageToDict(message, preserving_proto_field_name=True), indent=2)
    )


def parse_at(text: str, now: datetime | None = None) -> datetime:
    """``--at``: an ISO 8601 time with its zone (``2026-12-05T14:00:00Z``) or a delay from now
    (``+90s``, ``+30m``, ``+2h``, ``+1d``). A time without a zone is refused, not guessed."""
    if m := _RELATIVE.match(text.strip()):
        delta = timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
        return (now or datetime.now(UTC)) + delta
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: an ISO 8601 time with a zone, or +N[s|m|h|d]"
        ) from None
    if at.tzinfo is None:
        raise click.BadParameter(f"{text!r} has no time zone (add Z or +01:00)")
    return at


def _at_option(func: F) -> F:
    return click.option(
        "--at",
        "at",
        default=None,
        help="Make it active at this time (ISO 8601 with a zone, or +30m / +2h) instead of now.",
    )(func)


def _reason_option(func: F) -> F:
    return click.option("--reason", default="", help="Why; recorded with the activation.")(func)


def publish_options(func: F) -> F:
    """``FILE``, ``--dry-run``, ``--source``, ``--at``, ``--staged`` and ``--reason`` on a
    document's ``publish`` command."""
    decorators = [
        click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path)),
        click.option("--dry-run", is_flag=True, help="Validate everything and write nothing."),
        click.option(
            "--source", default=None, help="Recorded with the version (default: the file name)."
        ),
        _at_option,
        click.option(
            "--staged", is_flag=True, help="Publish inactive; `activate VERSION` makes it active."
        ),
        _reason_option,
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


def activate_options(func: F) -> F:
    """``VERSION``, ``--at`` and ``--reason`` on a document's ``activate`` command."""
    for decorate in reversed([click.argument("version"), _at_option, _reason_option]):
        func = decorate(func)
    return func


def reason_option(func: F) -> F:
    """``--reason`` (e.g. on ``rollback``)."""
    return _reason_option(func)


def release_fields(at: str | None, reason: str, staged: bool | None = None) -> dict[str, Any]:
    """The request fields of ``--at`` / ``--staged`` / ``--reason`` (``staged`` None: the
    request has no such field, as an activate request)."""
    fields: dict[str, Any] = {"reason": reason}
    if staged is not None:
        fields["staged"] = staged
    if at:
        stamp = timestamp_pb2.Timestamp()
        stamp.FromDatetime(parse_at(at).astimezone(UTC))
        fields["activate_at"] = stamp
    return fields


def print_published(
    version: Any,
    *,
    dry_run: bool,
    rollback: str,
    reply: Any = None,
    staged: bool = False,
) -> None:
    """``VERSION: outcome`` of a publish, then its changes against the active version, one
    ``path: before -> after`` line each; `rollback` is the command that would activate it."""
    scheduled = reply is not None and reply.HasField("activate_at")
    if dry_run:
        done = "valid, not published (dry run)"
    elif version.active:
        done = "published and active"
    elif scheduled:
        done = f"published, active at {when(reply.activate_at)}"
    elif staged:
        done = f"published, staged ({rollback.replace('rollback', 'activate')} {version.version})"
    else:  # the same text was published before: nothing changed
        done = f"already published, not active ({rollback} {version.version})"
    print(f"{version.version}: {done}")
    if reply is not None:
        print_changes(reply.changes)


def print_changes(changes: Sequence[Any]) -> None:
    if not changes:
        print("  no change against the active version")
    for c in changes:
        print(f"  {c.path}: {c.before} -> {c.after}")


def version_line(v: Any) -> str:
    """One published version: ``*`` when active, its name, when, and its source."""
    return f"{'*' if v.active else ' '} {v.version}  {when(v.published_at)}  {v.source}"


_ACTIONS = {1: "published", 2: "rolled back", 3: "scheduled", 4: "activated"}


def activation_line(a: Any) -> str:
    """One activation: effective (or, pending, scheduled) time, who, what, replacing what,
    when it was asked for if not then, and why. The action numbers are the same in every
    kind's enum (``*_ACTION_PUBLISHED`` = 1 ... ``*_ACTION_ACTIVATED`` = 4)."""
    action = _ACTIONS.get(int(a.action), "?")
    replaced = f" (replacing {a.previous_version})" if a.previous_version else ""
    line = f"{when(a.at)}  {a.actor}  {action} {a.version}{replaced}"
    if a.pending:
        line = f"{when(a.at)}  {a.actor}  PENDING: {a.version} to be active at this time"
    if a.HasField("requested_at") and a.requested_at != a.at:
        line += f"  [asked {when(a.requested_at)}]"
    if a.reason:
        line += f"  -- {a.reason}"
    return line


@dataclass(frozen=True)
class DocumentRpcs:
    """One kind's publish, activate and rollback calls: each takes the channel and the request
    and returns the response; `version` picks the version message out of a response."""

    publish_request: Callable[..., Any]
    publish: Callable[[Any, Any], Any]
    activate_request: Callable[..., Any]
    activate: Callable[[Any, Any], Any]
    rollback_request: Callable[..., Any]
    rollback: Callable[[Any, Any], Any]
    version: Callable[[Any], Any]


def add_release_commands(group: click.Group, noun: str, rpcs: DocumentRpcs) -> None:
    """``publish``, ``activate`` and ``rollback`` on `group` (``vidroute <group> ...``)."""
    name = group.name

    @group.command("publish")
    @publish_options
    @json_option
    @connection_options
    def publish(
        *,
        file: Path,
        dry_run: bool,
        source: str | None,
        at: str | None,
        staged: bool,
        reason: str,
        as_json: bool,
        target: str | None,
        tls: bool | None,
        debug: bool,
    ) -> int:
        request = rpcs.publish_request(
            document=file.read_text(encoding="utf-8"),
            source=source or file.name,
            dry_run=dry_run,
            **release_fields(at, reason, staged),
        )
        with channel(connection(target, tls, debug)) as chan:
            reply = rpcs.publish(chan, request)
        if as_json:
            print_message(rpcs.version(reply))
            return 0
        print_published(
            rpcs.version(reply),
            dry_run=dry_run,
            rollback=f"vidroute {name} rollback",
            reply=reply,
            staged=staged,
        )
        return 0

    publish.help = (
        f"Validate a {noun} file, print what it changes against the active version, and make"
        f" it active: now, at --at, or (--staged) when `vidroute {name} activate` says."
    )

    @group.command("activate")
    @activate_options
    @json_option
    @connection_options
    def activate(
        *,
        version: str,
        at: str | None,
        reason: str,
        as_json: bool,
        target: str | None,
        tls: bool | None,
        debug: bool,
    ) -> int:
        """Make the published VERSION (e.g. a staged one) active now, or at --at."""
        request = rpcs.activate_request(version=version, **release_fields(at, reason))
        return switch(rpcs.activate, request, as_json, connection(target, tls, debug))

    @group.command("rollback")
    @click.argument("version", required=False, default="")
    @reason_option
    @json_option
    @connection_options
    def rollback(
        *,
        version: str,
        reason: str,
        as_json: bool,
        target: str | None,
        tls: bool | None,
        debug: bool,
    ) -> int:
        """Make VERSION active again (default: the version before the active one that was
        ever active)."""
        request = rpcs.rollback_request(version=version, reason=reason)
        return switch(rpcs.rollback, request, as_json, connection(target, tls, debug))

    def switch(call: Callable[[Any, Any], Any], request: Any, as_json: bool, to: Any) -> int:
        """An activate or rollback call, then ``VERSION: active`` (or scheduled) or its JSON."""
        with channel(to) as chan:
            out = rpcs.version(call(chan, request))
        if as_json:
            print_message(out)
        else:
            print(f"{out.version}: {'active' if out.active else 'scheduled (see history)'}")
        return 0


def add_read_commands(
    group: click.Group,
    noun: str,
    *,
    get: Callable[[Any, str], Any],
    history: Callable[[Any], Any],
) -> None:
    """``get`` and ``history`` on `group`: `get(channel, version)` returns the version message,
    `history(channel)` the history response; `noun` ("tenants") names the document in output."""

    @group.command("get")
    @click.argument("version", required=False, default="")
    @json_option
    @connection_options
    def get_command(
        *, version: str, as_json: bool, target: str | None, tls: bool | None, debug: bool
    ) -> int:
        """Print the active document (or VERSION's), as published."""
        with channel(connection(target, tls, debug)) as chan:
            config = get(chan, version)
        if as_json:
            print_message(config)
            return 0
        state = "active" if config.active else "not active"
        print(f"# {config.version} ({state}; {config.source or 'no source'})")
        print(config.document, end="" if config.document.endswith("\n") else "\n")
        return 0

    @group.command("history")
    @json_option
    @connection_options
    def history_command(*, as_json: bool, target: str | None, tls: bool | None, debug: bool) -> int:
        """Every published version (newest first; * marks the active one), then every
        activation: when, who, which version, the one it replaced, when asked (if not then)
        and why; pending scheduled activations included."""
        with channel(connection(target, tls, debug)) as chan:
            reply = history(chan)
        if as_json:
            print_message(reply)
            return 0
        if not reply.versions:
            print(f"no {noun} document published (the built-in one is in use)")
            return 0
        for v in reply.versions:
            print(version_line(v))
        print()
        for a in reply.activations:
            print(activation_line(a))
        return 0
