"""A routing policy file (design 9.13, 9.13.5, 9.25.4, 9.25.5): text in, a validated policy out.

The document is YAML or JSON, one mapping::

    version: router-2026-12          # required; what decisions record as policy_version
    weights:                         # required; ``default`` required; each set sums to 1
      default: {quality: 0.28, success: 0.22, latency: 0.18, cost: 0.14,
                capacity: 0.10, region: 0.04, preference: 0.04}
      INTERACTIVE: {...}             # a service class or scenario name
    hysteresis_delta: 0.03           # [0, 1]
    min_dwell_s: 60                  # [0, 86400]
    canary:                          # defaults every entry of ``canaries`` starts from
      stages: [0.5, 2, 5, 10]        # percent of traffic per stage, increasing, in (0, 100]
      gates: {min_samples: 50, min_success_rate: 0.95, max_p95_latency_s: 300, ...}
      value_threshold_micros: 5000000
    canaries:                        # candidate id -> its stages and gates (over the defaults)
      runway/gen4_turbo/default: {stages: [0.5, 2, 5, 10], gates: {...}}
    shadow: router-v1                # a published version, or an inline policy (no shadow,
                                     # canaries or samples of its own): recorded, never run
    samples:                         # specs the publication compiles against the catalog
      - {tenant_id: t, prompt: p, mode: TEXT_TO_VIDEO, output: {...}}

Gates (every one optional, defaults from `scoring.CanaryGates`): ``min_samples``,
``min_success_rate``, ``max_p95_latency_s``, ``max_safety_failure_rate``,
``max_cost_per_success_micros``, ``min_quality_pass_rate`` (absolute), and against the
incumbent (the best non-canary candidate over the same window): ``max_success_drop`` (incumbent
success rate minus the canary's), ``max_p95_latency_ratio`` and ``max_cost_per_success_ratio``.

Every problem is reported at once as `PolicyDocumentError` (an `InvalidSpec`, so the gRPC
boundary answers INVALID_ARGUMENT with one field violation each, paths like
``weights.BATCH.cost`` or ``canaries["x"].stages[2]``). Pure: no I/O, no catalog; the compile
check of ``samples`` is the publication service's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from controlplane.domain import scoring
from controlplane.domain.documents import Checker, load_document
from vidroute_core.codec import spec_from_dict
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.spec import GenerationSpec
from vidroute_core.validation import IDENTIFIER_RE, validate_spec

MAX_DOCUMENT_CHARS = 1_000_000
MAX_VERSION_CHARS = 64
MAX_SAMPLES = 100
MAX_CANARIES = 64
MAX_STAGES = 10
MAX_DWELL_S = 86_400.0
WEIGHT_SUM_TOLERANCE = 1e-3
WEIGHT_NAMES = tuple(f.name for f in fields(scoring.ScoreWeights))
_TOP = frozenset(
    {"version", "weights", "hysteresis_delta", "min_dwell_s", "canary", "canaries", "shadow"}
    | {"samples", "description"}
)
_SHADOW_TOP = _TOP - {"canaries", "shadow", "samples"}
_RATES = ("min_success_rate", "max_safety_failure_rate", "min_quality_pass_rate")
_RATE_DELTAS = ("max_success_drop",)
_RATIOS = ("max_p95_latency_ratio", "max_cost_per_success_ratio")


class PolicyDocumentError(InvalidSpec):
    """The policy file is refused; `violations` names every problem, by path in the document."""


@dataclass(frozen=True, slots=True)
class IncumbentGates:
    """Gates relative to the incumbent; None switches one off."""

    max_success_drop: float | None = 0.05
    max_p95_latency_ratio: float | None = 2.0
    max_cost_per_success_ratio: float | None = 1.5


@dataclass(frozen=True, slots=True)
class CanarySpec:
    """One candidate's canary: stages as shares (0.005 for 0.5 %), absolute and relative gates."""

    candidate_id: str
    config: scoring.CanaryConfig
    vs_incumbent: IncumbentGates = IncumbentGates()

    @property
    def percents(self) -> tuple[float, ...]:
        return tuple(round(s * 100, 6) for s in self.config.shares)


@dataclass(frozen=True)
class PolicyDocument:
    """A validated policy file. ``shadow`` is inline or None; ``shadow_version`` names a
    published version the service resolves (exactly one of them, or neither)."""

    policy: scoring.RoutingPolicy
    canaries: Mapping[str, CanarySpec] = field(default_factory=dict)
    shadow: scoring.RoutingPolicy | None = None
    shadow_version: str = ""
    samples: tuple[GenerationSpec, ...] = ()
    description: str = ""


