"""What the rendered overlays turn on (issue 21): caller webhooks signed from a mounted Secret,
traces exported to the collector, one dispatcher shard per control-plane replica, and an
environment every program accepts at start (declared names, valid values)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from controlplane.bootstrap import Settings
from controlplane.domain.accounts import parse_accounts_document
from controlplane.domain.tenants import parse_tenants_document
from tests.unit.k8s.test_manifests import (
    DOCUMENTS,
    ENVOY,
    MODEL_SERVER,
    OTEL,
    OVERLAYS,
    RECONCILE,
    Doc,
    by_kind,
    pod_spec,
    rendered,
    workloads,
)
from vidroute_core import tracing
from vidroute_core.settings import ControlPlaneEnv, SidecarEnv, check_names

WEBHOOKS_SECRET = "vidroute-webhooks"
CONTROL_PLANE_PODS = ("controlplane", RECONCILE)


def _containers(pod: Doc) -> list[Doc]:
    containers: list[Doc] = pod["containers"]
    return containers


def _plain_env(container: Doc) -> dict[str, str]:
    """The container's variables that have a literal value (not a Secret reference)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _otel(docs: list[Doc]) -> tuple[str, dict[str, str]]:
    """(rendered name, data) of the OpenTelemetry ConfigMap."""
    [(name, configmap)] = [
        (n, d) for n, d in by_kind(docs, "ConfigMap").items() if n.startswith(f"{OTEL}-")
    ]
    return name, dict(configmap["data"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_control_plane_signs_webhooks_with_a_mounted_secret(overlay: str) -> None:
    """VIDROUTE_WEBHOOKS_FILE names a file of the `vidroute-webhooks` Secret, mounted read-only
    (0440) in the control plane and its reconcile job, so tenants can name webhooks."""
    for name, pod in workloads(rendered(overlay)).items():
        if name not in CONTROL_PLANE_PODS:
            continue
        [container] = _containers(pod)
        path = Path(_plain_env(container)["VIDROUTE_WEBHOOKS_FILE"])
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
        assert mount["readOnly"] is True
        volume = {v["name"]: v for v in pod["volumes"]}[mount["name"]]
        assert volume["secret"]["secretName"] == WEBHOOKS_SECRET
        assert volume["secret"]["defaultMode"] == 0o440
        assert "optional" not in volume["secret"]  # named, so it must exist (the start checks)
        assert [i["path"] for i in volume["secret"]["items"]] == [path.name]


def test_the_documented_webhooks_secret_is_what_the_control_plane_reads(tmp_path: Path) -> None:
    """The file the k8s README tells the operator to put in the Secret gives its tenant a
    signing secret."""
    readme = (Path(__file__).resolve().parents[3] / "k8s" / "README.md").read_text()
    example = readme.split("cat > webhooks.yaml <<EOF\n", 1)[1].split("EOF\n", 1)[0]
    document = example.replace("$(openssl rand -base64 32)", "A" * 43 + "=")
    assert yaml.safe_load(document)["tenants"]
    (tmp_path / "webhooks.yaml").write_text(document)
    settings = Settings.from_env({"VIDROUTE_WEBHOOKS_FILE": str(tmp_path / "webhooks.yaml")})
    assert settings.webhooks.secret_for("acme") == "whsec_" + "A" * 43 + "="


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_vidroute_pod_exports_traces_to_the_collector(overlay: str) -> None:
    """Every vidroute container (not Envoy, not the Cog model server) takes the OTEL_* ConfigMap,
    which turns OTLP export on towards one collector endpoint and names the environment."""
    docs = rendered(overlay)
    otel_name, data = _otel(docs)
    for name, pod in workloads(docs).items():
        if name in (ENVOY, MODEL_SERVER):
            continue
        for container in _containers(pod):
            assert {"configMapRef": {"name": otel_name}} in container.get("envFrom", []), name
    assert data["OTEL_TRACES_EXPORTER"] == "otlp"
    assert data["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith(("http://", "https://"))
    assert data["OTEL_RESOURCE_ATTRIBUTES"] == f"deployment.environment={overlay}"
    assert "OTEL_SDK_DISABLED" not in data
    try:  # the variables as `vidroute_core.tracing` reads them: traces on
        assert tracing.configure_tracing("vidroute-controlplane", data) is True
    finally:
        provider = tracing.uninstall()
        if provider is not None:
            provider.shutdown()


def shard_mismatch(docs: list[Doc]) -> str | None:
    """Why the control plane's dispatcher shards do not match its replicas (None: they do)."""
    deployment = by_kind(docs, "Deployment")["controlplane"]
    replicas = int(deployment["spec"].get("replicas", 1))
    [container] = _containers(pod_spec(deployment))
    shards = int(_plain_env(container).get("VIDROUTE_SHARD_COUNT", "1"))
    return None if shards == replicas else f"{replicas} replicas, {shards} shards"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_control_plane_replica_leads_a_shard(overlay: str) -> None:
    """VIDROUTE_SHARD_COUNT equals the control plane's replicas: every replica dispatches."""
    assert shard_mismatch(rendered(overlay)) is None


def test_the_shard_rule_catches_replicas_without_shards() -> None:
    """Three replicas on the default single shard (the old prod overlay) fail the rule."""
    docs = copy.deepcopy(rendered("prod"))
    [container] = _containers(pod_spec(by_kind(docs, "Deployment")["controlplane"]))
    container["env"] = [e for e in container["env"] if e["name"] != "VIDROUTE_SHARD_COUNT"]
    assert shard_mismatch(docs) == "3 replicas, 1 shards"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_program_accepts_its_rendered_environment(overlay: str) -> None:
    """Every VIDROUTE_* name a pod sets is declared, and its literal values validate against
    its program's declarations (file paths aside: they exist only in the pod)."""
    docs = rendered(overlay)
    for name, pod in workloads(docs).items():
        if name in (ENVOY, MODEL_SERVER):  # not vidroute programs
            continue
        program = ControlPlaneEnv if name in CONTROL_PLANE_PODS else SidecarEnv
        for container in _containers(pod):
            names = {e["name"] for e in container.get("env", [])}
            check_names(dict.fromkeys(names, "set"))
            values = {k: v for k, v in _plain_env(container).items() if not k.endswith("_FILE")}
            program.load(values)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tenants_and_accounts_documents_ship_as_a_mounted_configmap(overlay: str) -> None:
    """VIDROUTE_TENANTS_FILE and VIDROUTE_ACCOUNTS_FILE name the files of the generated
    `vidroute-documents` ConfigMap, mounted read-only in the control plane and its reconcile
    job; each file is a document the control plane accepts at start."""
    docs = rendered(overlay)
    [(configmap_name, configmap)] = [
        (n, d) for n, d in by_kind(docs, "ConfigMap").items() if n.startswith(f"{DOCUMENTS}-")
    ]
    parsers: dict[str, Callable[[str], object]] = {
        "VIDROUTE_TENANTS_FILE": parse_tenants_document,
        "VIDROUTE_ACCOUNTS_FILE": parse_accounts_document,
    }
    for name, pod in workloads(docs).items():
        if name not in CONTROL_PLANE_PODS:
            continue
        [container] = _containers(pod)
        for variable, parse in parsers.items():
            path = Path(_plain_env(container)[variable])
            [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
            assert mount["readOnly"] is True
            volume = {v["name"]: v for v in pod["volumes"]}[mount["name"]]
            assert volume["configMap"]["name"] == configmap_name
            parse(configmap["data"][path.name])  # raises on a document the start refuses


def test_shipped_account_documents_name_the_shipped_sidecar_accounts() -> None:
    """Every account the example accounts document lists is one a shipped example sidecar
    config configures, and every account of the k8s document one the k8s sidecar ConfigMaps
    configure, under the provider name its capabilities publish (a typo would limit nothing)."""
    root = Path(__file__).resolve().parents[3]
    examples, in_cluster = set(), set()
    for package in ("runway", "veo", "selfhosted"):
        sidecar = root / "adapter_sidecars" / package
        [capabilities] = sidecar.glob("capabilities/*.yaml")
        provider = next(yaml.safe_load_all(capabilities.read_text()))["provider"]
        config = yaml.safe_load((sidecar / "config.example.yaml").read_text())
        examples |= {(provider, a["name"]) for a in config["accounts"]}
        configmap = yaml.safe_load(
            (root / "k8s" / "base" / f"adapter-{package}" / "configmap.yaml").read_text()
        )
        config = yaml.safe_load(configmap["data"]["config.yaml"])
        in_cluster |= {(provider, a["name"]) for a in config["accounts"]}
    for path, configured in (
        (root / "controlplane" / "accounts.example.yaml", examples),
        (root / "k8s" / "base" / "controlplane" / "documents" / "accounts.yaml", in_cluster),
    ):
        accounts = parse_accounts_document(path.read_text())
        listed = {(k.provider, k.account) for k in accounts.accounts}
        assert listed == configured, path
