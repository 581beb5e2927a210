"""Transport-neutral types of the adapter layer (design 9.5) and the `ProviderAdapter` protocol.

The servicer translates ``vidroute.adapter.v1`` messages into these frozen dataclasses and back;
provider adapters never see a protobuf. Proto enums are mirrored by Python enums here, so raw
ints never travel through adapter code. Provider failures are values (`ProviderError`), not
exceptions; exceptions are reserved for a malformed request to the adapter itself::

    AdapterRequestError              the caller asked for something this adapter cannot address
    ├── UnknownAccount               no such account in the sidecar config
    ├── UnknownModel                 no capability entry for account + model (+ version)
    └── InvalidRequest               a required field is missing or unusable
        └── MalformedPlan            a Submit plan that is not this adapter's or is unreadable
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from vidroute_core.capabilities.loader import Capability
from vidroute_core.errors import ProviderError
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


class JobState(enum.Enum):
    """Mirror of ``vidroute.adapter.v1.JobState``."""

    QUEUED = "QUEUED"
    THROTTLED = "THROTTLED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    UNRECOGNIZED = "UNRECOGNIZED"

    @property
    def terminal(self) -> bool:
        """Whether the provider will not change this job any more."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class SubmitKind(enum.Enum):
    """Mirror of ``SubmitOutcomeKind`` (design 9.5.1)."""

    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    UNKNOWN = "UNKNOWN"


class TransportStage(enum.Enum):
    """Mirror of ``TransportStage`` (design 9.17.3); NONE means the provider answered."""

    NONE = "NONE"
    DNS = "DNS"
    CONNECT = "CONNECT"
    TLS = "TLS"
    SEND_REQUEST = "SEND_REQUEST"
    AWAIT_RESPONSE = "AWAIT_RESPONSE"
    READ_RESPONSE = "READ_RESPONSE"


class TransformationKind(enum.Enum):
    """Mirror of ``TransformationKind`` (design 9.7.1)."""

    EXACT = "EXACT"
    LOSSLESS = "LOSSLESS"
    DEGRADE = "DEGRADE"
    REJECT = "REJECT"


class RecoveryVerdict(enum.Enum):
    """Mirror of ``RecoveryVerdict`` (design 9.17.4)."""

    FOUND = "FOUND"
    NOT_FOUND = "NOT_FOUND"
    INCONCLUSIVE = "INCONCLUSIVE"


@dataclass(frozen=True, slots=True)
class Transformation:
    """One mapping decision: spec field path, kind, human detail."""

    field: str
    kind: TransformationKind
    detail: str


@dataclass(frozen=True, slots=True)
class Plan:
    """A compiled plan (``CompilePlan``); `native_request` is the parsed body to send."""

    provider: str
    account: str
    model: str
    model_version: str
    capability_version: str
    price_version: str
    endpoint: str  # "POST /v1/text_to_video"
    native_request: Mapping[str, Any] | None
    native_request_json: str
    request_hash: str
    transformations: tuple[Transformation, ...]
    estimated_cost_micros: int
    currency: str
    submittable: bool


@dataclass(frozen=True, slots=True)
class CompileInput:
    """Input of `ProviderAdapter.compile`; empty account/version mean the defaults."""

    spec: GenerationSpec
    model: str
    account: str = ""
    model_version: str = ""


@dataclass(frozen=True, slots=True)
class SubmitInput:
    """Input of `ProviderAdapter.submit`."""

    plan: Plan
    client_request_key: str
    callback_url: str = ""


@dataclass(frozen=True, slots=True)
class JobRef:
    """A provider job's identity."""

    provider_job_id: str
    account: str
    model: str = ""
    provider_request_id: str = ""


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """ACCEPTED with a job, or REJECTED/UNKNOWN with an error (and a stage for transport)."""

    kind: SubmitKind
    job: JobRef | None = None
    raw_status: str = ""
    error: ProviderError | None = None
    transport_stage: TransportStage = TransportStage.NONE
    request_started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Output:
    """A produced output and when its locator stops working."""

    uri: str
    mime_type: str = "video/mp4"
    expires_at: datetime | None = None
    size_bytes: int = 0
    checksum: str = ""
    #: The URI needs the provider's credentials: the control plane downloads it through
    #: `ProviderAdapter.fetch_output`, never directly.
    fetch_through_adapter: bool = False


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A normalized job status with the provider's raw view kept (design 9.8)."""

    state: JobState
    raw_status: str
    raw_payload_json: str = ""
    progress: float | None = None
    outputs: tuple[Output, ...] = ()
    failure: ProviderError | None = None
    updated_at: datetime | None = None
    actual_cost_micros: int | None = None
    currency: str = ""


