"""One factor that compresses every duration of a configuration together (``VIDROUTE_TIME_SCALE``).

Shortening one timeout at a time changes the order of deadlines and windows: a control plane
that gives up on a Submit before its sidecar does loses an accepted job, a recovery settle of 0
proves absence before a late job could appear. A test that must run faster than production
therefore multiplies *every* duration by the same factor in (0, 1], so that every comparison
between two of them comes out as it does in production.

What is a duration is read from the configuration's own field names, so a field added later is
scaled without touching this module:

* a field whose name ends in ``_s``, ``_ms`` or ``_seconds``, or whose dataclass field metadata
  is `SECONDS` (for names that are durations without saying so, like ``Timeouts.connect``);
* its value may be a number, ``None``, a tuple of numbers (a schedule of steps) or a mapping of
  numbers (per-model seconds);
* nested frozen dataclasses (and tuples of them) are scaled recursively, and in a mapping that is
  not itself a duration (adapter ``options``) the entries whose *key* is a duration name are.

Integer milliseconds stay integers (``lease_ttl_ms`` goes to Redis ``PX``), rounded and never
below 1, so a positive duration never becomes "no wait"; integer seconds (``30`` in a YAML file)
become floats, because rounding them would make 30 s and 31 s equal. Production configurations
never set the factor; it defaults to 1.0.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

__all__ = [
    "DURATION_SUFFIXES",
    "SECONDS",
    "TimeScaleError",
    "check_factor",
    "is_duration_name",
    "scale_durations",
    "scale_value",
    "scaled_defaults",
]

DURATION_SUFFIXES = ("_s", "_ms", "_seconds")
# Field metadata for a duration whose name does not carry a unit suffix.
SECONDS: Mapping[str, Any] = MappingProxyType({"duration": True})

T = TypeVar("T")


class TimeScaleError(ValueError):
    """The factor is not a number in (0, 1]."""


def check_factor(raw: object, source: str = "time scale") -> float:
    """`raw` as a factor in (0, 1]; anything else is a `TimeScaleError` naming `source`."""
    try:
        factor = float(raw)  # type: ignore[arg-type]  # float() of anything; TypeError is the check
    except (TypeError, ValueError):
        raise TimeScaleError(f"{source} must be a number, got {raw!r}") from None
    if not math.isfinite(factor) or not 0.0 < factor <= 1.0:
        raise TimeScaleError(f"{source} must be > 0 and <= 1, got {raw!r}")
    return factor


def is_duration_name(name: str) -> bool:
    """Does a configuration key name a duration (``claim_lease_s``, ``ttl_ms``, ...)?"""
    return name.endswith(DURATION_SUFFIXES)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _scale_number(value: int | float, factor: float, integer: bool) -> int | float:
    if isinstance(value, int) and integer:
        return 0 if value == 0 else max(1, round(value * factor))
    return value * factor


def scale_value(value: T, factor: float, *, name: str = "") -> T:
    """One duration value scaled: a number, None, a tuple of numbers or a mapping of numbers.

    `name` is the setting's name: integers named ``*_ms`` stay integers.
    """
    integer = name.endswith("_ms")
    if value is None:
        return value
    if _is_number(value):
        return _scale_number(value, factor, integer)  # type: ignore[arg-type, return-value]  # _is_number narrowed value to a number T
    if isinstance(value, tuple):
        return tuple(scale_value(v, factor, name=name) for v in value)  # type: ignore[return-value]  # a tuple of T's items is the same tuple type T
    if isinstance(value, Mapping):
        scaled = {k: scale_value(v, factor, name=name) for k, v in value.items()}
        return MappingProxyType(scaled) if isinstance(value, MappingProxyType) else scaled  # type: ignore[return-value]  # a mapping of T's values is the same mapping type T
    raise TypeError(f"not a duration value: {value!r}")


def _scale_options(options: Mapping[Any, Any], factor: float) -> Mapping[Any, Any]:
    """A mapping whose entries named like durations are scaled; the rest kept as is."""
    if not any(isinstance(k, str) and is_duration_name(k) for k in options):
        return options
    scaled = {
        k: scale_value(v, factor, name=k) if isinstance(k, str) and is_duration_name(k) else v
        for k, v in options.items()
    }
    return MappingProxyType(scaled) if isinstance(options, MappingProxyType) else scaled


def _scale_any(value: Any, factor: float, *, duration: bool, name: str) -> Any:
    if duration:
        return scale_value(value, factor, name=name)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return scale_durations(value, factor)
    if isinstance(value, tuple) and any(dataclasses.is_dataclass(v) for v in value):
        return tuple(_scale_any(v, factor, duration=False, name=name) for v in value)
    if isinstance(value, Mapping):
        return _scale_options(value, factor)
    return value


def scale_durations(config: T, factor: float) -> T:
    """A copy of the dataclass `config` with every duration in it multiplied by `factor`."""
    factor = check_factor(factor)
    if factor == 1.0:
        return config
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(config):  # type: ignore[arg-type]  # T is any dataclass instance; no bound says so
        if not f.init or not f.compare:
            continue  # derived or injected (an environment handle), not configuration
        value = getattr(config, f.name)
        duration = is_duration_name(f.name) or bool(f.metadata.get("duration"))
        scaled = _scale_any(value, factor, duration=duration, name=f.name)
        if scaled is not value:
            changes[f.name] = scaled
    return dataclasses.replace(config, **changes) if changes else config  # type: ignore[type-var]  # T is any dataclass instance; no bound says so


def scaled_defaults(fn: Any, factor: float) -> dict[str, Any]:
    """Keyword arguments that scale every duration-named default of `fn` (a class or function).

    For constructors configured by keyword defaults rather than a config dataclass
    (``GrpcAdapterClient(address, timeout_s=30.0)``): ``fn(x, **scaled_defaults(fn, f))``.
    """
    import inspect

    factor = check_factor(factor)
    out: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        keyword = param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)
        if keyword and is_duration_name(name) and param.default is not param.empty:
            out[name] = scale_value(param.default, factor, name=name)
    return out
