"""Our CI binding of the adapter contract suite: every provider, as real processes over gRPC.

Without ``--adapter`` this conftest stands up, per provider, the provider emulator and the
adapter sidecar as separate processes (``python -m adapter_sidecars.<name> --config ...
--port-file ...``), plus a second sidecar whose provider host is ``nonexistent.invalid`` for the
DNS boundary, and parametrizes the suite over runway, veo and selfhosted. Processes live for one
provider's tests at a time (session-scoped, parametrized fixture) and are stopped afterwards.
With ``--adapter/--emulator/--profile`` it tests that one already-running adapter instead.

Emulators run in ``advance=polls`` mode (each GetJob moves a job one step), so state
progressions are deterministic; sidecars use short timeouts (submit read 1.5 s) so the
read-timeout boundary costs seconds, not minutes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from adapter_sidecars.contract.harness import (
    ManagedProcess,
    sidecar_config,
    start_emulator,
    start_sidecar,
    write_sidecar_config,
)
from adapter_sidecars.contract.plugin import *  # noqa: F403 - registers the contract plugin here
from adapter_sidecars.contract.profile import load_profile
from adapter_sidecars.contract.target import ContractTarget, Endpoints

ROOT = Path(__file__).resolve().parents[2]
UNRESOLVABLE_URL = "http://nonexistent.invalid:8080"
POLLS = {"advance": "polls", "queued_polls": 1, "running_polls": 2}


@dataclass(frozen=True)
class LocalProvider:
    """How to run one provider locally: emulator module + options, sidecar module + options."""

    emulator_module: str
    sidecar_module: str
    emulator_options: dict[str, Any] = field(default_factory=dict)
    provider_options: dict[str, Any] = field(default_factory=dict)


PROVIDERS: dict[str, LocalProvider] = {
    "runway": LocalProvider(
        "adapter_sidecars.emulators.runway",
        "adapter_sidecars.runway",
        # Real Runway deletes on DELETE /v1/tasks/{id} (later GETs 404); emulate that.
        {**POLLS, "delete_mode": "delete"},
        {"api_version": "2024-11-06", "recovery_settle_seconds": 0},
    ),
    "veo": LocalProvider(
        "adapter_sidecars.emulators.veo",
        "adapter_sidecars.veo",
        dict(POLLS),
        {"recovery_settle_seconds": 0},
    ),
    "selfhosted": LocalProvider(
        "adapter_sidecars.emulators.selfhosted",
        "adapter_sidecars.selfhosted",
        dict(POLLS),
        {"recovery_settle_seconds": 0},
    ),
}
_RUNNING: list[ManagedProcess] = []


def pytest_contract_targets(  # type: ignore[no-redef]  # this binding replaces the plugin's
    config: pytest.Config,
) -> list[ContractTarget] | None:
    """The three in-repo adapters, unless one external adapter is named on the command line."""
    if config.getoption("adapter", default=None):
        return targets_from_options(config)  # noqa: F405 - from the plugin
    features = frozenset({"unresolvable_adapter"})
    return [ContractTarget(load_profile(name), features) for name in PROVIDERS]


@pytest.fixture(scope="session")  # type: ignore[no-redef]  # this binding replaces the plugin's
def contract_endpoints(
    request: pytest.FixtureRequest,
    contract_target: ContractTarget,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Endpoints]:
    """Start the emulator and two sidecars (normal + unresolvable host) of this provider."""
    config = request.config
    if config.getoption("adapter", default=None):
        yield Endpoints(
            config.getoption("adapter"),
            config.getoption("emulator"),
            config.getoption("unresolvable_adapter", default=None),
        )
        return
    name = contract_target.id
    local = PROVIDERS[name]
    workdir = tmp_path_factory.mktemp(f"contract-{name}")
    started: list[ManagedProcess] = []
    try:
        emulator = start_emulator(local.emulator_module, workdir, local.emulator_options, cwd=ROOT)
        started.append(emulator)
        configs = {
            f"{name}-sidecar": sidecar_config(
                emulator.url, provider_options=local.provider_options
            ),
            f"{name}-dns-sidecar": sidecar_config(
                UNRESOLVABLE_URL, provider_options=local.provider_options
            ),
        }
        sidecars = {}
        for label, cfg in configs.items():
            path = write_sidecar_config(workdir / f"{label}.yaml", cfg)
            sidecars[label] = start_sidecar(
                local.sidecar_module,
                path,
                workdir,
                name=label,
                cwd=ROOT,
                require_serving=label == f"{name}-sidecar",
            )
            started.append(sidecars[label])
        _RUNNING[:] = started
        yield Endpoints(
            sidecars[f"{name}-sidecar"].address,
            emulator.url,
            sidecars[f"{name}-dns-sidecar"].address,
        )
    finally:
        _RUNNING.clear()
        for proc in reversed(started):
            proc.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """On failure, attach the tail of each running process's log to the report."""
    report = yield
    if report.failed:
        for proc in _RUNNING:
            report.sections.append((f"{proc.name} log (tail)", proc.log_tail(30)))
    return report
