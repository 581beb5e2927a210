"""Switches in ``provider.options`` that turn on what only an emulator offers.

A real provider's adapter declares what the real provider supports. Some recovery and usage
routes exist only as emulator extensions (``adapter_sidecars/emulators/README.md``); a sidecar
uses one only when its config names the matching option, off by default, and then declares the
capability it brings (`with_task_search`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from adapter_sidecars.common.config import ConfigError, SidecarConfig
from vidroute_core.capabilities.loader import Capability


def option_flag(config: SidecarConfig, name: str) -> bool:
    """``provider.options.<name>`` as a boolean (absent: False); anything else is an error."""
    value = config.provider_options.get(name, False)
    if not isinstance(value, bool):
        raise ConfigError(f"provider.options.{name} must be true or false, got {value!r}")
    return value


def with_task_search(capabilities: Sequence[Capability]) -> list[Capability]:
    """The entries with ``operations.task_search`` declared true."""
    return [
        replace(cap, operations=replace(cap.operations, task_search=True)) for cap in capabilities
    ]
