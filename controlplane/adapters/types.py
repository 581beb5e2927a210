"""What the scheduler learns from an adapter, in domain terms (no protobuf past this seam).

A compiled plan travels as its JSON form (`CompiledPlan.plan_json`): it is stored verbatim in
``task_attempts.compile_plan`` and sent back unchanged to Submit and RecoverSubmission, so the
request submitted is byte-for-byte the one that was routed, priced and hashed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vidroute_core.errors import ProviderError


class TransformationKind(enum.Enum):
    EXACT = "EXACT"
    LOSSLESS = "LOSSLESS"
    DEGRADE = "DEGRADE"
    REJECT = "REJECT"


class SubmitKind(enum.Enum):
    """The three outcomes of a submit (design 9.5.1)."""

    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    UNKNOWN = "UNKNOWN"


class JobState(enum.Enum):
    """Normalized provider job state; UNRECOGNIZED is non-terminal and flagged."""

    QUEUED = "QUEUED"
    THROTTLED = "THROTTLED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    UNRECOGNIZED = "UNRECOGNIZED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class RecoveryVerdict(enum.Enum):
    FOUND = "FOUND"
    NOT_FOUND = "NOT_FOUND"
    INCONCLUSIVE = "INCONCLUSIVE"


@dataclass(frozen=True, slots=True)
class Transformation:
    field: str
    kind: TransformationKind
    detail: str


@dataclass(frozen=True, slots=True)
class CompiledPlan:
    """A plan for one candidate (design 9.5 CompilePlan)."""

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
    plan_json: dict[str, Any] = field(hash=False, compare=False)


@dataclass(frozen=True, slots=True)
class JobRef:
    provider_job_id: str
    account: str
    model: str = ""
    provider_request_id: str = ""


@dataclass(frozen=True, slots=True)
class SubmitResult:
    kind: SubmitKind
    job: JobRef | None = None
    raw_status: str = ""
    error: ProviderError | None = None
    transport_stage: str = ""
    request_started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobOutput:
    uri: str
    mime_type: str = ""
    expires_at: datetime | None = None
    size_bytes: int = 0
    checksum: str = ""
    # The URI needs the provider's credentials, which only the sidecar holds: download it with
    # `AdapterClient.fetch_output`, never directly.
    fetch_through_adapter: bool = False


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """One piece of an adapter's FetchOutput stream.

    The first piece declares `content_type` and `content_length` (0: unknown); pieces carry the
    body in order; a failed download ends with a piece whose `error` is set (OUTPUT_EXPIRED for
    a gone link, anything else worth another try)."""

    data: bytes = b""
    content_type: str = ""
    content_length: int = 0
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """One observation of a provider job, from a poll or a callback."""

    state: JobState
    raw_status: str
    raw_payload_json: str = ""
    progress: float | None = None
    outputs: tuple[JobOutput, ...] = ()
    failure: ProviderError | None = None
    actual_cost_micros: int | None = None


@dataclass(frozen=True, slots=True)
class PollResult:
    """GetJob's answer: a snapshot, or the error that prevented asking."""

    snapshot: JobSnapshot | None
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class CancelResult:
    acknowledged: bool
    snapshot: JobSnapshot | None = None
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class RecoverQuery:
    account: str
    model: str
    client_request_key: str
    request_hash: str
    plan_json: dict[str, Any]
    submitted_after: datetime
    submitted_before: datetime
    provider_request_id: str = ""
    # When the attempt was committed SUBMITTING, without the listing slack of submitted_after:
    # the sidecar's submit journal proves absence only for a window it covered from this on.
    request_started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RecoverResult:
    verdict: RecoveryVerdict
    job: JobRef | None = None
    method: str = ""
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """A provider usage row. Only a row with a job id AND a request identity of one attempt
    (its client key or recorded provider request id) can identify that attempt's job; an
    aggregate (empty job id) is evidence for reconciliation, never a job."""

    provider_job_id: str
    model: str
    usage_time: datetime | None
    provider_milliunits: int
    provider_unit: str
    cost_micros: int
    currency: str
    raw_json: str
    provider_request_id: str = ""
    client_request_key: str = ""
