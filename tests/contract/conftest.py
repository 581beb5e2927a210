"""Our CI binding of the adapter contract suite: every provider, as real processes over gRPC.

Without ``--adapter`` this conftest stands up, per provider, the provider emulator and the
adapter sidecar as separate processes (``python -m adapter_sidecars.<name> --config ...
--port-file ...``), plus a second sidecar whose provider host is ``nonexistent.invalid`` for the
DNS boundary, and parametrizes the suite over runway, veo (Gemini API), vertex (Veo on Vertex
AI: a throwaway service-account key is generated per run, its public half given to the
emulator's token endpoint), selfhosted and selfhosted_cog (the self-hosted sidecar on a real
Cog server). Processes live for one provider's tests at a time (session-scoped, parametrized
fixture) and are stopped afterwards.
With ``--vidroute-adapter/--vidroute-emulator/--vidroute-profile`` it tests that one
already-running adapter instead.

Each emulator runs with its profile's ``emulator_options`` (``advance=polls``: each GetJob
moves a job one step, so state progressions are deterministic); sidecars use short timeouts
(submit read 1.5 s) so the read-timeout boundary costs seconds, not minutes, and each profile
takes its timings from the sidecar config generated here (`with_timings`), the way
``--vidroute-adapter-config`` takes them from an author's config file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from adapter_sidecars.contract.fixtures import *  # noqa: F403 - binds the suite's fixtures here
from adapter_sidecars.contract.harness import (
    ManagedProcess,
    sidecar_config,
    start_emulator,
    start_sidecar,
    write_sidecar_config,
)
from adapter_sidecars.contract.plugin import option
from adapter_sidecars.contract.profile import AdapterProfile, load_profile
from adapter_sidecars.contract.target import ContractTarget, Endpoints
from adapter_sidecars.contract.timings import with_timings
from tests.support.service_account import new_service_account

ROOT = Path(__file__).resolve().parents[2]
UNRESOLVABLE_URL = "http://nonexistent.invalid:8080"


@dataclass(frozen=True)
class LocalProvider:
    """How to run one provider locally: emulator and sidecar modules, the sidecar's provider
    options (the emulator's come from the profile's ``emulator_options``)."""

    emulator_module: str
    sidecar_module: str
    provider_options: dict[str, Any] = field(default_factory=dict)
    #: The account's ``options`` (Vertex: surface, project, location, output bucket).
    account_options: dict[str, Any] = field(default_factory=dict)

    @property
    def vertex(self) -> bool:
        return self.account_options.get("surface") == "vertex"

    def config(
        self,
        base_url: str,
        *,
        credential_ref: str = "",
        provider_options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The sidecar configuration CI runs this provider's adapter with."""
        options = {**self.provider_options, **(provider_options or {})}
        cfg = sidecar_config(base_url, provider_options=options)
        if credential_ref:
            cfg["accounts"][0]["credential_ref"] = credential_ref
        if self.account_options:
            cfg["accounts"][0]["options"] = dict(self.account_options)
        return cfg


PROVIDERS: dict[str, LocalProvider] = {
    "runway": LocalProvider(
        "adapter_sidecars.emulators.runway",
        "adapter_sidecars.runway",
        {"api_version": "2024-11-06", "recovery_settle_seconds": 0},
    ),
    "veo": LocalProvider(
        "adapter_sidecars.emulators.veo",
        "adapter_sidecars.veo",
        {"recovery_settle_seconds": 0},
    ),
    "vertex": LocalProvider(
        "adapter_sidecars.emulators.veo",
        "adapter_sidecars.veo",
        {"recovery_settle_seconds": 0},
        {
            "surface": "vertex",
            "project": "vidroute-contract",
            "location": "us-central1",
            "output_uri": "gs://vidroute-contract-out/runs",
        },
    ),
    "selfhosted": LocalProvider(
        "adapter_sidecars.emulators.selfhosted",
        "adapter_sidecars.selfhosted",
        {"recovery_settle_seconds": 0},
    ),
    # The same sidecar on its Cog backend against a real Cog server (the front starts coglet
    # with models/cog_video and only adds faults and truth around it).
    "selfhosted_cog": LocalProvider(
        "adapter_sidecars.emulators.cog_front",
        "adapter_sidecars.selfhosted",
        {"backend": "cog", "recovery_settle_seconds": 0, "slots": 4},
    ),
}


def local_profile(name: str) -> AdapterProfile:
    """The built-in profile of `name` with the timings of the sidecar config CI runs it with."""
    return with_timings(load_profile(name), PROVIDERS[name].config(UNRESOLVABLE_URL))


_RUNNING: list[ManagedProcess] = []


def pytest_contract_targets(  # type: ignore[no-redef]  # this binding replaces the plugin's
    config: pytest.Config,
) -> list[ContractTarget] | None:
    """The three in-repo adapters, unless one external adapter is named on the command line."""
    if option(config, "adapter"):
        return targets_from_options(config)  # noqa: F405 - from the suite's fixtures
    features = frozenset({"unresolvable_adapter"})
    return [ContractTarget(local_profile(name), features) for name in PROVIDERS]


@pytest.fixture(scope="session")  # type: ignore[no-redef]  # this binding replaces the plugin's
def contract_endpoints(
    request: pytest.FixtureRequest,
    contract_target: ContractTarget,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Endpoints]:
    """Start the emulator and two sidecars (normal + unresolvable host) of this provider."""
    config = request.config
    if option(config, "adapter"):
        yield Endpoints(
            option(config, "adapter"),
            option(config, "emulator"),
            option(config, "unresolvable_adapter"),
        )
        return
    name = contract_target.id
    local = PROVIDERS[name]
    workdir = tmp_path_factory.mktemp(f"contract-{name}")
    started: list[ManagedProcess] = []
    try:
        emulator_options = dict(contract_target.profile.emulator_options)
        account = new_service_account("contract") if local.vertex else None
        if account is not None:
            emulator_options["service_accounts"] = {account.email: account.public_pem}
        emulator = start_emulator(local.emulator_module, workdir, emulator_options, cwd=ROOT)
        started.append(emulator)
        settings: dict[str, Any] = {}
        if account is not None:
            key = account.write(workdir / "service-account.json", f"{emulator.url}/token")
            settings = {
                "credential_ref": f"file:{key}",
                "provider_options": {"storage_base_url": emulator.url},
            }
        configs = {
            f"{name}-sidecar": local.config(emulator.url, **settings),
            f"{name}-dns-sidecar": local.config(UNRESOLVABLE_URL, **settings),
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
