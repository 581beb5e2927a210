"""A price below what a delivery costs the platform, flagged at publication (issue 23: every
self-hosted delivery lost 3 500 micros to a 10 GPU-second base time nobody priced).

`price_flags` reads one capability document: for each output duration it allows, the estimate
(price per output second x seconds, the audio price when the model always generates audio) is
compared with the provider cost a correct bill charges for one delivery: (units per output
second x seconds + units per generation) x micros per unit, in thousandths of a unit, rounded
up to the micro. A duration whose estimate is below it is one flag, with the numbers. Integers
only; no conversion rate (``micros_per_provider_unit`` 0) means nothing to compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["price_flags"]


def price_flags(document: Mapping[str, Any]) -> tuple[str, ...]:
    """One line per allowed duration whose estimate is below the delivery's expected cost."""
    com = document.get("commercial") or {}
    output = document.get("output") or {}
    rate = int(com.get("micros_per_provider_unit") or 0)
    if rate <= 0:
        return ()
    audio_only = bool(output.get("native_audio")) and not output.get("audio_optional", True)
    price = int(com.get("price_micros_per_output_second") or 0)
    units = int(com.get("provider_milliunits_per_output_second") or 0)
    if audio_only:
        price = int(com.get("price_micros_per_output_second_with_audio") or price)
        units = int(com.get("provider_milliunits_per_output_second_with_audio") or units)
    base = int(com.get("provider_milliunits_per_generation") or 0)
    unit = str(com.get("provider_unit") or "units")
    flags = []
    for seconds in sorted(int(s) for s in output.get("durations_seconds") or ()):
        estimate = price * seconds
        milli = units * seconds + base
        cost = -(-milli * rate // 1000)
        if estimate < cost:
            flags.append(
                f"{seconds} s: estimate {estimate} micros is below the expected provider cost "
                f"{cost} micros ({_units(milli)} {unit} at {rate} micros each)"
            )
    return tuple(flags)


def _units(milli: int) -> str:
    whole, frac = divmod(milli, 1000)
    return f"{whole}.{frac:03d}".rstrip("0").rstrip(".")
