"""The routing policy file (design 9.25.5): what it accepts, and every violation it names."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain import scoring
from controlplane.domain.routing.policy_document import (
    WEIGHT_NAMES,
    PolicyDocumentError,
    parse_policy_document,
)
from vidroute_core.exceptions import InvalidSpec

DEFAULT = {
    "quality": 0.28,
    "success": 0.22,
    "latency": 0.18,
    "cost": 0.14,
    "capacity": 0.10,
    "region": 0.04,
    "preference": 0.04,
}
CANDIDATE = "runway/gen4_turbo/default"
FULL = f"""
version: router-v2
description: cheaper batch
weights:
  default: {json.dumps(DEFAULT)}
  BATCH: {{quality: 0.2, success: 0.24, latency: 0.04, cost: 0.32, capacity: 0.16,
          region: 0.02, preference: 0.02}}
hysteresis_delta: 0.05
min_dwell_s: 30
canary:
  gates: {{min_success_rate: 0.9, max_success_drop: 0.1}}
canaries:
  "{CANDIDATE}":
    stages: [0.5, 2, 5, 10]
    gates: {{min_samples: 20, max_cost_per_success_ratio: 1.2}}
shadow:
  version: router-v2-shadow
  weights:
    default: {{quality: 0.1, success: 0.1, latency: 0.1, cost: 0.5, capacity: 0.1,
              region: 0.05, preference: 0.05}}
samples:
  - tenant_id: t1
    prompt: a cat on a skateboard
    mode: TEXT_TO_VIDEO
    output: {{width: 1280, height: 720, duration_ms: 5000}}
