"""Can each adapter sidecar be reached? Per-provider readiness (issue 20).

A sidecar that is stopped, restarting or stalled does not fail tasks (routing waits for it,
`gather`), but operators and probes must see it: each configured adapter has a health service
name of its own (`service_name`), NOT_SERVING from the first call on the decision path that got
no answer until the next one that did. The dispatcher reports every Compile (`answered` /
`lost`); the health probe asks every sidecar's Describe once per probe interval (`probe`), so a
sidecar that went away while no task needed it is seen too, and one that came back is seen
without waiting for a task. The control plane's own readiness ("" and the API services) does not
follow these: the other providers still serve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from vidroute.adapter.v1 import adapter_service_pb2

log = logging.getLogger(__name__)

_SERVICES = adapter_service_pb2.DESCRIPTOR.services_by_name
ADAPTER_SERVICE = _SERVICES["ProviderAdapterService"].full_name


def service_name(provider: str) -> str:
    """The control plane's health service name for `provider`'s sidecar."""
    return f"{ADAPTER_SERVICE}/{provider}"


class Describes(Protocol):
    """The one call the probe makes (`AdapterClient.describe`)."""

    async def describe(self) -> object: ...


class AdapterReachability:
    """Per provider: None while its sidecar answers, else why it is not reached."""

    def __init__(self, providers: Iterable[str]) -> None:
        self._problems: dict[str, str | None] = dict.fromkeys(providers)

    def answered(self, provider: str) -> None:
        if self._problems.get(provider) is not None:
            log.info("adapter %s answers again", provider)
        self._problems[provider] = None

    def lost(self, provider: str, why: str) -> None:
        if self._problems.get(provider) is None:
            log.warning("adapter %s not reached: %s", provider, why)
        self._problems[provider] = why

    def problem(self, provider: str) -> str | None:
        return self._problems.get(provider)

    def statuses(self) -> dict[str, str | None]:
        """Every provider's problem (None: reachable), by provider name."""
        return dict(self._problems)

    async def probe(self, adapters: Mapping[str, Describes], timeout_s: float) -> None:
        """Describe every sidecar concurrently, each within `timeout_s`."""

        async def one(provider: str, adapter: Describes) -> None:
            try:
                async with asyncio.timeout(timeout_s):
                    await adapter.describe()
            except Exception as exc:  # any failure to describe: not reached for now
                self.lost(provider, f"Describe failed ({type(exc).__name__}: {exc})")
            else:
                self.answered(provider)

        await asyncio.gather(*(one(p, a) for p, a in adapters.items()))
