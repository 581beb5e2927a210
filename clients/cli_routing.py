"""``vidroute routing``: routing policy publication, rollback, versions and canaries.

vidroute routing publish FILE [--dry-run] [--source S]    # validate, then make it active
vidroute routing rollback [VERSION]                      # empty: the version before the active
vidroute routing policies [--json]                       # every version, the active one marked
vidroute routing canaries [--json]                       # stage, traffic, gates, transitions

Admin. A policy file is validated like a capability publication (schema, weights in range,
shadow, the compile check of its samples): a bad file is one ``error: <path>: ...`` line per
problem (exit 2) and nothing changes. A publish or rollback is used by every replica's next
dispatch round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from clients import cli_render as render
from clients.cli_client import channel
from clients.cli_common import api, connection, connection_options, json_option
from clients.cli_documents import print_message, print_published, publish_options, version_line
from clients.cli_quality import print_canaries
from clients.cli_render import when
from vidroute.scheduler.v1 import routing_service_pb2, routing_service_pb2_grpc

TIMEOUT_S = 60.0


@click.group("routing")
def routing() -> None:
    """Admin: routing policies (publish, rollback, versions) and their canaries."""


@routing.command("publish")
@publish_options
@json_option
@connection_options
def publish(
    *,
    file: Path,
    dry_run: bool,
    source: str | None,
    as_json: bool,
    target: str | None,
    tls: bool | None,
    debug: bool,
) -> int:
    """Validate a routing policy file and make it the active version."""
    request = routing_service_pb2.PublishRoutingPolicyRequest(
        document=file.read_text(encoding="utf-8"), source=source or file.name, dry_run=dry_run
    )
    with channel(connection(target, tls, debug)) as chan:
        stub: Any = routing_service_pb2_grpc.RoutingServiceStub(chan)
        policy = stub.PublishRoutingPolicy(request, timeout=TIMEOUT_S).policy
    if as_json:
        print_message(policy)
        return 0
    print_published(policy, dry_run=dry_run, rollback="vidroute routing rollback")
    return 0


@routing.command("rollback")
@click.argument("version", required=False, default="")
@json_option
@connection_options
def rollback(
    *, version: str, as_json: bool, target: str | None, tls: bool | None, debug: bool
) -> int:
    """Make VERSION active again (default: the version published before the active one)."""
    request = routing_service_pb2.RollbackRoutingPolicyRequest(version=version)
    with channel(connection(target, tls, debug)) as chan:
        stub: Any = routing_service_pb2_grpc.RoutingServiceStub(chan)
        policy = stub.RollbackRoutingPolicy(request, timeout=TIMEOUT_S).policy
    if as_json:
        print_message(policy)
        return 0
    print(f"{policy.version}: active")
    return 0


@routing.command("policies")
@json_option
@connection_options
def policies(*, as_json: bool, target: str | None, tls: bool | None, debug: bool) -> int:
    """Every published routing policy version, newest first; * marks the active one."""
    with channel(connection(target, tls, debug)) as chan:
        stub: Any = routing_service_pb2_grpc.RoutingServiceStub(chan)
        reply = stub.ListRoutingPolicies(
            routing_service_pb2.ListRoutingPoliciesRequest(), timeout=TIMEOUT_S
        )
    if as_json:
        print_message(reply)
    elif not reply.policies:
        print("no routing policy published (the configured or built-in one is in use)")
    else:
        print("\n".join(version_line(p) for p in reply.policies))
    return 0


@routing.command("canaries")
@json_option
@connection_options
def canaries(*, as_json: bool, target: str | None, tls: bool | None, debug: bool) -> int:
    """Each canary: traffic share, stages, status, last gate evaluation, then its transitions."""
    with api(target, tls, debug) as client:
        found = client.canaries()
    if as_json:
        render.print_json({"canaries": [render.to_dict(c) for c in found]})
        return 0
    print_canaries(found)
    for c in found:
        for t in c.history:
            print(
                f"{c.candidate_id}  {when(t.at)}  {t.action}  "
                f"{t.from_percent:g}% -> {t.to_percent:g}%  {t.reason}"
            )
    return 0


command = routing