"""


def fields_of(text: str) -> dict[str, str]:
    with pytest.raises(PolicyDocumentError) as info:
        parse_policy_document(text)
    return {v.field: v.description for v in info.value.violations}


def doc(**overrides: object) -> str:
    body: dict[str, object] = {"version": "v1", "weights": {"default": DEFAULT}}
    body.update(overrides)
    return json.dumps(body)


def test_full_document_becomes_the_domain_policy() -> None:
    """Every section of a valid YAML document lands in the RoutingPolicy and PolicyDocument."""
    d = parse_policy_document(FULL)
    assert d.policy.version == "router-v2"
    assert d.policy.weights_for("BATCH").cost == 0.32
    assert d.policy.weights_for("INTERACTIVE") == scoring.ScoreWeights(**DEFAULT)
    assert (d.policy.hysteresis_delta, d.policy.min_dwell_s) == (0.05, 30.0)
    spec = d.canaries[CANDIDATE]
    assert spec.config.shares == (0.005, 0.02, 0.05, 0.10)
    assert spec.percents == (0.5, 2.0, 5.0, 10.0)
    assert spec.config.gates.min_samples == 20
    assert spec.config.gates.min_success_rate == 0.9  # inherited from the canary defaults
    assert spec.vs_incumbent.max_success_drop == 0.1
    assert spec.vs_incumbent.max_cost_per_success_ratio == 1.2
    assert d.policy.canaries[CANDIDATE] == spec.config
    assert d.shadow is not None
    assert d.shadow.version == "router-v2-shadow"
    assert d.shadow.weights_for("default").cost == 0.5
    assert d.samples[0].prompt == "a cat on a skateboard"
    assert d.description == "cheaper batch"


def test_json_is_accepted_and_shadow_may_name_a_version() -> None:
    """A JSON document parses the same way; a string shadow is a version for the service."""
    d = parse_policy_document(doc(shadow="router-v1"))
    assert d.shadow is None
    assert d.shadow_version == "router-v1"
    assert d.policy.canaries == {}


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        ("", "document", "required"),
        ("version: [", "document", "line 1"),
        ("a: &x 1\nb: *x", "document", "aliases"),
        ("- 1\n- 2", "document", "mapping"),
        (json.dumps({"weights": {"default": DEFAULT}}), "version", "required"),
        (doc(version="has space"), "version", "identifier"),
        (json.dumps({"version": "v"}), "weights", "required"),
        (doc(weights={"BATCH": DEFAULT}), "weights", "default"),
        (doc(weights={"default": {"quality": 1.0}}), "weights.default", "missing"),
        (doc(weights={"default": {**DEFAULT, "speed": 0.1}}), "weights.default.speed", "unknown"),
        (doc(weights={"default": {**DEFAULT, "cost": "0.14"}}), "weights.default.cost", "number"),
        (doc(weights={"default": {**DEFAULT, "cost": 0.5}}), "weights.default", "sum to 1"),
        (doc(hysteresis_delta=2), "hysteresis_delta", "[0, 1]"),
        (doc(min_dwell_s=-1), "min_dwell_s", "[0, 86400]"),
        (doc(colour="red"), "colour", "unknown field"),
        (doc(canaries={"c": {"stages": [2, 1]}}), "canaries.c.stages[1]", "increasing"),
        (doc(canaries={"c": {"stages": [0, 1]}}), "canaries.c.stages[0]", "positive"),
        (doc(canaries={"c": {"stages": [50, 150]}}), "canaries.c.stages[1]", "[0, 100]"),
        (doc(canaries={"c": {"stages": []}}), "canaries.c.stages", "list"),
        (doc(canaries={"a:b": {"gates": {"min_success_rate": 1.5}}}),
         'canaries["a:b"].gates.min_success_rate', "[0, 1]"),
        (doc(canaries={"c": {"gates": {"min_samples": 0}}}), "canaries.c.gates.min_samples", "[1,"),
        (doc(canaries={"c": {"gates": {"max_cost_per_success_ratio": 0.5}}}),
         "canaries.c.gates.max_cost_per_success_ratio", "[1, 1000]"),
        (doc(canaries={"c": {"gates": {"p99": 1}}}), "canaries.c.gates.p99", "unknown"),
        (doc(canaries={"a b": {}}), 'canaries["a b"]', "whitespace"),
        (doc(shadow={"version": "v1", "weights": {"default": DEFAULT}}),
         "shadow.version", "differ"),
        (doc(shadow={"version": "s", "weights": {"default": DEFAULT}, "shadow": "x"}),
         "shadow.shadow", "unknown"),
        (doc(samples=[{"prompt": "p"}]), "samples[0]", "GenerationSpec"),
        (doc(samples=[{"tenant_id": "t", "prompt": "", "mode": "TEXT_TO_VIDEO",
                       "output": {"width": 1280, "height": 720, "duration_ms": 5000}}]),
         "samples[0].prompt", ""),
    ],
)  # fmt: skip
def test_each_problem_is_one_field_violation(text: str, path: str, words: str) -> None:
    """A bad document is refused with a field violation at the path of the problem."""
    found = fields_of(text)
    assert path in found, found
    assert words in found[path]


def test_every_problem_is_reported_at_once() -> None:
    """Several problems in one document come back together, as an InvalidSpec."""
    text = doc(version="bad version", hysteresis_delta=-1, canaries={"c": {"stages": [3, 3]}})
    with pytest.raises(InvalidSpec) as info:
        parse_policy_document(text)
    assert {v.field for v in info.value.violations} == {
        "version",
        "hysteresis_delta",
        "canaries.c.stages[1]",
    }


unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(st.lists(unit, min_size=len(WEIGHT_NAMES), max_size=len(WEIGHT_NAMES)))
def test_weights_in_range_summing_to_one_are_accepted(raw: list[float]) -> None:
    """Any weights in [0, 1] normalised to sum 1 are accepted and kept as given."""
    total = math.fsum(raw)
    if total == 0:
        raw, total = [1.0] + [0.0] * (len(WEIGHT_NAMES) - 1), 1.0
    weights = dict(zip(WEIGHT_NAMES, (w / total for w in raw), strict=True))
    d = parse_policy_document(doc(weights={"default": weights}))
    got = d.policy.weights_for("default")
    assert all(getattr(got, n) == weights[n] for n in WEIGHT_NAMES)


@given(
    st.sampled_from(WEIGHT_NAMES),
    st.one_of(
        st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
        st.floats(min_value=1.000001, allow_nan=False, allow_infinity=False),
    ),
)
def test_a_weight_out_of_range_is_refused_at_its_path(name: str, value: float) -> None:
    """A weight below 0 or above 1 is refused, naming that weight."""
    found = fields_of(doc(weights={"default": {**DEFAULT, name: value}}))
    assert "must be in [0, 1]" in found[f"weights.default.{name}"]
