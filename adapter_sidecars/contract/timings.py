"""The profile's timings from the adapter's own configuration: one source of truth.

The suite must know two durations of the adapter under test: how long a Submit waits for the
provider's answer (``timeouts.submit_read``: stall faults last longer) and how long after a
submit window a recovery search may call a job absent (``submit_read`` plus
``provider.options.recovery_settle_seconds``). Rather than copying them into the profile, the
suite reads them from the configuration file the sidecar runs with, through the sidecar's own
parser, so environment overrides (``VIDROUTE_ADAPTER_SUBMIT_READ_TIMEOUT``) and the time scale
(``VIDROUTE_TIME_SCALE``, which multiplies every duration) apply to both the same way.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from adapter_sidecars.common.config import ConfigError, parse_config
from adapter_sidecars.common.recovery import settle_s
from adapter_sidecars.contract.profile import AdapterProfile


class TimingsError(ValueError):
    """The adapter configuration cannot be read; the message names the file."""


def timings_from_config(
    data: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, float]:
    """``submit_read_timeout_s`` and ``recovery_settle_s`` of a sidecar configuration."""
    config = parse_config(data, os.environ if environ is None else environ)
    return {
        "submit_read_timeout_s": config.timeouts.submit_read,
        "recovery_settle_s": settle_s(config),
    }


def with_timings(
    profile: AdapterProfile, data: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> AdapterProfile:
    """`profile` with the timings of the sidecar configuration `data`."""
    timings = timings_from_config(data, environ)
    return dataclasses.replace(
        profile,
        submit_read_timeout_s=timings["submit_read_timeout_s"],
        recovery_settle_s=timings["recovery_settle_s"],
    )


def with_adapter_config(
    profile: AdapterProfile, path: Path, environ: Mapping[str, str] | None = None
) -> AdapterProfile:
    """`profile` with the timings of the sidecar configuration file at `path`."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TimingsError(f"cannot read adapter config {path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise TimingsError(f"{path}: an adapter config must be a YAML mapping")
    try:
        return with_timings(profile, data, environ)
    except ConfigError as exc:
        raise TimingsError(f"{path}: {exc}") from exc
