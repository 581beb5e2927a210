"""One time-scale factor multiplies every duration of every configuration, keeping their order.

The configurations are the ones production runs: the control plane's defaults (execution,
polling, dispatcher, upkeep, breakers, the adapter client's and lease stores' keyword defaults)
and each shipped sidecar config file. A numeric field that is neither a known count/ratio nor
named like a duration fails `test_every_numeric_setting_is_a_duration_or_a_known_count`, so a
timing added later cannot escape the factor unnoticed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from adapter_sidecars.common.config import ConfigError, SidecarConfig, load_config, parse_config
from controlplane.adapters.grpc_client import GrpcAdapterClient
from controlplane.bootstrap import Settings
from controlplane.domain.breaker import BreakerConfig
from controlplane.domain.scoring import example_policy
from controlplane.execution.callback_server import CallbackLimits
from controlplane.execution.callbacks import CallbackVerifier
from controlplane.execution.config import ExecutionConfig
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.scheduling.dispatcher import DispatcherConfig
from controlplane.scheduling.upkeep import UpkeepConfig
from controlplane.webhooks.delivery import DeliveryConfig
from vidroute_core.settings import SettingsError
from vidroute_core.timescale import (
    TimeScaleError,
    check_factor,
    is_duration_name,
    scale_durations,
    scaled_defaults,
)

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted(ROOT.glob("adapter_sidecars/*/config.example.yaml"))
FACTORS = (0.5, 0.1, 0.05, 0.02, 0.01)
# Settings that are not durations: counts, sizes, ratios, weights, the factor itself. A name
# here is a reviewed decision; anything numeric not named like a duration must be listed.
NOT_DURATIONS = frozenset(
    {
        "max_attempts",  # DeliveryConfig: caller-webhook attempts (a count)
        "multiplier",  # DeliveryConfig: the backoff's growth per attempt (a ratio)
        "accepted",  # CallbackVerifier's counters (metrics, not settings)
        "bad_signature",
        "stale",
        "unknown_provider",
        "baseline_min_samples",  # BreakerConfig: calls before a slow-call baseline exists
        "baseline_quantile",  # ... and which quantile of them it is (a ratio)
        "buckets",
        "hysteresis_delta",
        "max_cost_per_success_micros",
        "max_safety_failure_rate",
        "min_quality_pass_rate",
        "min_success_rate",
        "shares",
        "value_threshold_micros",
        "batch",
        "batch_size",
        "class_weights",
        "compile_cache_bytes",  # the same LRU's bound in bytes (a size)
        "compile_cache_size",  # the dispatcher's compile-verdict LRU bound
        "concurrency",  # ExecutionConfig: sidecar calls in flight per batch
        "write_units",  # ExecutionConfig: transactions a poll round writes in at once
        "consecutive_failures",
        "default_concurrency",
        "default_tenant_weight",
        "failure_rate_threshold",
        "half_open_max_probes",
        "half_open_successes_to_close",
        "jitter_max",
        "learn_min_samples",  # PollingPolicy: finished jobs before their p95 is learned
        "jitter_min",
        "max_aging_bonus",
        "max_cancel_calls",
        "max_estimated_platform_loss_micros",  # money (integer micros), not time
        "max_fetch_attempts",
        "max_body_bytes",  # CallbackLimits: sizes and counts of the callback ingress
        "max_connections",
        "max_head_bytes",
        "max_query_fields",
        "max_output_bytes",
        "max_output_refreshes",
        "max_provider_switches",
        "max_recovery_queries",
        "max_same_candidate_retries",
        "max_total_attempts",
        "min_samples",
        "min_step",  # ProgressThrottle: a fraction of progress, not time
        "near_p95_fraction",
        "plausible_factor",  # PollingPolicy: max plausible as a multiple of the p99
        "quantum",
        "scale",  # PollingPolicy's own multiplier, left at 1: the time scale replaces it
        "scan_limit",
        "shard",
        "shard_count",
        "slow_call_factor",  # BreakerConfig: slow = over this multiple of the baseline
        "slow_call_rate",
        "time_scale",
        "usage_lookup_after_queries",
    }
)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _leaves(obj: Any, path: str) -> Iterator[tuple[str, str, Any, bool]]:
    """(path, field name, value, is a duration) for every numeric setting inside `obj`."""
    for f in dataclasses.fields(obj):
        if not f.init or not f.compare:
            continue
        value, where = getattr(obj, f.name), f"{path}.{f.name}"
        duration = is_duration_name(f.name) or bool(f.metadata.get("duration"))
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, where)
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                yield from _leaves(item, f"{where}[{i}]")
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if _number(item):
                    named = duration or (isinstance(key, str) and is_duration_name(key))
                    yield f"{where}[{key}]", f.name, item, named
        elif isinstance(value, tuple) and value and all(_number(v) for v in value):
            for i, item in enumerate(value):
                yield f"{where}[{i}]", f.name, item, duration
        elif _number(value) or (duration and value is not None):
            yield where, f.name, value, duration


def _keyword_leaves(fn: Any, path: str) -> Iterator[tuple[str, str, Any, bool]]:
    import inspect

    for name, param in inspect.signature(fn).parameters.items():
        if param.default is not param.empty and _number(param.default):
            yield f"{path}({name})", name, param.default, is_duration_name(name)


def _sidecar(path: Path, environ: Mapping[str, str] | None = None) -> SidecarConfig:
    return load_config(path, environ or {})


def _control_plane(factor: float) -> list[Any]:
    return [
        scale_durations(config, factor)
        for config in (
            ExecutionConfig(),
            CallbackLimits(),
            DispatcherConfig(),
            UpkeepConfig(),
            BreakerConfig(),
            DeliveryConfig(),
            Settings(),
            example_policy("timescale-test"),
        )
    ]


KEYWORD_CONFIGURED = (GrpcAdapterClient, RedisLeaseStore, MemoryLeaseStore, CallbackVerifier)


def _all_durations(factor: float) -> dict[str, float]:
    """Every duration production configures, scaled by `factor`, by path."""
    out: dict[str, float] = {}
    for config in _control_plane(factor):
        for where, _, value, duration in _leaves(config, type(config).__name__):
            if duration:
                out[where] = value
    for fn in KEYWORD_CONFIGURED:
        for name, value in scaled_defaults(fn, factor).items():
            if value is not None:  # "not set": derived elsewhere (e.g. from the sidecar)
                out[f"{fn.__name__}({name})"] = value
    for path in SHIPPED:
        scale = {"VIDROUTE_TIME_SCALE": str(factor)} if factor != 1.0 else {}
        config = _sidecar(path, scale)
        for where, _, value, duration in _leaves(config, path.parent.name):
            if duration:
                out[where] = value
    return out


def test_shipped_sidecar_configs_exist() -> None:
    """The shipped sidecar configs are found, so the checks below are not vacuous."""
    assert {p.parent.name for p in SHIPPED} >= {"runway", "veo", "selfhosted"}


def test_every_numeric_setting_is_a_duration_or_a_known_count() -> None:
    """No numeric setting of any production configuration is a timing the factor misses."""
    unclassified = []
    configs: list[tuple[str, Any]] = [(type(c).__name__, c) for c in _control_plane(1.0)]
    configs += [(p.parent.name, _sidecar(p)) for p in SHIPPED]
    leaves = [leaf for name, config in configs for leaf in _leaves(config, name)]
    leaves += [leaf for fn in KEYWORD_CONFIGURED for leaf in _keyword_leaves(fn, fn.__name__)]
    for where, name, _value, duration in leaves:
        if not duration and name not in NOT_DURATIONS:
            unclassified.append(where)
    assert not unclassified, (
        "numeric settings neither named like a duration (_s, _ms, _seconds, or SECONDS "
        f"metadata) nor listed as a count/ratio: {unclassified}"
    )


@pytest.mark.parametrize("factor", FACTORS)
def test_every_duration_is_multiplied_by_the_factor(factor: float) -> None:
    """Each duration at factor f is f times its production value (integer ms rounded, >= 1)."""
    production, scaled = _all_durations(1.0), _all_durations(factor)
    assert set(production) == set(scaled)
    assert len(production) > 40, sorted(production)  # the walk really found the timings
    wrong = {}
    for where, value in production.items():
        want = value * factor
        got = scaled[where]
        if isinstance(value, int) and where.split("(")[-1].rstrip(")").endswith("_ms"):
            ok = isinstance(got, int) and got == max(1, round(want))
        else:
            ok = math.isclose(got, want, rel_tol=1e-9)
        if not ok:
            wrong[where] = (value, got)
    assert not wrong, wrong


@pytest.mark.parametrize("factor", FACTORS)
def test_the_order_of_every_pair_of_durations_is_kept(factor: float) -> None:
    """For every two durations of control plane and sidecars, the smaller one stays smaller."""
    production, scaled = _all_durations(1.0), _all_durations(factor)
    flipped = []
    for a, b in itertools.combinations(sorted(production), 2):
        before = (production[a] > production[b]) - (production[a] < production[b])
        after = (scaled[a] > scaled[b]) - (scaled[a] < scaled[b])
        if before != after:
            flipped.append((a, production[a], b, production[b]))
    assert not flipped, flipped[:10]


@pytest.mark.parametrize("raw", ["0", "-0.5", "1.5", "nan", "inf", "fast", ""])
def test_a_factor_outside_zero_to_one_is_refused(raw: str) -> None:
    """The factor must be a number greater than 0 and at most 1; anything else is refused."""
    with pytest.raises(TimeScaleError, match="time scale"):
        check_factor(raw or None)


def test_control_plane_reads_the_factor_from_its_environment() -> None:
    """VIDROUTE_TIME_SCALE sets the control plane's factor; an invalid one stops the start."""
    assert Settings.from_env({}).time_scale == 1.0
    assert Settings.from_env({"VIDROUTE_TIME_SCALE": "0.02"}).time_scale == 0.02
    with pytest.raises(SettingsError, match="VIDROUTE_TIME_SCALE='2'"):
        Settings.from_env({"VIDROUTE_TIME_SCALE": "2"})