@dataclass(frozen=True, slots=True)
class JobResult:
    """GetJob: a status, or the error that kept the adapter from reading it."""

    status: JobStatus | None = None
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class CancelResult:
    """CancelJob: whether the provider acknowledged (already-terminal counts)."""

    acknowledged: bool
    status: JobStatus | None = None
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class RecoverInput:
    """RecoverSubmission input (design 9.17.4)."""

    account: str
    model: str
    client_request_key: str
    request_hash: str = ""
    provider_request_id: str = ""
    submitted_after: datetime | None = None
    submitted_before: datetime | None = None
    plan: Plan | None = None
    # When the attempt was committed SUBMITTING (no slack): what the submit journal checks.
    request_started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RecoverResult:
    """FOUND with a job, NOT_FOUND when conclusive, otherwise INCONCLUSIVE."""

    verdict: RecoveryVerdict
    method: str
    job: JobRef | None = None
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class UsageInput:
    """ListUsage input: [start, end) in UTC."""

    account: str
    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One provider usage row; provider units in thousandths."""

    model: str
    usage_time: datetime
    provider_milliunits: int
    provider_unit: str
    cost_micros: int
    currency: str
    raw_json: str
    #: Empty for an aggregate (a daily total); never invented.
    provider_job_id: str = ""
    #: The create call's request id / client key, when the provider's record names them.
    provider_request_id: str = ""
    client_request_key: str = ""


@dataclass(frozen=True, slots=True)
class UsageResult:
    """ListUsage result."""

    records: tuple[UsageRecord, ...] = ()
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class FetchOutputInput:
    """FetchOutput input: an output URI of `job` (as GetJob returned it) and a size cap."""

    job: JobRef
    uri: str = field(repr=False)  # may carry a signature
    max_bytes: int = 0  # 0: the adapter's own limit


@dataclass(frozen=True, slots=True)
class OutputPart:
    """One piece of a FetchOutput stream.

    The first part carries `content_type` and `content_length` (0 if unknown); parts carry the
    body in order; a failed download ends with a part whose `error` is set."""

    chunk: bytes = b""
    content_type: str = ""
    content_length: int = 0
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """Describe: who the adapter is and what it offers."""

    adapter: str
    adapter_version: str
    capabilities: Sequence[Capability] = field(default_factory=tuple)
    #: The longest one Submit takes inside the adapter (seconds; 0: not declared).
    submit_budget_s: float = 0.0
    #: The provider deduplicates creates by the client request key, so re-sending an UNKNOWN
    #: submit with the same key cannot create a second job.
    honours_idempotency_key: bool = False


class ProviderAdapter(Protocol):
    """One provider's adapter; the servicer only talks to this."""

    def describe(self) -> AdapterInfo:
        """Name, version and capability entries."""
        ...

    def compile(self, request: CompileInput) -> Plan:
        """Deterministic spec -> native request; raises `AdapterRequestError` subclasses."""
        ...

    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        """Create the job; never retried blindly."""
        ...

    async def get_job(self, job: JobRef) -> JobResult:
        """Current status."""
        ...

    async def cancel_job(self, job: JobRef) -> CancelResult:
        """Ask for cancellation; idempotent."""
        ...

    async def recover_submission(self, request: RecoverInput) -> RecoverResult:
        """Find the job of an UNKNOWN submit."""
        ...

    async def list_usage(self, request: UsageInput) -> UsageResult:
        """Usage rows in a window."""
        ...

    def fetch_output(self, request: FetchOutputInput) -> AsyncIterator[OutputPart]:
        """Stream an output that needs the provider's credentials (an async generator).

        Raises `InvalidRequest` (before the first part) for a URI that is not the provider's."""
        ...

    async def probe(self) -> bool:
        """Cheap reachability check of the provider endpoint, for health."""
        ...

    async def aclose(self) -> None:
        """Release HTTP clients."""
        ...
