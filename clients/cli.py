"""The `vidroute` command line (click, rich): the platform itself and a client of its API.

    vidroute up [--ephemeral-ports]      the whole platform on embedded defaults, in the foreground
    vidroute serve                       only the control plane (gRPC on VIDROUTE_LISTEN)
    vidroute migrate [--down]            apply (or revert) database migrations
    vidroute submit --tenant T --prompt P [--mode M --first-frame URI ...] [--spec FILE] [--wait]
    vidroute get | watch | explain | cancel TASK_ID       vidroute list [--tenant T --state S]
    vidroute download TASK_ID [-o FILE] [--sample N]      vidroute url TASK_ID (presigned)
    vidroute webhooks TASK_ID                             caller webhook deliveries
    vidroute providers | breakers | health | force-breaker | capabilities publish FILE [--dry-run]
    vidroute feedback TASK_ID accepted|rejected|regenerated [--tag T --comment C]
    vidroute quality [--model M]                           quality signals (clients.cli_quality)
    vidroute balance | ledger | credit | costs            money (clients.billing_cli)
    vidroute reconcile [--date YYYY-MM-DD]                daily bill reconciliation
    vidroute usage import FILE [--account A]              a provider's bill file (Cloud Billing)
    vidroute disputes list | open ROW_ID | move ID STATE  booked losses and their disputes
    vidroute replay --policy FILE [--since --until --tenant]   route replay (clients.cli_replay)
    vidroute routing publish FILE | rollback [VERSION] | policies | canaries   (clients.cli_routing)
    vidroute tenants get [VERSION] | publish FILE | rollback [VERSION] | history  (cli_tenants)
    vidroute accounts get [VERSION] | publish FILE | rollback [VERSION] | history | usage
                                                                      (clients.cli_accounts)

Client commands connect to ``--target``, else ``VIDROUTE_TARGET``, else the config file
(`clients.cli_config`: ``$VIDROUTE_CONFIG`` or ``~/.config/vidroute/config.toml`` with target,
token, tls), else localhost:8051; they send ``VIDROUTE_TOKEN`` (or the file's token, or the dev
admin token `vidroute up` leaves under ./var) as their bearer token. Tables by default, ``--json``
on every read command. Errors are one line each on stderr (`clients.cli_errors`): a bad spec one
line per field violation and exit code 2, an unreachable server the target tried and exit 1;
tracebacks only with ``--debug`` (or ``VIDROUTE_DEBUG`` set). ``vidroute COMMAND --help``
documents every option; ``eval "$(_VIDROUTE_COMPLETE=bash_source vidroute)"`` completes them.
"""

from __future__ import annotations

import os

# grpc-core writes its own log lines to stderr (a failed TLS handshake is three "I... Handshake
# failed" lines before our one error line); below ERROR they are noise for a person. Read once,
# when grpc loads: so before any import below. GRPC_VERBOSITY set by the caller still wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import asyncio
import functools
import logging
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
import grpc

from clients import auth as client_auth
from clients import (
    billing_cli,
    cli_accounts,
    cli_admin,
    cli_errors,
    cli_quality,
    cli_replay,
    cli_routing,
    cli_tasks,
    cli_tenants,
    disputes_cli,
    reconcile_cli,
    usage_cli,
)
from clients.cli_common import State
from clients.cli_config import DEFAULT_TARGET, ConfigError
from clients.cli_spec import SpecError
from clients.dev_webhooks import ensure_dev_webhooks
from clients.sdk import errors as sdk_errors
from vidroute_core.settings import ControlPlaneEnv, SettingsError

if TYPE_CHECKING:  # the control plane is imported only by the commands that run it
    from controlplane.bootstrap import Settings

log = logging.getLogger("vidroute")
__all__ = ["DEFAULT_TARGET", "app", "main"]


