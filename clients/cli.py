"""The `vidroute` command line.

vidroute up                 the whole platform on embedded defaults, in the foreground
vidroute serve              only the control plane (gRPC on VIDROUTE_LISTEN)
vidroute migrate [--down]   apply (or revert) database migrations
vidroute submit ...         create a task            vidroute get TASK_ID   show a task
vidroute balance | ledger | credit | costs   money (clients.billing_cli)
vidroute reconcile [--date YYYY-MM-DD]      daily bill reconciliation (clients.reconcile_cli)

Client commands send ``VIDROUTE_TOKEN`` as their bearer token (`clients.auth`); `vidroute up`
prints a dev admin and a dev tenant token and leaves them under ./var, where the client commands
find the admin one when ``VIDROUTE_TOKEN`` is unset.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc
from google.protobuf import json_format

from clients import auth as client_auth
from clients import billing_cli, reconcile_cli
from vidroute.common.v1 import generation_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2, scheduler_service_pb2_grpc

log = logging.getLogger("vidroute")
DEFAULT_TARGET = "localhost:50051"
_MODES = {
    name.removeprefix("MODE_").lower().replace("_", "-"): name
    for name in generation_pb2.Mode.keys()  # noqa: SIM118 - an enum wrapper, not a dict
    if name != "MODE_UNSPECIFIED"
}


def _write_port_file(path: str, port: int) -> None:
    """Written last and atomically: a harness that sees the file can connect."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(str(port))
    os.replace(tmp, path)


DEV_PROVIDER_PORTS = {"runway": 8101, "veo": 8102, "selfhosted": 8103}
DEV_ADAPTER_PORTS = {"runway": 50061, "veo": 50062, "selfhosted": 50063}
DEV_PROVIDER_NAMES = {"runway": "runway", "veo": "google", "selfhosted": "self_hosted"}
DEV_TENANT = "acme"  # the tenant of the dev tenant token `vidroute up` prints
DEV_METRICS_PORT = 9464  # the control plane's /metrics under `vidroute up`


async def _serve(
    listen: str | None,
    port_file: str | None,
    *,
    whole_stack: bool,
    ephemeral_ports: bool = False,
) -> int:
    import dataclasses

    from clients.devstack import Supervisor, start_stack
    from controlplane.bootstrap import Settings, configure_logging, start_control_plane
    from controlplane.server import serve_until_signalled

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
    environ = dict(os.environ)
    if whole_stack and not environ.get("VIDROUTE_AUTH_TOKENS") and not environ.get("VIDROUTE_AUTH"):
        # `make up` runs authenticated, with tokens made for this run.
        environ.update(client_auth.write_dev_tokens(Path("var"), DEV_TENANT))
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


async def _migrate(down: bool) -> int:
    from controlplane.bootstrap import Settings
    from controlplane.persistence.migrate import downgrade, upgrade

    settings = Settings.from_env()
    await (downgrade(settings.database_url) if down else upgrade(settings.database_url))
    return 0


def _print_task(task: object, as_json: bool) -> None:
    data = json_format.MessageToDict(task, preserving_proto_field_name=True)  # type: ignore[arg-type]
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    print(f"task {data['task_id']}  {data.get('state', '')}  tenant={data['spec']['tenant_id']}")
    for att in data.get("attempts", []):
        print(
            f"  attempt {att['attempt_no']}: {att.get('provider', '')}/{att.get('model', '')} "
            f"{att.get('state', '')}"
        )
    if "output" in data:
        print(f"  output: {data['output'].get('uri', '')}")


def _submit(args: argparse.Namespace) -> int:
    spec = generation_pb2.GenerationSpec(
        tenant_id=args.tenant,
        user_id=args.user,
        prompt=args.prompt,
        mode=generation_pb2.Mode.Value(_MODES[args.mode]),
        output=generation_pb2.OutputSpec(
            width=args.width, height=args.height, duration_ms=int(args.duration * 1000)
        ),
    )
    key = args.idempotency_key or uuid.uuid4().hex
    with client_auth.channel(args.target, client_auth.token_from_env()) as channel:
        stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
        response = stub.CreateTask(
            scheduler_service_pb2.CreateTaskRequest(spec=spec, idempotency_key=key), timeout=10
        )
    _print_task(response.task, args.json)
    return 0


def _get(args: argparse.Namespace) -> int:
    with client_auth.channel(args.target, client_auth.token_from_env()) as channel:
        stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
        response = stub.GetTask(
            scheduler_service_pb2.GetTaskRequest(task_id=args.task_id), timeout=10
        )
    _print_task(response.task, args.json)
    return 0


