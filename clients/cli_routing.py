"""``vidroute routing``: routing policy publication, rollback, versions and canaries.

vidroute routing publish FILE [--dry-run] [--source S]    # validate, show the diff, make active
        [--at TIME | --staged] [--reason R]               # ...at TIME, or later by `activate`
vidroute routing activate VERSION [--at TIME] [--reason R]  # a staged version, now or at TIME
vidroute routing rollback [VERSION] [--reason R]         # empty: the version before the active
vidroute routing policies [--json]                       # every version, the active one marked
vidroute routing history [--json]                        # every activation: who, when, why
vidroute routing canaries [--json]                       # stage, traffic, gates, transitions

Admin. A policy file is validated like a capability publication (schema, weights in range,
shadow, the compile check of its samples): a bad file is one ``error: <path>: ...`` line per
problem (exit 2) and nothing changes. A publish or rollback is used by every replica's next
dispatch round.
"""

from __future__ import annotations

from typing import Any

import click

from clients import cli_render as render
from clients.cli_client import channel
from clients.cli_common import api, connection, connection_options, json_option
from clients.cli_documents import (
    DocumentRpcs,
    activation_line,
    add_release_commands,
    print_message,
    version_line,
)
from clients.cli_quality import print_canaries
from clients.cli_render import when
from vidroute.scheduler.v1 import routing_service_pb2, routing_service_pb2_grpc

TIMEOUT_S = 60.0


@click.group("routing")
def routing() -> None:
    """Admin: routing policies (publish, rollback, versions) and their canaries."""


@routing.command("history")
@json_option
@connection_options
def history(*, as_json: bool, target: str | None, tls: bool | None, debug: bool) -> int:
    """Every activation of a routing policy version, oldest first: when, who, which version,
    the one it replaced, when asked (if not then) and why; pending scheduled ones included."""
    with channel(connection(target, tls, debug)) as chan:
        stub: Any = routing_service_pb2_grpc.RoutingServiceStub(chan)
        reply = stub.ListRoutingPolicyActivations(
            routing_service_pb2.ListRoutingPolicyActivationsRequest(), timeout=TIMEOUT_S
        )
    if as_json:
        print_message(reply)
    elif not reply.activations:
        print("no routing policy activated (the configured or built-in one is in use)")
    else:
        print("\n".join(activation_line(a) for a in reply.activations))
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


def _stub(chan: Any) -> Any:
    return routing_service_pb2_grpc.RoutingServiceStub(chan)


add_release_commands(
    routing,
    "routing policy",
    DocumentRpcs(
        publish_request=routing_service_pb2.PublishRoutingPolicyRequest,
        publish=lambda chan, r: _stub(chan).PublishRoutingPolicy(r, timeout=TIMEOUT_S),
        activate_request=routing_service_pb2.ActivateRoutingPolicyRequest,
        activate=lambda chan, r: _stub(chan).ActivateRoutingPolicy(r, timeout=TIMEOUT_S),
        rollback_request=routing_service_pb2.RollbackRoutingPolicyRequest,
        rollback=lambda chan, r: _stub(chan).RollbackRoutingPolicy(r, timeout=TIMEOUT_S),
        version=lambda reply: reply.policy,
    ),
)
command = routing