def _write_port_file(path: str, port: int) -> None:
    """Written last and atomically: a harness that sees the file can connect."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(str(port))
    os.replace(tmp, path)


DEV_PROVIDER_PORTS = {"runway": 8101, "veo": 8102, "selfhosted": 8103}
DEV_ADAPTER_PORTS = {"runway": 8061, "veo": 8062, "selfhosted": 8063}
DEV_PROVIDER_NAMES = {"runway": "runway", "veo": "google", "selfhosted": "self_hosted"}
DEV_TENANT = "acme"  # the tenant of the dev tenant token `vidroute up` prints
DEV_METRICS_PORT = 9464  # the control plane's /metrics under `vidroute up`
DEV_CONSOLE_PORT = 8088  # the web console under `vidroute up`


async def _serve(
    listen: str | None,
    port_file: str | None,
    *,
    whole_stack: bool,
    ephemeral_ports: bool = False,
) -> int:
    import dataclasses

    from clients.devstack import Supervisor, publish_examples, start_stack
    from controlplane.bootstrap import Settings, configure_logging, start_control_plane
    from controlplane.server import serve_until_signalled

    # The declared names and values first: `up` reads a few of them itself just below.
    ControlPlaneEnv.load(os.environ)
    overrides: dict[str, object] = {"listen": listen}
    supervisor = None
    scale = 1.0
    if whole_stack:  # one time scale for the control plane and every child of the dev stack
        from clients.devstack import callback_settings, time_scale

        scale = time_scale(os.environ)
        overrides["time_scale"] = scale
        # The provider callback ingress runs too (the emulators' webhooks land on it).
        overrides.update(
            callback_settings(os.environ, DEV_PROVIDER_NAMES.values(), ephemeral_ports)
        )
        # `up` is read by a person in a terminal; `serve` and the sidecars log JSON for machines.
        overrides["log_format"] = os.environ.get("VIDROUTE_LOG_FORMAT") or "text"
        # /metrics of every process (9.24); sidecars: clients.devstack.DEV_METRICS_PORTS.
        overrides["metrics_listen"] = os.environ.get("VIDROUTE_METRICS_LISTEN") or (
            "127.0.0.1:0" if ephemeral_ports else f"127.0.0.1:{DEV_METRICS_PORT}"
        )
        # The read-only web console (controlplane.console); sign in with the dev tokens.
        overrides["console_listen"] = os.environ.get("VIDROUTE_CONSOLE_LISTEN") or (
            "127.0.0.1:0" if ephemeral_ports else f"127.0.0.1:{DEV_CONSOLE_PORT}"
        )
    environ = dict(os.environ)
    if whole_stack:
        _refuse_if_taken(Settings.from_env(environ, **overrides))
    if whole_stack and not environ.get("VIDROUTE_AUTH_TOKENS") and not environ.get("VIDROUTE_AUTH"):
        # `make up` runs authenticated, with tokens made for this run.
        environ.update(client_auth.write_dev_tokens(Path("var"), DEV_TENANT))
    if whole_stack:  # `--webhook-url` works on `make up` (clients.dev_webhooks)
        environ.update(ensure_dev_webhooks(Path("var"), DEV_TENANT, environ))
    settings = Settings.from_env(environ, **overrides)
    configure_logging(settings.log_level, settings.log_format)
    if whole_stack:
        supervisor = Supervisor(Path("var"))
        provider_ports = {k: 0 if ephemeral_ports else v for k, v in DEV_PROVIDER_PORTS.items()}
        adapter_ports = {k: 0 if ephemeral_ports else v for k, v in DEV_ADAPTER_PORTS.items()}
        try:
            adapters = await asyncio.to_thread(
                functools.partial(
                    start_stack, supervisor, provider_ports, adapter_ports, scale=scale
                )
            )
        except Exception:
            supervisor.stop_all()
            raise
        settings = dataclasses.replace(
            settings,
            adapters={DEV_PROVIDER_NAMES[name]: addr for name, addr in adapters.items()},
        )
    try:
        running = await start_control_plane(settings)
        if whole_stack:  # the example tenants and account limits, so they show at once
            await publish_examples(settings.database_url)
        # The process is set up: freeze its start-up heap for the dispatcher (issue 10). Here,
        # in the process's entry point, not in a library call a test or embedder makes.
        from controlplane.scheduling.heap import tune_gc

        tune_gc()
        host = settings.listen.rsplit(":", 1)[0]
        log.info(
            "control plane serving on %s:%d (database %s)",
            host,
            running.port,
            settings.database_url.split("@")[-1],
        )
        if port_file:
            _write_port_file(port_file, running.port)
        await serve_until_signalled(running)
    finally:
        if supervisor is not None:
            await asyncio.to_thread(supervisor.stop_all)
    return 0


def _refuse_if_taken(settings: Settings) -> None:
    """`vidroute up` where one already runs refuses before it writes anything under ./var: the
    dev tokens it would write are what the running stack's CLI users authenticate with, and
    its emulators and sidecars would start for nothing (`start_control_plane` checks again)."""
    from controlplane.bootstrap import check_ports, configure_logging
    from controlplane.startup import check_sqlite_free

    configure_logging(settings.log_level, settings.log_format)
    check_sqlite_free(settings.database_url)
    check_ports(settings, engine=True)  # the stack's adapters are not in `settings` yet


async def _migrate(down: bool) -> int:
    """Migrate; a database that does not answer is one line naming it, exit 69 as `serve`."""
    from controlplane.bootstrap import Settings
    from controlplane.persistence.errors import is_outage
    from controlplane.persistence.migrate import downgrade, upgrade
    from controlplane.startup import database_outage

    settings = Settings.from_env()
    try:
        await (downgrade(settings.database_url) if down else upgrade(settings.database_url))
    except Exception as exc:
        if not is_outage(exc):
            raise
        raise _Unavailable(database_outage(settings.database_url, exc)) from exc
    return 0


class _Unavailable(click.ClickException):
    """A service the command needs does not answer (sysexits EX_UNAVAILABLE, as `serve`)."""

    exit_code = 69


_LISTEN_HELP = "host:port to listen on (default VIDROUTE_LISTEN)."
_PORT_FILE_HELP = "Write the bound port to this file once serving."


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show a traceback on errors.")
@click.pass_context
def app(ctx: click.Context, debug: bool) -> None:
    """vidroute: route AI video generation across providers."""
    if not isinstance(ctx.obj, State):
        ctx.obj = State()
    ctx.obj.debug = ctx.obj.debug or debug


@app.command("up")
@click.option("--listen", default=None, help=_LISTEN_HELP)
@click.option("--port-file", default=None, help=_PORT_FILE_HELP)
@click.option(
    "--ephemeral-ports",
    is_flag=True,
    help="Run emulators and sidecars on free ports instead of 8101-8103 / 8061-8063.",
)
def up(listen: str | None, port_file: str | None, ephemeral_ports: bool) -> int:
    """Run the whole platform on embedded defaults (foreground)."""
    return asyncio.run(_serve(listen, port_file, whole_stack=True, ephemeral_ports=ephemeral_ports))


@app.command("serve")
@click.option("--listen", default=None, help=_LISTEN_HELP)
@click.option("--port-file", default=None, help=_PORT_FILE_HELP)
def serve(listen: str | None, port_file: str | None) -> int:
    """Run only the control plane."""
    return asyncio.run(_serve(listen, port_file, whole_stack=False))


@app.command("migrate")
@click.option("--down", is_flag=True, help="Revert every migration.")
def migrate(down: bool) -> int:
    """Apply database migrations (VIDROUTE_DATABASE_URL)."""
    return asyncio.run(_migrate(down))


for _command in (
    *cli_tasks.COMMANDS,
    *cli_admin.COMMANDS,
    *cli_quality.COMMANDS,
    *billing_cli.commands(),
    reconcile_cli.command,
    usage_cli.command,
    disputes_cli.command,
    cli_replay.command,
    cli_routing.command,
    cli_tenants.command,
    cli_accounts.command,
):
    app.add_command(_command)


def _error(lines: Sequence[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure becomes lines on stderr and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    state = State(debug="--debug" in args or bool(os.environ.get("VIDROUTE_DEBUG")))
    try:
        # standalone_mode=False: click returns (or raises) instead of exiting, so the failures
        # below become our lines; it still answers shell completion (_VIDROUTE_COMPLETE).
        result = app.main(args, prog_name="vidroute", standalone_mode=False, obj=state)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "vidroute"
        _error([f"error: {where}: {exc.format_message()} (see {where} --help)"])
        return exc.exit_code
    except click.ClickException as exc:
        _error([f"error: {exc.format_message()}"])
        return exc.exit_code
    except click.exceptions.Abort:
        return 130
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vidroute list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (SpecError, ConfigError) as exc:
        _error([f"error: {exc}"])
        return cli_errors.EXIT_USAGE
    except SettingsError as exc:  # the environment: one line naming the variable
        _error([f"error: {exc}"])
        return cli_errors.EXIT_CONFIG
    except (grpc.RpcError, sdk_errors.VidrouteError) as exc:
        if state.debug:
            traceback.print_exc()
        lines, code = cli_errors.lines(exc, state.target or DEFAULT_TARGET)
        _error(lines)
        return code
    except Exception as exc:
        if state.debug:
            raise
        _error([f"error: {type(exc).__name__}: {exc}", "(run with --debug for the traceback)"])
        return cli_errors.EXIT_FAILED
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
