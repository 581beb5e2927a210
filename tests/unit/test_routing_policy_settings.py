"""VIDROUTE_ROUTING_POLICY_FILE: the policy used before any publication, validated at start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.bootstrap import Settings
from controlplane.domain import scoring
from controlplane.domain.routing.selection import RouterConfig
from controlplane.scheduling.policy_book import PolicyBook

WEIGHTS = {
    "quality": 0.1,
    "success": 0.2,
    "latency": 0.1,
    "cost": 0.4,
    "capacity": 0.1,
    "region": 0.05,
    "preference": 0.05,
}


def test_unset_means_the_built_in_policy() -> None:
    """Without the variable no file policy is configured (bootstrap uses the example)."""
    assert Settings.from_env({}).routing_policy is None


def test_a_policy_file_is_parsed_with_its_shadow(tmp_path: Path) -> None:
    """A valid file becomes the fallback of the round view, its shadow policy included, with
    the deployment's transform (the time scale) applied to both."""
    path = tmp_path / "policy.yaml"
    shadow = {"version": "file-shadow", "weights": {"default": WEIGHTS}}
    body = {"version": "file-v1", "weights": {"default": WEIGHTS}, "min_dwell_s": 40}
    path.write_text(json.dumps({**body, "shadow": shadow}))
    settings = Settings.from_env({"VIDROUTE_ROUTING_POLICY_FILE": str(path)})
    assert settings.routing_policy is not None
    book = PolicyBook(
        db=None,  # type: ignore[arg-type]  # the fallback is built without the database
        base=RouterConfig(policy=scoring.example_policy("builtin")),
        fallback=settings.routing_policy,
        transform=lambda p: scoring.RoutingPolicy(p.version, p.weights, min_dwell_s=1.0),
    )
    assert book.fallback.policy.version == "file-v1"
    assert book.fallback.policy.min_dwell_s == 1.0
    assert book.fallback.shadow_policy is not None
    assert book.fallback.shadow_policy.version == "file-shadow"


def test_a_bad_policy_file_refuses_the_start(tmp_path: Path) -> None:
    """A file with problems is a ValueError naming the variable, the file and each problem."""
    path = tmp_path / "bad.yaml"
    path.write_text("version: v1\nweights: {default: {quality: 2}}\nhysteresis_delta: 9\n")
    with pytest.raises(ValueError, match="VIDROUTE_ROUTING_POLICY_FILE") as info:
        Settings.from_env({"VIDROUTE_ROUTING_POLICY_FILE": str(path)})
    assert "weights.default: missing weights" in str(info.value)
    assert "hysteresis_delta: must be in [0, 1]" in str(info.value)


def test_the_shipped_example_file_is_the_built_in_policy() -> None:
    """controlplane/routing_policy.example.yaml parses, with the built-in example's weights."""
    path = Path(__file__).resolve().parents[2] / "controlplane" / "routing_policy.example.yaml"
    doc = Settings.from_env({"VIDROUTE_ROUTING_POLICY_FILE": str(path)}).routing_policy
    assert doc is not None
    assert dict(doc.policy.weights) == dict(scoring.example_policy().weights)
    assert doc.shadow is not None
    assert len(doc.samples) == 1
