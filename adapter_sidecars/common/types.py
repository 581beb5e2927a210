"""What only a sidecar needs of the adapter seam: the `ProviderAdapter` protocol, its request
inputs and the errors of a malformed request (design 9.5).

The values an adapter returns (plans, outcomes, snapshots, verdicts, usage) are the kernel's
`vidroute_core.adapter` types, the same ones the control plane reads; the servicer converts them
with `vidroute_core.wire.adapter`, so provider adapters never see a protobuf. Provider failures
are values (`ProviderError`), not exceptions; exceptions are reserved for a malformed request to
the adapter itself::

    AdapterRequestError              the caller asked for something this adapter cannot address
    ├── UnknownAccount               no such account in the sidecar config
    ├── UnknownModel                 no capability entry for account + model (+ version)
    └── InvalidRequest               a required field is missing or unusable
        └── MalformedPlan            a Submit plan that is not this adapter's or is unreadable
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

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
from vidroute_core.capabilities.loader import Capability
from vidroute_core.spec import GenerationSpec


class AdapterRequestError(Exception):
    """Root of the errors that mean "the request to the adapter is wrong" (see module doc)."""


class UnknownAccount(AdapterRequestError):
    """The account is not configured in this sidecar."""


class UnknownModel(AdapterRequestError):
    """No capability entry matches the account, model and version."""


class InvalidRequest(AdapterRequestError):
    """The request to the adapter is malformed (missing field, bad window)."""


class MalformedPlan(InvalidRequest):
    """A plan handed to Submit cannot be sent (wrong provider, not submittable, bad JSON)."""


@dataclass(frozen=True, slots=True)
class CompileInput:
    """Input of `ProviderAdapter.compile`; empty account/version mean the defaults.

    `capability` is the entry the control plane routed on (CompileRequest.capability): when
    set, the adapter compiles against it rather than its own files' version of the model."""

    spec: GenerationSpec
    model: str
    account: str = ""
    model_version: str = ""
    capability: Capability | None = None


@dataclass(frozen=True, slots=True)
class SubmitInput:
    """Input of `ProviderAdapter.submit`."""

    plan: CompiledPlan
    client_request_key: str
    callback_url: str = ""


@dataclass(frozen=True, slots=True)
class UsageInput:
    """ListUsage input: [start, end) in UTC."""

    account: str
    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True)
class FetchOutputInput:
    """FetchOutput input: an output URI of `job` (as GetJob returned it) and a size cap."""

    job: JobRef
    uri: str = field(repr=False)  # may carry a signature
    max_bytes: int = 0  # 0: the adapter's own limit


class ProviderAdapter(Protocol):
    """One provider's adapter; the servicer only talks to this."""

    def describe(self) -> AdapterInfo:
        """Name, version and capability entries."""
        ...

    def compile(self, request: CompileInput) -> CompiledPlan:
        """Deterministic spec -> native request; raises `AdapterRequestError` subclasses."""
        ...

    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        """Create the job; never retried blindly."""
        ...

    async def get_job(self, job: JobRef) -> PollResult:
        """Current status."""
        ...

    async def cancel_job(self, job: JobRef) -> CancelResult:
        """Ask for cancellation; idempotent."""
        ...

    async def recover_submission(self, request: RecoverQuery) -> RecoverResult:
        """Find the job of an UNKNOWN submit."""
        ...

    async def list_usage(self, request: UsageInput) -> UsageResult:
        """Usage rows in a window."""
        ...

    def fetch_output(self, request: FetchOutputInput) -> AsyncIterator[OutputChunk]:
        """Stream an output that needs the provider's credentials (an async generator).

        Raises `InvalidRequest` (before the first part) for a URI that is not the provider's."""
        ...

    async def get_load(self) -> LoadReport:
        """The provider's live per-model load (GetLoad); empty when it reports none."""
        ...

    async def probe(self) -> bool:
        """Cheap reachability check of the provider endpoint, for health."""
        ...

    async def aclose(self) -> None:
        """Release HTTP clients."""
        ...
