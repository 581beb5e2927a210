"""The adapter seam in Python terms (design 9.5): one set of value types both sides speak.

A sidecar's adapter returns these; the sidecar's servicer and the control plane's gRPC client
turn them into ``vidroute.adapter.v1`` messages and back with `vidroute_core.wire.adapter`, so
no protobuf travels past either end of the seam. Every enum value here names a value of the
proto (``JobState.RUNNING`` <-> ``JOB_STATE_RUNNING``); the one fact the proto cannot carry,
that the control plane's call to the adapter itself failed, is `CallFailure`, which never goes
on the wire. Provider failures are values (`ProviderError`), never exceptions.

A compiled plan also travels as its JSON form (`CompiledPlan.plan_json`): the control plane
stores it verbatim in ``task_attempts.compile_plan`` and sends it back unchanged to Submit and
RecoverSubmission, so the request submitted is byte-for-byte the one that was routed, priced
and hashed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any

from vidroute_core.capabilities.loader import Capability
from vidroute_core.errors import ProviderError


class JobState(enum.Enum):
    """Normalized provider job state (``JobState``); UNRECOGNIZED is non-terminal and flagged."""

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
    """The three outcomes of a submit (``SubmitOutcomeKind``, design 9.5.1)."""

    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    UNKNOWN = "UNKNOWN"


class TransportStage(enum.Enum):
    """Where in the HTTP exchange with the provider a submit failed (``TransportStage``,
    design 9.17.3); NONE (``TRANSPORT_STAGE_UNSPECIFIED``) means no transport failure."""

    NONE = "NONE"
    DNS = "DNS"
    CONNECT = "CONNECT"
    TLS = "TLS"
    SEND_REQUEST = "SEND_REQUEST"
    AWAIT_RESPONSE = "AWAIT_RESPONSE"
    READ_RESPONSE = "READ_RESPONSE"


class CallFailure(enum.Enum):
    """The control plane's call to the adapter failed, so no transport stage is known.

    Set only by the control plane on the outcome it builds itself; the proto has no such value
    because a sidecar that answers has, by definition, not failed this way."""

    #: The Submit RPC failed after it may have reached the sidecar (deadline, connection lost).
    ADAPTER_RPC = "ADAPTER_RPC"
    #: The client raised before any answer (a bug or a broken channel): nothing is known.
    CLIENT_EXCEPTION = "CLIENT_EXCEPTION"


class TransformationKind(enum.Enum):
    """How one spec field was mapped (``TransformationKind``, design 9.7.1)."""

    EXACT = "EXACT"
    LOSSLESS = "LOSSLESS"
    DEGRADE = "DEGRADE"
    REJECT = "REJECT"


class RecoveryVerdict(enum.Enum):
    """Verdict of a submission recovery search (``RecoveryVerdict``, design 9.17.4)."""

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
class CompiledPlan:
    """A plan for one candidate (``CompilePlan``, design 9.5, 9.7)."""

    provider: str
    account: str
    model: str
    model_version: str
    capability_version: str
    price_version: str
    request_hash: str
    estimated_cost_micros: int
    currency: str
    submittable: bool
    transformations: tuple[Transformation, ...]
    endpoint: str = ""  # "POST /v1/text_to_video"
    native_request_json: str = ""
    #: `native_request_json` parsed (what a sidecar sends); None when not decoded.
    native_request: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    #: The plan as the control plane stores it (module doc); empty for a plan an adapter built.
    #: When set it is what goes back on the wire, verbatim.
    plan_json: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)


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
    #: Control-plane side only (never on the wire): the call to the adapter itself failed.
    call_failure: CallFailure | None = None

    @property
    def uncertain_at(self) -> str:
        """Where the submit's fate became uncertain, as an attempt records it: the failed call,
        else the provider transport stage; empty when neither is known."""
        if self.call_failure is not None:
            return self.call_failure.value
        return "" if self.transport_stage is TransportStage.NONE else self.transport_stage.value


@dataclass(frozen=True, slots=True)
class JobOutput:
    """A produced output and when its locator stops working (``Output``)."""

    uri: str
    mime_type: str = ""  # "": the provider did not say
    expires_at: datetime | None = None
    size_bytes: int = 0
    checksum: str = ""
    #: The URI needs the provider's credentials, which only the sidecar holds: download it
    #: through the adapter's FetchOutput, never directly.
    fetch_through_adapter: bool = False


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """One observation of a provider job, from a poll or a callback (``JobStatus``, design
    9.8): the normalized state with the provider's raw view kept."""

    state: JobState
    raw_status: str
    raw_payload_json: str = ""
    progress: float | None = None
    outputs: tuple[JobOutput, ...] = ()
    failure: ProviderError | None = None
    #: When the provider last changed the job, if it says.
    updated_at: datetime | None = None
    actual_cost_micros: int | None = None
    currency: str = ""
    #: Position in the provider's (or model server's) queue when it reports one; 0 is next.
    queue_position: int | None = None