class _Check(Checker):
    """`Checker` with this document's readers."""

    def number(self, data: Mapping[str, Any], key: str, path: str, lo: float, hi: float) -> float:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.bad(path, f"must be a number, got {type(value).__name__}")
            return lo
        if not math.isfinite(value) or not lo <= value <= hi:
            self.bad(path, f"must be in [{lo:g}, {hi:g}], got {value!r}")
            return lo
        return float(value)

    def mapping(self, value: Any, path: str, allowed: frozenset[str] | None) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.bad(path or "document", f"must be a mapping, got {type(value).__name__}")
            return {}
        for key in value:
            if not isinstance(key, str):
                self.bad(path, f"key {key!r} must be a string")
            elif allowed is not None and key not in allowed:
                self.bad(_join(path, key), f"unknown field (known: {', '.join(sorted(allowed))})")
        return {k: v for k, v in value.items() if isinstance(k, str)}


def _join(path: str, key: str) -> str:
    simple = IDENTIFIER_RE.fullmatch(key) and ":" not in key and "." not in key
    step = f".{key}" if simple else f'["{key}"]'
    return f"{path}{step}" if path else step.lstrip(".")


def parse_policy_document(text: str) -> PolicyDocument:
    """The document in `text` (YAML or JSON) validated whole; `PolicyDocumentError` otherwise."""
    return policy_document_from_mapping(
        load_document(text, MAX_DOCUMENT_CHARS, PolicyDocumentError)
    )


def policy_document_from_mapping(data: Any) -> PolicyDocument:
    """As `parse_policy_document`, for a document already loaded."""
    check = _Check()
    top = check.mapping(data, "", _TOP)
    policy = _policy(check, top, "")
    canary_defaults = policy.canary
    canaries: dict[str, CanarySpec] = {}
    if "canaries" in top:
        default_vs = IncumbentGates()
        if "canary" in top:  # its violations are already reported by `_policy`
            default_vs = _canary_config(_Check(), top["canary"], "canary", canary_defaults)[1]
        canaries = _canaries(check, top["canaries"], canary_defaults, default_vs)
    shadow, shadow_version = None, ""
    if "shadow" in top:
        value = top["shadow"]
        if isinstance(value, str):
            shadow_version = _version(check, value, "shadow")
        else:
            inline = check.mapping(value, "shadow", _SHADOW_TOP)
            if inline:
                shadow = _policy(check, inline, "shadow")
                if shadow.version == policy.version:
                    check.bad("shadow.version", "must differ from the policy's own version")
    samples = _samples(check, top["samples"]) if "samples" in top else ()
    description = top.get("description", "")
    if not isinstance(description, str):
        check.bad("description", "must be a string")
        description = ""
    if check.found:
        raise PolicyDocumentError(check.found)
    policy = replace(policy, canaries={cid: c.config for cid, c in canaries.items()})
    return PolicyDocument(policy, canaries, shadow, shadow_version, samples, description)


def _version(check: _Check, value: Any, path: str) -> str:
    if not isinstance(value, str) or not IDENTIFIER_RE.fullmatch(value):
        check.bad(path, "must be an identifier: letters, digits, '_', '.', '-', at most 64")
        return ""
    return value


def _policy(check: _Check, top: Mapping[str, Any], prefix: str) -> scoring.RoutingPolicy:

    def at(key: str) -> str:
        return f"{prefix}.{key}" if prefix else key

    if "version" not in top:
        check.bad(at("version"), "is required")
    version = _version(check, top.get("version", "x"), at("version")) or "invalid"
    weights: dict[str, scoring.ScoreWeights] = {}
    if "weights" not in top:
        check.bad(at("weights"), "is required (with a default set)")
    else:
        sets = check.mapping(top["weights"], at("weights"), None)
        if sets and "default" not in sets:
            check.bad(at("weights"), "must include a default set")
        for name, body in sets.items():
            path = _join(at("weights"), name)
            if not IDENTIFIER_RE.fullmatch(name):
                check.bad(path, "a set is named by a service class or scenario identifier")
            weights[name] = _weights(check, body, path)
    defaults = scoring.RoutingPolicy(version)
    delta = defaults.hysteresis_delta
    if "hysteresis_delta" in top:
        delta = check.number(top, "hysteresis_delta", at("hysteresis_delta"), 0.0, 1.0)
    dwell = defaults.min_dwell_s
    if "min_dwell_s" in top:
        dwell = check.number(top, "min_dwell_s", at("min_dwell_s"), 0.0, MAX_DWELL_S)
    canary = defaults.canary
    if "canary" in top:
        canary = _canary_config(check, top["canary"], at("canary"), canary)[0]
    return scoring.RoutingPolicy(
        version, weights or {"default": scoring.ScoreWeights()}, delta, dwell, canary
    )


