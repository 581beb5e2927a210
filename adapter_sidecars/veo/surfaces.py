"""The Veo sidecar's surfaces: each account picks the Gemini API or Vertex AI.

An account's ``options.surface`` is ``gemini`` (the default) or ``vertex``
(`adapter_sidecars.veo.vertex.VertexAccount` lists its other options). The control plane knows
one sidecar per provider, so a deployment with accounts of both surfaces runs one Veo sidecar
whose adapter is `VeoSurfaces`: a Gemini and a Vertex adapter, each built from the config with
only its own accounts, and every call sent to the adapter of the account it names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from adapter_sidecars.common.config import Account, ConfigError, SidecarConfig
from adapter_sidecars.common.types import (
    CompileInput,
    FetchOutputInput,
    ProviderAdapter,
    SubmitInput,
    UnknownAccount,
    UsageInput,
)
from adapter_sidecars.veo.adapter import VeoAdapter
from adapter_sidecars.veo.vertex import SURFACE, VertexAdapter
from vidroute_core.adapter import (
    AdapterInfo,
    CancelResult,
    CompiledPlan,
    JobRef,
    LoadReport,
    OutputChunk,
    PollResult,
    RecoverQuery,
    RecoverResult,
    SubmitOutcome,
    UsageResult,
)


def surface_of(account: Account) -> str:
    """The surface an account is configured for: ``gemini`` (default) or ``vertex``."""
    return str(account.options.get("surface") or "gemini")


def build_adapter(config: SidecarConfig) -> ProviderAdapter:
    """The Veo adapter for the surfaces the accounts chose: one adapter when they agree, else
    `VeoSurfaces` over a Gemini and a Vertex adapter, each with its own accounts (the control
    plane knows one sidecar per provider, so both surfaces must be served by this one)."""
    surfaces = {surface_of(a) for a in config.accounts}
    if not surfaces <= {"gemini", SURFACE}:
        raise ConfigError(f"accounts[].options.surface must be gemini or vertex, got {surfaces}")
    if surfaces == {SURFACE}:
        return VertexAdapter.from_config(config)
    if surfaces == {"gemini"}:
        return VeoAdapter.from_config(config)
    gemini = tuple(a for a in config.accounts if surface_of(a) != SURFACE)
    vertex = tuple(a for a in config.accounts if surface_of(a) == SURFACE)
    return VeoSurfaces(
        VeoAdapter.from_config(replace(config, accounts=gemini)),
        VertexAdapter.from_config(replace(config, accounts=vertex)),
        default=config.accounts[0].name,
    )


class VeoSurfaces:
    """One Veo sidecar serving Gemini-API and Vertex accounts: each call goes to the adapter of
    the account it names (an empty name: the configured default account)."""

    def __init__(self, gemini: VeoAdapter, vertex: VertexAdapter, *, default: str) -> None:
        self._parts: tuple[VeoAdapter, ...] = (gemini, vertex)
        self._by_account = {a.name: p for p in self._parts for a in p.config.accounts}
        self._default = default

    def _for(self, account: str) -> VeoAdapter:
        part = self._by_account.get(account or self._default)
        if part is None:
            raise UnknownAccount(f"account {account!r} is not configured for veo")
        return part

    def describe(self) -> AdapterInfo:
        infos = [p.describe() for p in self._parts]
        return AdapterInfo(
            "veo",
            infos[0].adapter_version,
            tuple(c for info in infos for c in info.capabilities),
            submit_budget_s=max(info.submit_budget_s for info in infos),
            honours_idempotency_key=all(info.honours_idempotency_key for info in infos),
        )

    def compile(self, request: CompileInput) -> CompiledPlan:
        return self._for(request.account).compile(request)

    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        return await self._for(request.plan.account).submit(request)

    async def get_job(self, job: JobRef) -> PollResult:
        return await self._for(job.account).get_job(job)

    async def cancel_job(self, job: JobRef) -> CancelResult:
        return await self._for(job.account).cancel_job(job)

    async def recover_submission(self, request: RecoverQuery) -> RecoverResult:
        return await self._for(request.account).recover_submission(request)

    async def list_usage(self, request: UsageInput) -> UsageResult:
        return await self._for(request.account).list_usage(request)

    async def fetch_output(self, request: FetchOutputInput) -> AsyncIterator[OutputChunk]:
        async for part in self._for(request.job.account).fetch_output(request):
            yield part

    async def get_load(self) -> LoadReport:
        return LoadReport()

    async def probe(self) -> bool:
        return all([await p.probe() for p in self._parts])

    async def aclose(self) -> None:
        for part in self._parts:
            await part.aclose()
