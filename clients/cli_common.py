"""What every client command of `vidroute` shares: the connection options, ``--json``, and
the per-invocation `State` that `clients.cli.main` reads when it turns a failure into a line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from clients import cli_config
from clients.cli_client import connect
from clients.sdk import Client

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class State:
    """Per-invocation state: the target tried (for the unreachable message) and --debug."""

    target: str = ""
    debug: bool = False


def state() -> State:
    ctx = click.get_current_context()
    root = ctx.find_root()
    if not isinstance(root.obj, State):
        root.obj = State()
    return root.obj


def connection_options(func: F) -> F:
    """``--target``, ``--tls/--no-tls`` and ``--debug`` on a client command."""
    decorators = [
        click.option(
            "--target",
            default=None,
            metavar="HOST:PORT",
            help="Control plane address (default: VIDROUTE_TARGET, the config file's target, "
            "localhost:8051).",
        ),
        click.option(
            "--tls/--no-tls",
            default=None,
            help="Use TLS (default: the config file's tls, else plaintext).",
        ),
        click.option("--debug", is_flag=True, help="Show a traceback on errors."),
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print the response as JSON (proto field names)."
    )(func)


def connection(target: str | None, tls: bool | None, debug: bool) -> cli_config.Connection:
    """The command's resolved connection; its target is remembered for error messages."""
    st = state()
    st.debug = st.debug or debug
    try:
        conn = cli_config.resolve(target, None, tls)
    except cli_config.ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    st.target = conn.target
    return conn


@contextmanager
def api(target: str | None, tls: bool | None, debug: bool = False) -> Iterator[Client]:
    """An SDK client on the command's connection, closed on exit."""
    with connect(connection(target, tls, debug)) as client:
        yield client
