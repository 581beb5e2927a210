"""Provider emulators: real HTTP servers speaking Runway, Veo and our self-hosted job API.

Used in-process by tests (``async with RunwayEmulator(cfg) as emu: emu.url``), on a thread
(``EmulatorThread(emu).start()``) and standalone (``python -m adapter_sidecars.emulators.runway``).
See README.md in this folder for fault rules, truth endpoints and emulator-only extensions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapter_sidecars.emulators.callbacks import SIGNATURE_HEADER, sign, verify_signature
    from adapter_sidecars.emulators.core import Emulator, EmulatorConfig
    from adapter_sidecars.emulators.faults import FaultRule, FaultRuleError
    from adapter_sidecars.emulators.media import MediaSpec, render_mp4
    from adapter_sidecars.emulators.runner import EmulatorThread
    from adapter_sidecars.emulators.runway import RunwayConfig, RunwayEmulator
    from adapter_sidecars.emulators.selfhosted import SelfHostedConfig, SelfHostedEmulator
    from adapter_sidecars.emulators.veo import VeoConfig, VeoEmulator

# Lazy exports: `python -m adapter_sidecars.emulators.runway` must not import the runway
# module twice (once via this package, once as __main__).
_HOMES = {
    "SIGNATURE_HEADER": "callbacks",
    "sign": "callbacks",
    "verify_signature": "callbacks",
    "Emulator": "core",
    "EmulatorConfig": "core",
    "FaultRule": "faults",
    "FaultRuleError": "faults",
    "MediaSpec": "media",
    "render_mp4": "media",
    "EmulatorThread": "runner",
    "RunwayConfig": "runway",
    "RunwayEmulator": "runway",
    "SelfHostedConfig": "selfhosted",
    "SelfHostedEmulator": "selfhosted",
    "VeoConfig": "veo",
    "VeoEmulator": "veo",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = [
    "SIGNATURE_HEADER",
    "Emulator",
    "EmulatorConfig",
    "EmulatorThread",
    "FaultRule",
    "FaultRuleError",
    "MediaSpec",
    "RunwayConfig",
    "RunwayEmulator",
    "SelfHostedConfig",
    "SelfHostedEmulator",
    "VeoConfig",
    "VeoEmulator",
    "render_mp4",
    "sign",
    "verify_signature",
]
