"""The domain's exceptions: one root, one subclass per thing a caller must handle differently.

The gRPC error interceptor maps each class to exactly one status code (and ``google.rpc``
details); nothing below it raises anything else on purpose. The hierarchy::

    DomainError
    ├── InvalidSpec(violations)                   the spec breaks validation rules (9.4)
    ├── IdempotencyConflict(key, existing, new)   same idempotency key, different spec hash
    ├── IllegalTransition(current, target)        not in a transition table (9.8.1)
    ├── PreconditionFailed(message, numbers)      a business limit stops the operation
    ├── NotFound(resource, resource_id)           the named thing does not exist (for this tenant)
    ├── Unauthenticated(message)                  no valid credentials came with the call
    ├── PermissionDenied(message, operation)      the caller's role or tenant does not allow it
    ├── RateLimited(message, retry_after_s)       the caller sent too much too fast; retry later
    └── Unavailable(dependency, retry_after_s)    a store the operation needs is down; retry later

A provider's failure is not an exception here: adapters return a
`vidroute_core.errors.ProviderError` value, because the scheduler branches on its class
rather than unwinding the stack.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vidroute_core.validation import FieldViolation


class DomainError(Exception):
    """Root of every error the domain raises deliberately."""


class InvalidSpec(DomainError):
    """A request (a `GenerationSpec` or any RPC argument) failed validation; `violations` lists
    every broken rule, in order, each naming its field path."""

    def __init__(self, violations: Sequence[FieldViolation]) -> None:
        self.violations: tuple[FieldViolation, ...] = tuple(violations)
        summary = "; ".join(f"{v.field}: {v.description}" for v in self.violations)
        super().__init__(f"invalid argument: {summary}")


class IdempotencyConflict(DomainError):
    """An idempotency key was reused with a spec whose normalized hash differs (9.7.3)."""

    def __init__(self, key: str, existing_spec_hash: str, requested_spec_hash: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was first used with spec {existing_spec_hash}, "
            f"now with {requested_spec_hash}"
        )
        self.key = key
        self.existing_spec_hash = existing_spec_hash
        self.requested_spec_hash = requested_spec_hash


class IllegalTransition(DomainError):
    """A state change the transition table does not allow."""

    def __init__(self, current: enum.Enum, target: enum.Enum) -> None:
        super().__init__(f"illegal transition {current.value} -> {target.value}")
        self.current = current
        self.target = target


class PreconditionFailed(DomainError):
    """A business limit (budget, quota, attempt cap) stops the operation.

    `numbers` carries the figures that explain it (e.g. ``{"estimated_cost_micros": ...,
    "max_estimated_cost_micros": ...}``) so clients and logs see why without parsing prose.
    """

    def __init__(
        self,
        message: str,
        numbers: Mapping[str, int] | None = None,
        *,
        reason: str = "PRECONDITION_FAILED",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.numbers: Mapping[str, int] = dict(numbers or {})
        # `reason` is the stable ErrorInfo reason; `labels` are its non-numeric metadata
        # (e.g. the safety rule and field that refused a request).
        self.reason = reason
        self.labels: Mapping[str, str] = dict(labels or {})


class NotFound(DomainError):
    """The named resource does not exist, or is not visible to the caller's tenant."""

    def __init__(self, resource: str, resource_id: str) -> None:
        super().__init__(f"{resource} {resource_id!r} not found")
        self.resource = resource
        self.resource_id = resource_id


class Unavailable(DomainError):
    """A dependency the operation needs (the database, Redis) cannot be reached right now.

    Nothing was decided: the caller may retry the same request after `retry_after_s`. The
    persistence seams raise it in place of driver connection errors, so the edge maps one class.
    """

    def __init__(self, dependency: str, retry_after_s: float = 1.0) -> None:
        super().__init__(f"{dependency} is unavailable; retry in {retry_after_s:g} s")
        self.dependency = dependency
        self.retry_after_s = retry_after_s


class Unauthenticated(DomainError):
    """The call carried no credentials, or ones that identify nobody."""


class PermissionDenied(DomainError):
    """The caller is known but its role or tenant does not allow the operation.

    Never raised for reading another tenant's resource: that is `NotFound` (no existence leak).
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str = "",
        reason: str = "PERMISSION_DENIED",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.operation = operation
        # `reason` is the stable ErrorInfo reason; `labels` its other metadata (e.g. the
        # service classes a tenant is entitled to).
        self.reason = reason
        self.labels: Mapping[str, str] = dict(labels or {})


class RateLimited(DomainError):
    """The caller exceeded a rate limit (a tenant's CreateTask rate); nothing was written.

    The caller may retry the same request after `retry_after_s` (RESOURCE_EXHAUSTED with
    RetryInfo at the gRPC edge)."""

    def __init__(
        self, message: str, retry_after_s: float, *, labels: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.labels: Mapping[str, str] = dict(labels or {})
