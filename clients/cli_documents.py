"""What the commands over a versioned document share (``vidroute routing``, ``vidroute
tenants``): ``publish``'s file and options, its one-line outcome, a version's history line, and
the response printed as JSON as the server sent it (proto field order, not sorted)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from google.protobuf import json_format

from clients.cli_render import when

F = TypeVar("F", bound=Callable[..., Any])


def print_message(message: Any) -> None:
    print(
        json.dumps(json_format.MessageToDict(message, preserving_proto_field_name=True), indent=2)
    )


def publish_options(func: F) -> F:
    """``FILE``, ``--dry-run`` and ``--source`` on a document's ``publish`` command."""
    decorators = [
        click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path)),
        click.option("--dry-run", is_flag=True, help="Validate everything and write nothing."),
        click.option(
            "--source", default=None, help="Recorded with the version (default: the file name)."
        ),
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


def print_published(version: Any, *, dry_run: bool, rollback: str) -> None:
    """``VERSION: outcome`` of a publish; `rollback` is the command that would activate it."""
    if dry_run:
        done = "valid, not published (dry run)"
    elif version.active:
        done = "published and active"
    else:  # the same text was published before: nothing changed
        done = f"already published, not active ({rollback} {version.version})"
    print(f"{version.version}: {done}")


def version_line(v: Any) -> str:
    """One published version: ``*`` when active, its name, when, and its source."""
    return f"{'*' if v.active else ' '} {v.version}  {when(v.published_at)}  {v.source}"