@dataclass(frozen=True, slots=True)
class PollResult:
    """GetJob's answer: a snapshot, or the error that kept the adapter from reading it."""

    snapshot: JobSnapshot | None = None
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class CancelResult:
    """CancelJob: whether the provider acknowledged (already-terminal counts)."""

    acknowledged: bool
    snapshot: JobSnapshot | None = None
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class RecoverQuery:
    """RecoverSubmission input (design 9.17.4); account and model default to the plan's."""

    account: str
    model: str
    client_request_key: str
    request_hash: str = ""
    provider_request_id: str = ""
    submitted_after: datetime | None = None
    submitted_before: datetime | None = None
    plan: CompiledPlan | None = None
    #: When the attempt was committed SUBMITTING, without the listing slack of submitted_after:
    #: the sidecar's submit journal proves absence only for a window it covered from this on.
    request_started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RecoverResult:
    """FOUND with a job, NOT_FOUND when conclusive, otherwise INCONCLUSIVE; `method` says how.

    All but the verdict are keywords: `method` and `job` are easy to swap by position."""

    verdict: RecoveryVerdict
    _: KW_ONLY
    method: str = ""
    job: JobRef | None = None
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """A provider usage row, provider units in thousandths. Only a row with a job id AND a
    request identity of one attempt (its client key or recorded provider request id) can
    identify that attempt's job; an aggregate (empty job id) is evidence for reconciliation,
    never a job."""

    provider_job_id: str  # "" for an aggregate (a daily total); never invented
    model: str
    usage_time: datetime | None
    provider_milliunits: int
    provider_unit: str
    cost_micros: int
    currency: str
    raw_json: str
    #: The create call's request id / client key, when the provider's record names them.
    provider_request_id: str = ""
    client_request_key: str = ""


@dataclass(frozen=True, slots=True)
class UsageResult:
    """ListUsage's answer."""

    records: tuple[UsageRecord, ...] = ()
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """One piece of a FetchOutput stream.

    The first piece declares `content_type` and `content_length` (0: unknown); pieces carry the
    body in order; a failed download ends with a piece whose `error` is set (OUTPUT_EXPIRED for
    a gone link, anything else worth another try)."""

    data: bytes = b""
    content_type: str = ""
    content_length: int = 0
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """What an adapter declares about itself (Describe)."""

    adapter: str
    adapter_version: str
    capabilities: tuple[Capability, ...] = ()
    #: The longest one Submit takes inside the adapter (seconds; 0: not declared).
    submit_budget_s: float = 0.0
    #: The provider deduplicates creates by the client request key, so re-sending an UNKNOWN
    #: submit with the same key cannot create a second job. The sidecar's own rule (its
    #: journal's gate); Describe does not carry it: the control plane reads the per-entry
    #: ``operations.client_idempotency_key``.
    honours_idempotency_key: bool = False


@dataclass(frozen=True, slots=True)
class AdapterDescription:
    """Describe as the control plane receives it.

    The capability entries stay schema documents (the form of a capability file), because the
    control plane validates and publishes them exactly like a file (a bad entry rejects the
    publication, it does not fail the call). The journal facts come from the sidecar's submit
    journal, not from the adapter."""

    adapter: str
    adapter_version: str
    capability_documents: tuple[Mapping[str, Any], ...] = ()
    submit_budget_s: float = 0.0
    #: How long the sidecar's submit journal keeps outcomes (seconds).
    submit_journal_retention_s: float = 0.0
    #: Whether the journal survives a sidecar restart (a file) or not (memory only).
    submit_journal_durable: bool = False


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """One model's live load on a provider that reports it (GetLoad; design 9.21): a
    self-hosted model server's queue, warm/cold state, GPU utilisation and VRAM. Seconds are
    the server's own; fractions are 0..1."""

    model: str
    queue_length: int = 0
    warm: bool = False
    cold_start_s: float = 0.0
    gpu_utilization: float = 0.0
    vram_free_mb: int = 0
    vram_total_mb: int = 0
    available_slots: int = 0
    ready_replicas: int = 0


@dataclass(frozen=True, slots=True)
class LoadReport:
    """GetLoad's answer: one `ModelLoad` per model the provider reports on (empty: it reports
    nothing, e.g. a SaaS API), and when it was measured (None: not said)."""

    models: tuple[ModelLoad, ...] = ()
    observed_at: datetime | None = None
