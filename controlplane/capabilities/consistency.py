"""Publication checks a capability entry must pass beyond its JSON Schema (design 9.25.5).

The schema checks shape; these check meaning:

* **price completeness**: a routable model needs a price version, a currency and a per-second
  price (an audio price too when it can generate audio);
* **contradictory constraints**: every constraint whose ``when`` can hold for some allowed
  request must leave at least one allowed request satisfying its ``require`` (``when:
  resolution == "1080p"`` with ``require: duration_seconds == 7`` on a 4/6/8 s model can never
  be met); and every advertised mode must keep at least one request legal under all constraints.

"Allowed requests" are enumerated from the entry's own value sets (modes x resolutions x aspect
ratios x durations x audio x inputs), which are small, so the check is exhaustive, not sampled.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from vidroute_core.capabilities.constraints import ConstraintError, Environment, parse, violations
from vidroute_core.capabilities.loader import Capability

MAX_ENVIRONMENTS = 200_000


class ConsistencyError(ValueError):
    """The entry is well-formed but cannot be published as it stands."""


def _flags(supported: bool) -> tuple[bool, ...]:
    return (False, True) if supported else (False,)


def environments(cap: Capability) -> Iterator[dict[str, str | int | bool]]:
    """Every request the entry's value sets allow, in the constraint language's terms."""
    audio: tuple[bool, ...] = (False,)
    if cap.native_audio:
        audio = (False, True) if cap.audio_optional else (True,)
    axes = itertools.product(
        cap.modes,
        cap.resolutions,
        cap.aspect_ratios,
        cap.durations_seconds,
        audio,
        range(1, cap.max_sample_count + 1),
        _flags(cap.supports_last_frame),
        range(cap.max_reference_images + 1),
        _flags(cap.supports_negative_prompt),
        _flags(cap.supports_seed),
    )
    for n, (mode, res, aspect, dur, aud, samples, last, refs, neg, seed) in enumerate(axes):
        if n >= MAX_ENVIRONMENTS:
            raise ConsistencyError(f"{cap.source}: value space too large to verify")
        yield {
            "mode": mode.value,
            "resolution": res,
            "aspect_ratio": aspect,
            "duration_seconds": dur,
            "with_audio": aud,
            "sample_count": samples,
            "has_last_frame": last,
            "reference_count": refs,
            "has_negative_prompt": neg,
            "has_seed": seed,
        }


def check_price(cap: Capability) -> None:
    """Raise unless the entry carries a complete price."""
    com = cap.commercial
    where = f"{cap.source or cap.capability_version}"
    if not com.price_version or not com.currency:
        raise ConsistencyError(f"{where}: model {cap.model} has no price version/currency")
    if com.price_micros_per_output_second <= 0 and cap.self_hosted is None:
        raise ConsistencyError(f"{where}: model {cap.model} has no per-second price")


def check_constraints(cap: Capability) -> None:
    """Raise when a constraint can never be met, or a mode has no legal request left."""
    if not cap.constraints:
        return
    where = f"{cap.source or cap.capability_version}"
    when_seen = [False] * len(cap.constraints)
    when_met = [False] * len(cap.constraints)
    modes_ok: set[str] = set()
    try:
        for env in environments(cap):
            view: Environment = env
            for i, c in enumerate(cap.constraints):
                if parse(c.when).evaluate(view):
                    when_seen[i] = True
                    if parse(c.require).evaluate(view):
                        when_met[i] = True
            if not violations(cap.constraints, view):
                modes_ok.add(str(env["mode"]))
    except ConstraintError as exc:
        raise ConsistencyError(f"{where}: {exc}") from exc
    for i, c in enumerate(cap.constraints):
        if when_seen[i] and not when_met[i]:
            raise ConsistencyError(
                f"{where}: constraint 'when {c.when} require {c.require}' can never be "
                "satisfied by any value the entry allows"
            )
    dead = [m.value for m in cap.modes if m.value not in modes_ok]
    if dead:
        raise ConsistencyError(f"{where}: modes {dead} have no request legal under the constraints")


def check_entry(cap: Capability) -> None:
    """Every publication check for one entry."""
    check_price(cap)
    check_constraints(cap)
