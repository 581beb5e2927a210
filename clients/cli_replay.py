"""``vidroute replay``: what a candidate routing policy would have done with recorded traffic.

vidroute replay --policy FILE [--since T] [--until T] [--tenant T] [--json]

Admin. Sends the policy file to RoutingService.ReplayRoutes, which validates it as a
publication (a bad file is one ``error: policy_document.<path>: ...`` line per problem, exit 2)
and re-runs routing over the decisions recorded in ``[since, until)`` (ISO 8601; without a
zone, UTC) without calling any provider. Prints the recorded and the replayed totals side by
side, then the changed decisions; ``--json`` prints the report (proto field names).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from google.protobuf import json_format, timestamp_pb2

from clients.billing_cli import money
from clients.cli_client import channel
from clients.cli_common import connection, connection_options, json_option
from vidroute.scheduler.v1 import routing_pb2, routing_service_pb2, routing_service_pb2_grpc

TIMEOUT_S = 300.0  # a week of decisions is read and re-decided in one call


def _instant(value: str | None, name: str) -> timestamp_pb2.Timestamp | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time", param_hint=name) from None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when if when.tzinfo else when.replace(tzinfo=UTC))
    return ts


def _per_success(t: routing_pb2.ReplayTotals) -> str:
    if not t.cost_per_success_micros:
        return "-"
    high = money(t.cost_per_success_high_micros) if t.cost_per_success_high_micros else "unbounded"
    return f"{money(t.cost_per_success_micros)} [{money(t.cost_per_success_low_micros)} .. {high}]"


def render(report: routing_pb2.ReplayReport) -> str:
    """The report as text: totals side by side, then the changes."""
    rec, rep = report.recorded, report.replayed
    rows = [
        ("policy", rec.policy_version, rep.policy_version),
        ("selected", str(rec.selected), str(rep.selected)),
        ("estimated cost", money(rec.estimated_cost_micros), money(rep.estimated_cost_micros)),
        ("expected success", f"{rec.expected_success:.3f}", f"{rep.expected_success:.3f}"),
        ("expected latency s", f"{rec.expected_latency_s:.1f}", f"{rep.expected_latency_s:.1f}"),
        ("cost per success", _per_success(rec), _per_success(rep)),
    ]
    width = max(len(r[1]) for r in rows)
    lines = [f"{report.decisions} decisions replayed, {report.changed} changed", ""]
    lines.append(f"{'':20}{'RECORDED'.ljust(width)}  REPLAYED")
    lines += [f"{name:20}{a.ljust(width)}  {b}".rstrip() for name, a, b in rows]
    hard = ", ".join(f"{k}: {v}" for k, v in sorted(report.hard_filter_differences.items()))
    lines.append(f"hard-filter differences: {hard or 'none'}")
    if report.shadow_recorded:
        lines.append(
            f"recorded shadow picks agreeing: {report.shadow_agreements}/{report.shadow_recorded}"
        )
    if report.changes:
        lines += ["", "TASK  DECISION  RECORDED  ->  REPLAYED  COST DELTA"]
        lines += [
            f"{c.task_id}  {c.decision_no}  {c.recorded_selected or '-'}  ->  "
            f"{c.replayed_selected or '-'}  {money(c.cost_delta_micros)}"
            for c in report.changes
        ]
        if report.changed > len(report.changes):
            lines.append(f"({report.changed - len(report.changes)} more changes not listed)")
    return "\n".join(lines)


@click.command("replay")
@click.option(
    "--policy",
    "policy_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The candidate routing policy file (YAML or JSON).",
)
@click.option("--since", default=None, help="Only decisions at or after this time (ISO 8601).")
@click.option("--until", default=None, help="Only decisions before this time (default: now).")
@click.option("--tenant", default="", help="Only this tenant's decisions.")
@json_option
@connection_options
def command(
    *,
    policy_file: Path,
    since: str | None,
    until: str | None,
    tenant: str,
    as_json: bool,
    target: str | None,
    tls: bool | None,
    debug: bool,
) -> int:
    """Admin: replay recorded route decisions with a candidate policy (no provider called)."""
    request = routing_service_pb2.ReplayRoutesRequest(
        policy_document=policy_file.read_text(encoding="utf-8"),
        since=_instant(since, "--since"),
        until=_instant(until, "--until"),
        tenant_id=tenant,
    )
    conn = connection(target, tls, debug)
    with channel(conn) as chan:
        stub: Any = routing_service_pb2_grpc.RoutingServiceStub(chan)
        reply = stub.ReplayRoutes(request, timeout=TIMEOUT_S)
    if as_json:
        data = json_format.MessageToDict(reply.report, preserving_proto_field_name=True)
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(render(reply.report))
    return 0
