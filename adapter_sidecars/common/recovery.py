"""Shared rules for recovering an UNKNOWN submit by searching the provider (design 9.17.4).

A search may only say NOT_FOUND when it is *conclusive*: the listing was complete and the
submit window has settled, i.e. enough time has passed since the request left that a request
still queued inside the provider can no longer turn into a job (9.17.5 "最长建单延迟").
Several matches are INCONCLUSIVE: we cannot tell which one our attempt created.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from adapter_sidecars.common.config import SidecarConfig
from vidroute_core.adapter import RecoveryVerdict


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def settled(submitted_before: datetime | None, config: SidecarConfig, now: datetime) -> bool:
    """Whether a request sent no later than `submitted_before` can no longer create a job.

    The settle time is the submit read timeout (the longest we waited for Runway to answer)
    plus ``provider.options.recovery_settle_seconds`` (default 30 s).
    """
    if submitted_before is None:
        return False
    return now >= submitted_before + timedelta(
        seconds=config.timeouts.submit_read + settle_s(config)
    )


def settle_s(config: SidecarConfig) -> float:
    """``provider.options.recovery_settle_seconds`` (already scaled), 30 s scaled by default."""
    return float(config.provider_options.get("recovery_settle_seconds", 30 * config.time_scale))


def match_listing(
    items: Iterable[Any],
    native_request: Mapping[str, Any],
    *,
    request_key: str,
    id_key: str,
    complete: bool,
) -> tuple[RecoveryVerdict, str]:
    """Find the listed job whose recorded request equals `native_request`."""
    found = [
        str(item.get(id_key))
        for item in items
        if isinstance(item, dict)
        and item.get(id_key)
        and _same(item.get(request_key), native_request)
    ]
    if len(found) == 1:
        return RecoveryVerdict.FOUND, found[0]
    if not found and complete:
        return RecoveryVerdict.NOT_FOUND, ""
    return RecoveryVerdict.INCONCLUSIVE, ""