def test_sidecar_environment_beats_the_file_and_scales_every_timing() -> None:
    """A sidecar's ``time_scale`` key scales its file; VIDROUTE_TIME_SCALE wins over the key."""
    data = {
        "provider": {
            "base_url": "http://127.0.0.1:1",
            "options": {"recovery_settle_seconds": 30, "api_version": "2024-11-06"},
        },
        "timeouts": {"submit_read": 60},
        "time_scale": 0.5,
        "accounts": [{"name": "a", "credential_ref": "env:K:-k"}],
    }
    from_file = parse_config(data, {})
    assert from_file.time_scale == 0.5
    assert from_file.timeouts.submit_read == 30.0
    assert from_file.provider_options == {
        "recovery_settle_seconds": 15.0,
        "api_version": "2024-11-06",
    }
    assert from_file.shutdown_grace_seconds == 5.0
    from_env = parse_config(data, {"VIDROUTE_TIME_SCALE": "0.02"})
    assert from_env.time_scale == 0.02
    assert from_env.timeouts.submit_read == pytest.approx(1.2)
    assert from_env.probe_interval_seconds == pytest.approx(0.2)
    assert from_env.account("a") is not None
    with pytest.raises(ConfigError, match="VIDROUTE_TIME_SCALE"):
        parse_config(data, {"VIDROUTE_TIME_SCALE": "0"})


def test_no_production_configuration_sets_the_factor() -> None:
    """Neither a shipped sidecar config nor a Kubernetes manifest sets a time scale."""
    manifests = sorted((ROOT / "k8s").rglob("*.yaml"))
    assert manifests, "the k8s manifests were not found"
    setting = [
        str(path.relative_to(ROOT))
        for path in [*SHIPPED, *manifests]
        if "time_scale" in path.read_text(encoding="utf-8").lower()
    ]
    assert not setting, f"production configuration sets the time scale: {setting}"
    assert all(_sidecar(path).time_scale == 1.0 for path in SHIPPED)