def _weights(check: _Check, body: Any, path: str) -> scoring.ScoreWeights:
    values = check.mapping(body, path, frozenset(WEIGHT_NAMES))
    missing = [n for n in WEIGHT_NAMES if n not in values]
    if missing:
        check.bad(path, f"missing weights: {', '.join(missing)}")
        return scoring.ScoreWeights()
    before = len(check.found)
    got = {n: check.number(values, n, f"{path}.{n}", 0.0, 1.0) for n in WEIGHT_NAMES}
    if len(check.found) > before:
        return scoring.ScoreWeights()
    total = math.fsum(got.values())
    if abs(total - 1.0) > WEIGHT_SUM_TOLERANCE:
        check.bad(path, f"weights must sum to 1 (±{WEIGHT_SUM_TOLERANCE:g}), got {total:.6g}")
    return scoring.ScoreWeights(**got)


def _canary_config(
    check: _Check,
    body: Any,
    path: str,
    base: scoring.CanaryConfig,
    vs: IncumbentGates | None = None,
) -> tuple[scoring.CanaryConfig, IncumbentGates]:
    vs = vs or IncumbentGates()
    data = check.mapping(body, path, frozenset({"stages", "gates", "value_threshold_micros"}))
    shares = base.shares
    if "stages" in data:
        shares = _stages(check, data["stages"], f"{path}.stages") or shares
    threshold = base.value_threshold_micros
    if "value_threshold_micros" in data:
        threshold = check.integer(
            data["value_threshold_micros"], f"{path}.value_threshold_micros", 0, 10**15
        )
    gates = base.gates
    if "gates" in data:
        gates, vs = _gates(check, data["gates"], f"{path}.gates", gates, vs)
    return scoring.CanaryConfig(shares, gates, threshold, base.buckets), vs


def _stages(check: _Check, value: Any, path: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_STAGES:
        check.bad(path, f"must be a list of 1 to {MAX_STAGES} percentages")
        return ()
    before = len(check.found)
    percents = [
        check.number({"v": v}, "v", f"{path}[{i}]", 0.0, 100.0) for i, v in enumerate(value)
    ]
    if len(check.found) > before:
        return ()
    for i, p in enumerate(percents):
        if p <= 0 or (i and p <= percents[i - 1]):
            check.bad(f"{path}[{i}]", "stages must be positive and strictly increasing")
            return ()
    return tuple(p / 100.0 for p in percents)


def _gates(
    check: _Check, body: Any, path: str, base: scoring.CanaryGates, vs: IncumbentGates
) -> tuple[scoring.CanaryGates, IncumbentGates]:
    absolute = {f.name for f in fields(scoring.CanaryGates)}
    relative = {f.name for f in fields(IncumbentGates)}
    data = check.mapping(body, path, frozenset(absolute | relative))
    got_abs: dict[str, Any] = {}
    got_rel: dict[str, Any] = {}
    for key in data:
        where = f"{path}.{key}"
        if key == "min_samples":
            got_abs[key] = check.integer(data[key], where, 1, 10**9)
        elif key == "max_cost_per_success_micros":
            got_abs[key] = check.integer(data[key], where, 0, 10**15)
        elif key == "max_p95_latency_s":
            got_abs[key] = check.number(data, key, where, 0.0, 7 * MAX_DWELL_S)
        elif key in _RATES:
            got_abs[key] = check.number(data, key, where, 0.0, 1.0)
        elif key in relative:
            if data[key] is None:
                got_rel[key] = None
            elif key in _RATE_DELTAS:
                got_rel[key] = check.number(data, key, where, 0.0, 1.0)
            elif key in _RATIOS:
                got_rel[key] = check.number(data, key, where, 1.0, 1000.0)
    return replace(base, **got_abs), replace(vs, **got_rel)


def _canaries(
    check: _Check, value: Any, defaults: scoring.CanaryConfig, default_vs: IncumbentGates
) -> dict[str, CanarySpec]:
    entries = check.mapping(value, "canaries", None)
    if len(entries) > MAX_CANARIES:
        check.bad("canaries", f"at most {MAX_CANARIES} candidates")
    out = {}
    for cid, body in entries.items():
        path = _join("canaries", cid)
        if not cid or len(cid) > 256 or any(ch.isspace() for ch in cid):
            check.bad(path, "a candidate id (provider/model/account), no whitespace")
        given = body if body is not None else {}
        config, vs = _canary_config(check, given, path, defaults, default_vs)
        out[cid] = CanarySpec(cid, config, vs)
    return out


def _samples(check: _Check, value: Any) -> tuple[GenerationSpec, ...]:
    if not isinstance(value, list) or len(value) > MAX_SAMPLES:
        check.bad("samples", f"must be a list of at most {MAX_SAMPLES} specs")
        return ()
    out = []
    for i, body in enumerate(value):
        path = f"samples[{i}]"
        if not isinstance(body, Mapping):
            check.bad(path, "must be a GenerationSpec mapping")
            continue
        try:
            spec = spec_from_dict(dict(body))
        except (KeyError, ValueError, TypeError) as exc:
            check.bad(path, f"not a GenerationSpec: {type(exc).__name__} {exc}")
            continue
        for v in validate_spec(spec):
            check.bad(f"{path}.{v.field}", v.description)
        out.append(spec)
    return tuple(out)