def _explain_rows(decision: dict[str, object]) -> list[str]:
    """One decision as a fixed-width table: candidate, eligible, score, cost, reason."""
    lines = [
        f"decision {decision.get('decision_no', '?')}  {decision.get('reason_code', '')}  "
        f"policy={decision.get('policy_version', '')}  "
        f"capability={decision.get('capability_version', '')}",
        f"  selected: {decision.get('selected_candidate') or '-'}"
        + (
            f"   shadow: {decision['shadow_selected_candidate']}"
            if decision.get("shadow_selected_candidate")
            else ""
        ),
        f"  {'CANDIDATE':<48} {'OK':<3} {'SCORE':>7} {'COST':>10}  REASON",
    ]
    candidates = decision.get("candidates", [])
    assert isinstance(candidates, list)
    ranked = sorted(candidates, key=lambda c: (not c.get("eligible"), -c.get("score", 0.0)))
    for c in ranked:
        cost = c.get("estimated_cost", {}).get("amount_micros")
        money = f"{int(cost) / 1e6:.2f}" if cost is not None else "-"
        score = f"{c.get('score', 0.0):.3f}" if c.get("eligible") else "-"
        reason = (
            ""
            if c.get("eligible")
            else f"{c.get('reject_reason', '')}: {c.get('reject_detail', '')}"
        )
        lines.append(
            f"  {c.get('candidate_id', ''):<48} {'yes' if c.get('eligible') else 'no':<3} "
            f"{score:>7} {money:>10}  {reason}"
        )
    return lines


def _explain(args: argparse.Namespace) -> int:
    with client_auth.channel(args.target, client_auth.token_from_env()) as channel:
        stub = scheduler_service_pb2_grpc.SchedulerServiceStub(channel)
        response = stub.ExplainRoute(
            scheduler_service_pb2.ExplainRouteRequest(task_id=args.task_id), timeout=10
        )
    data = json_format.MessageToDict(response, preserving_proto_field_name=True)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    decisions = data.get("decisions", [])
    if not decisions:
        print(f"task {args.task_id}: no routing decision yet")
    for decision in decisions:
        print("\n".join(_explain_rows(decision)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vidroute", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("up", "run the whole platform on embedded defaults (foreground)"),
        ("serve", "run only the control plane"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--listen", default=None, help="host:port (default VIDROUTE_LISTEN)")
        cmd.add_argument("--port-file", default=None, help="write the bound port here when ready")
    sub.choices["up"].add_argument(
        "--ephemeral-ports",
        action="store_true",
        help="run emulators and sidecars on free ports instead of 8101-8103 / 50061-50063",
    )
    migrate = sub.add_parser("migrate", help="apply database migrations")
    migrate.add_argument("--down", action="store_true", help="revert every migration")
    for name in ("submit", "get", "explain"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--target", default=DEFAULT_TARGET, help="control plane host:port")
        cmd.add_argument("--json", action="store_true", help="print JSON")
    submit = sub.choices["submit"]
    submit.add_argument("--tenant", required=True)
    submit.add_argument("--user", default="")
    submit.add_argument("--prompt", required=True)
    submit.add_argument("--mode", choices=sorted(_MODES), default="text-to-video")
    submit.add_argument("--duration", type=float, default=4.0, help="seconds")
    submit.add_argument("--width", type=int, default=1280)
    submit.add_argument("--height", type=int, default=720)
    submit.add_argument("--idempotency-key", default="")
    sub.choices["get"].add_argument("task_id")
    sub.choices["explain"].add_argument("task_id")
    billing_cli.add_commands(sub, DEFAULT_TARGET)  # balance, ledger, credit, costs
    reconcile_cli.add_commands(sub)  # reconcile [--date YYYY-MM-DD]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command in ("up", "serve"):
            return asyncio.run(
                _serve(
                    args.listen,
                    args.port_file,
                    whole_stack=args.command == "up",
                    ephemeral_ports=getattr(args, "ephemeral_ports", False),
                )
            )
        if args.command == "migrate":
            return asyncio.run(_migrate(args.down))
        if args.command == "submit":
            return _submit(args)
        if args.command == "explain":
            return _explain(args)
        if args.command in billing_cli.COMMANDS:
            return billing_cli.run(args)
        if args.command in reconcile_cli.COMMANDS:
            return reconcile_cli.run(args)
        return _get(args)
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
