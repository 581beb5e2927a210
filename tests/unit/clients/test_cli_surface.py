"""The CLI's surface without a server: every command and option documents itself, and each
kind of failure becomes the promised lines and exit code (`clients.cli_errors`)."""

from __future__ import annotations

import click
import grpc
import pytest

from clients import cli, cli_errors
from clients.sdk import errors


def _commands(group: click.Group, prefix: str = "vidroute") -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}"
        found.append((path, command))
        if isinstance(command, click.Group):
            found.extend(_commands(command, path))
    return found


def test_every_command_and_option_has_help() -> None:
    """`--help` explains every command and every option (arguments are named in the usage)."""
    commands = _commands(cli.app)
    names = {path for path, _ in commands}
    assert {
        "vidroute up", "vidroute serve", "vidroute migrate", "vidroute submit", "vidroute get",
        "vidroute list", "vidroute cancel", "vidroute watch", "vidroute explain",
        "vidroute providers", "vidroute breakers", "vidroute health",
        "vidroute capabilities publish", "vidroute capabilities activate",
        "vidroute capabilities rollback", "vidroute capabilities history", "vidroute download",
        "vidroute url", "vidroute balance",
        "vidroute ledger", "vidroute credit", "vidroute costs", "vidroute reconcile",
        "vidroute feedback", "vidroute quality", "vidroute routing canaries",
    } <= names  # fmt: skip
    for path, command in commands:
        assert command.help or command.short_help, f"{path} has no help text"
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{path} {param.opts[0]} has no help text"


def test_read_commands_take_json() -> None:
    """Every command that prints a response can print it as JSON instead."""
    writers = {"vidroute up", "vidroute serve", "vidroute migrate"}
    for path, command in _commands(cli.app):
        if isinstance(command, click.Group) or path in writers:
            continue
        assert any("--json" in p.opts for p in command.params), f"{path} has no --json"


def _error(code: grpc.StatusCode, message: str, **details: object) -> errors.VidrouteError:
    return errors.error_class(code)(code, message, **details)  # type: ignore[arg-type]  # details go to whichever subclass the code picks


def test_field_violations_are_one_line_each_exit_2() -> None:
    """INVALID_ARGUMENT with a BadRequest prints each violation on its own line, exit 2."""
    err = _error(
        grpc.StatusCode.INVALID_ARGUMENT,
        "invalid request (2 violations)",
        field_violations=(
            errors.FieldViolation("prompt", "required"),
            errors.FieldViolation("output.height", "must be even"),
        ),
    )
    assert cli_errors.lines(err, "h:1") == (
        ["error: prompt: required", "error: output.height: must be even"],
        2,
    )


def test_an_unreachable_target_is_named_but_a_servers_unavailable_is_its_own_words() -> None:
    """grpc-core's connect failure names the target tried (exit 1); an UNAVAILABLE the server
    sent (its database away) is printed as the server said it, with the ErrorInfo numbers."""
    refused = _error(
        grpc.StatusCode.UNAVAILABLE,
        "failed to connect to all addresses; last error: Connection refused",
    )
    text, code = cli_errors.lines(refused, "10.0.0.9:50051")
    assert code == 1
    assert text == [
        "error: cannot reach the control plane at 10.0.0.9:50051 (failed to connect to all "
        "addresses; last error: Connection refused)"
    ]
    away = _error(grpc.StatusCode.UNAVAILABLE, "database unavailable: connection reset")
    assert cli_errors.lines(away, "h:1") == (
        ["error: UNAVAILABLE: database unavailable: connection reset"],
        1,
    )
    short = _error(
        grpc.StatusCode.FAILED_PRECONDITION,
        "insufficient credit",
        error_info_reason="INSUFFICIENT_CREDIT",
        error_info_metadata={"available_micros": "10", "required_micros": "500000"},
    )
    assert cli_errors.lines(short, "h:1") == (
        [
            "error: FAILED_PRECONDITION: insufficient credit (INSUFFICIENT_CREDIT: "
            "available_micros=10, required_micros=500000)"
        ],
        1,
    )


@pytest.mark.parametrize(
    "argv",
    [["submit", "--nope"], ["bogus"], ["get"], ["capabilities", "publish", "/no/such/file"]],
)
def test_usage_errors_are_one_line_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown option or command, a missing argument or file: one line, exit 2."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: vidroute")
