"""Every shipped configuration gives Submit a control-plane deadline longer than the sidecar's own
submit budget, and keeps submit outcomes at least as long as the control plane recovers.

Shipped configurations: each sidecar's ``config.example.yaml`` (what ``make up`` and the devstack
run), the sidecar ConfigMaps under ``k8s/base``, at production time (scale 1) and at the
devstack's time scale. The control plane's deadline is what `GrpcAdapterClient` derives from the
sidecar's declared budget with its shipped margin, computed by the same functions it uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter_sidecars.common.config import SidecarConfig, parse_config
from adapter_sidecars.common.types import ProviderAdapter
from adapter_sidecars.runway.adapter import RunwayAdapter
from adapter_sidecars.selfhosted.adapter import build_adapter as build_selfhosted
from adapter_sidecars.veo.surfaces import build_adapter as build_veo
from adapter_sidecars.veo.vertex import VertexAdapter
from clients.devstack import DEV_TIME_SCALE
from controlplane.adapters.grpc_client import (
    GrpcAdapterClient,
    SubmitDeadlineTooShort,
    submit_deadline_s,
)
from controlplane.execution.config import ExecutionConfig
from vidroute_core.timescale import scale_durations, scaled_defaults

ROOT = Path(__file__).resolve().parents[2]
# The adapter each sidecar builds from its config, as its `__main__` does.
ADAPTERS: dict[str, Callable[[SidecarConfig], ProviderAdapter]] = {
    "runway": RunwayAdapter.from_config,
    "veo": build_veo,  # the k8s ConfigMap holds a Gemini and a Vertex account
    "selfhosted": build_selfhosted,  # the k8s ConfigMap runs the Cog backend
    "vertex": VertexAdapter.from_config,  # the Veo sidecar's Vertex AI example (no ConfigMap)
    "cog": build_selfhosted,  # the self-hosted sidecar's Cog example (its ConfigMap: above)
}
#: Adapters whose example is not ``<name>/config.example.yaml``.
EXAMPLES = {
    "vertex": Path("adapter_sidecars/veo/config.vertex.example.yaml"),
    "cog": Path("adapter_sidecars/selfhosted/config.cog.example.yaml"),
}


def _shipped() -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for name in ADAPTERS:
        example = ROOT / EXAMPLES.get(name, Path("adapter_sidecars", name, "config.example.yaml"))
        found.append((name, str(example.relative_to(ROOT)), yaml.safe_load(example.read_text())))
        if name in EXAMPLES:
            continue
        configmap = ROOT / "k8s" / "base" / f"adapter-{name}" / "configmap.yaml"
        embedded = yaml.safe_load(configmap.read_text())["data"]["config.yaml"]
        found.append((name, str(configmap.relative_to(ROOT)), yaml.safe_load(embedded)))
    return found


SHIPPED = _shipped()
SCALES = sorted({1.0, DEV_TIME_SCALE})


def _budget(name: str, data: dict[str, Any], scale: float) -> tuple[float, float]:
    """(submit budget, journal retention) of the sidecar `data` configures, at `scale`."""
    config = parse_config(data, {"VIDROUTE_TIME_SCALE": str(scale)})
    adapter = ADAPTERS[name](config)
    try:
        return adapter.describe().submit_budget_s, config.submit_journal_retention_s
    finally:
        asyncio.run(adapter.aclose())


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize(("name", "source", "data"), SHIPPED, ids=[s[1] for s in SHIPPED])
def test_control_plane_outwaits_the_sidecar(
    name: str, source: str, data: dict[str, Any], scale: float
) -> None:
    """The Submit deadline the control plane derives is longer than the sidecar's budget."""
    budget, _ = _budget(name, data, scale)
    margin = scaled_defaults(GrpcAdapterClient, scale)["submit_margin_s"]
    deadline = submit_deadline_s(budget, margin_s=margin)
    assert budget > 0, f"{source}: no submit budget"
    assert deadline > budget, f"{source}: Submit deadline {deadline} s <= budget {budget} s"


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize(("name", "source", "data"), SHIPPED, ids=[s[1] for s in SHIPPED])
def test_journal_outlives_the_recovery_window(
    name: str, source: str, data: dict[str, Any], scale: float
) -> None:
    """The sidecar keeps submit outcomes at least as long as recovery of an unknown submit runs."""
    _, retention = _budget(name, data, scale)
    execution = scale_durations(ExecutionConfig(), scale)
    window = max(execution.unknown_recovery_deadline_s, execution.max_unknown_age_s)
    assert retention >= window, f"{source}: journal keeps {retention} s < recovery {window} s"


def test_a_configured_deadline_shorter_than_the_budget_is_refused() -> None:
    """An operator's explicit Submit deadline below the sidecar's budget is refused, not used."""
    with pytest.raises(SubmitDeadlineTooShort):
        submit_deadline_s(80.0, margin_s=5.0, configured_s=30.0)
    assert submit_deadline_s(80.0, margin_s=5.0, configured_s=90.0) == 90.0
    assert submit_deadline_s(80.0, margin_s=5.0) == 85.0
