"""Provider error classes and what the scheduler may do about each (design 9.9, 9.9.1, 9.9.2).

Adapters translate a provider's native error into a `ProviderError` with one of the sixteen
`ErrorClass` values; nothing above the adapter branches on raw codes. The handling matrix of 9.9.1
is data (`HANDLING`), so the scheduler, the breaker and the tests read one table.

Two rules override everything else:

* ``SUBMISSION_UNKNOWN``: the provider may hold the job. It is never retried blindly nor failed
  over; it enters recovery (9.17). `ProviderError` refuses to be built otherwise.
* ``SAFETY_INPUT``: a provider refusing the input never triggers failover to a more lenient
  provider; the platform's own policy decides what is allowed (9.9.2).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class ErrorClass(enum.Enum):
    """The sixteen normalized error classes of design 9.9."""

    INVALID_INPUT = "INVALID_INPUT"
    UNSUPPORTED_CAPABILITY = "UNSUPPORTED_CAPABILITY"
    SAFETY_INPUT = "SAFETY_INPUT"
    SAFETY_OUTPUT = "SAFETY_OUTPUT"
    AUTH = "AUTH"
    PERMISSION = "PERMISSION"
    QUOTA = "QUOTA"
    RATE_LIMITED = "RATE_LIMITED"
    PROVIDER_OVERLOADED = "PROVIDER_OVERLOADED"
    TRANSIENT_NETWORK = "TRANSIENT_NETWORK"
    ASSET_UNAVAILABLE = "ASSET_UNAVAILABLE"
    ASSET_INVALID = "ASSET_INVALID"
    INTERNAL_RETRYABLE = "INTERNAL_RETRYABLE"
    INTERNAL_PERMANENT = "INTERNAL_PERMANENT"
    SUBMISSION_UNKNOWN = "SUBMISSION_UNKNOWN"
    OUTPUT_EXPIRED = "OUTPUT_EXPIRED"


class RetryRule(enum.Enum):
    """May the same request go to the same provider again (9.9.1, column 同供应商重试)?"""

    NO = "NO"
    YES = "YES"  # with exponential backoff, jitter and a cap
    DELAYED = "DELAYED"  # only after the provider's window resets (Retry-After, quota period)
    AFTER_FIX = "AFTER_FIX"  # only after the platform repairs the input (re-sign, re-upload)
    REFRESH = "REFRESH"  # do not resubmit; query the job again for a fresh output locator
    PRODUCT_POLICY = "PRODUCT_POLICY"  # off unless the product explicitly opts in


class FailoverRule(enum.Enum):
    """May the task move to another provider or account (9.9.1, column 切换供应商)?"""

    NO = "NO"
    YES = "YES"
    CONDITIONAL = "CONDITIONAL"  # if the other candidate is equivalent and policy allows
    PRODUCT_POLICY = "PRODUCT_POLICY"  # off unless the product explicitly opts in
    USUALLY_NO = "USUALLY_NO"  # the same input would fail everywhere, or must not be tried


@dataclass(frozen=True, slots=True)
class Handling:
    """One row of the handling matrix."""

    retry_same: RetryRule
    failover: FailoverRule
    unknown: bool  # the provider may have accepted: recovery first, never a blind retry
    counts_for_breaker: bool  # a health sample for the circuit breaker (9.15.1)
    note: str
    # 9.15.1: a static account misconfiguration disables the account at once rather than
    # feeding the breaker's failure rate (9.9.1's "先熔断错误账号").
    disables_account: bool = False


_R, _F, _E = RetryRule, FailoverRule, ErrorClass
# The matrix reads as a table; the formatter would put each value on its own line.
# fmt: off
HANDLING: Mapping[ErrorClass, Handling] = MappingProxyType({
    #                                   retry_same         failover           unknown breaker
    _E.INVALID_INPUT:          Handling(_R.NO,             _F.USUALLY_NO,     False,  False,
        "should have been caught while compiling"),
    _E.UNSUPPORTED_CAPABILITY: Handling(_R.NO,             _F.YES,            False,  False,
        "re-select among candidates that have the capability"),
    _E.SAFETY_INPUT:           Handling(_R.NO,             _F.USUALLY_NO,     False,  False,
        "never fail over to get around a refusal; the platform policy decides (9.9.2)"),
    _E.SAFETY_OUTPUT:          Handling(_R.PRODUCT_POLICY, _F.PRODUCT_POLICY, False,  False,
        "regenerating is a product decision (cost, wait, moderation outcome)"),
    _E.AUTH:                   Handling(_R.NO,             _F.YES,            False,  False,
        "switch account or provider; disable the bad account", disables_account=True),
    _E.PERMISSION:             Handling(_R.NO,             _F.YES,            False,  False,
        "switch account or provider; disable the bad account", disables_account=True),
    _E.QUOTA:                  Handling(_R.DELAYED,        _F.YES,            False,  False,
        "tell a short concurrency limit from an exhausted long-term quota"),
    _E.RATE_LIMITED:           Handling(_R.YES,            _F.YES,            False,  False,
        "exponential backoff with jitter, bounded attempts"),
    _E.PROVIDER_OVERLOADED:    Handling(_R.YES,            _F.YES,            False,  True,
        "exponential backoff with jitter, bounded attempts"),
    _E.TRANSIENT_NETWORK:      Handling(_R.YES,            _F.YES,            False,  True,
        "only failures before the request was sent; after that it is SUBMISSION_UNKNOWN"),
    _E.ASSET_UNAVAILABLE:      Handling(_R.AFTER_FIX,      _F.CONDITIONAL,    False,  False,
        "re-sign or re-upload the asset, then retry"),
    _E.ASSET_INVALID:          Handling(_R.NO,             _F.USUALLY_NO,     False,  False,
        "the asset itself is bad; a format only this provider refuses is UNSUPPORTED"),
    _E.INTERNAL_RETRYABLE:     Handling(_R.YES,            _F.YES,            False,  True,
        "only when the provider contract confirms no job was created"),
    _E.INTERNAL_PERMANENT:     Handling(_R.NO,             _F.CONDITIONAL,    False,  False,
        "depends on capability equivalence and the user's routing policy"),
    _E.SUBMISSION_UNKNOWN:     Handling(_R.NO,             _F.NO,             True,   True,
        "recover first (9.17); a blind retry may pay for two videos"),
    _E.OUTPUT_EXPIRED:         Handling(_R.REFRESH,        _F.NO,             False,  False,
        "query the job for a fresh URL; never regenerate"),
})
# fmt: on

_missing = set(ErrorClass) - set(HANDLING)
if _missing:  # pragma: no cover - guards edits to the table above
    raise RuntimeError(f"HANDLING lacks rows for {sorted(c.value for c in _missing)}")


@dataclass(frozen=True, slots=True)
class ProviderError:
    """A provider failure in platform terms (the ``Error`` struct of 9.9).

    `retryable` means the same request may be sent again to the same provider as is (perhaps after
    `retry_after_ms`); `failoverable` means the error itself does not forbid another candidate,
    though routing mode, equivalence and budget still decide (9.16). Build it with `make_error`.
    """

    error_class: ErrorClass
    code: str
    message: str
    retryable: bool
    failoverable: bool
    provider_may_have_accepted: bool
    retry_after_ms: int | None = None
    raw_status_code: int | None = None

    def __post_init__(self) -> None:
        if (
            self.error_class is ErrorClass.SUBMISSION_UNKNOWN
            and not self.provider_may_have_accepted
        ):
            raise ValueError("SUBMISSION_UNKNOWN means the provider may have accepted the job")
        if self.provider_may_have_accepted and (self.retryable or self.failoverable):
            # 9.17: re-sending or failing over while a job may exist can pay for two videos.
            raise ValueError(
                "an error after which the provider may hold the job is never "
                "retried or failed over before recovery"
            )
        if self.retry_after_ms is not None and self.retry_after_ms < 0:
            raise ValueError("retry_after_ms must not be negative")


def make_error(
    error_class: ErrorClass,
    code: str,
    message: str,
    *,
    retry_after_ms: int | None = None,
    raw_status_code: int | None = None,
) -> ProviderError:
    """A `ProviderError` whose flags come from `HANDLING[error_class]`."""
    handling = HANDLING[error_class]
    return ProviderError(
        error_class=error_class,
        code=code,
        message=message,
        retryable=not handling.unknown
        and handling.retry_same in (RetryRule.YES, RetryRule.DELAYED),
        failoverable=not handling.unknown
        and handling.failover in (FailoverRule.YES, FailoverRule.CONDITIONAL),
        provider_may_have_accepted=handling.unknown,
        retry_after_ms=retry_after_ms,
        raw_status_code=raw_status_code,
    )


def may_fail_over(error: ProviderError, *, safety_input_never: bool = True) -> bool:
    """Whether the error allows trying another provider or account.

    A possibly accepted submission never fails over (9.17). A SAFETY_INPUT refusal never does
    while `safety_input_never` holds; a caller passes False only after the platform's own policy
    has allowed the input and the user chose another compliant route (9.9.2).
    """
    if error.provider_may_have_accepted or error.error_class is ErrorClass.SUBMISSION_UNKNOWN:
        return False
    if error.error_class is ErrorClass.SAFETY_INPUT:
        return not safety_input_never
    return error.failoverable


def may_retry_same(error: ProviderError) -> bool:
    """Whether the same request may be re-sent to the same provider without recovery first."""
    return error.retryable and not error.provider_may_have_accepted


_OVERLOAD_STATUSES = frozenset({502, 503, 504})


def classify_http_status(status: int, *, provider_contract_says_not_created: bool) -> ErrorClass:
    """A first classification of a provider's HTTP error status on a submit (9.9.1, 9.17.3).

    A 4xx is a definite refusal, except 409: with client request keys it usually means a job with
    this key exists, so the submission's fate is unknown. A 5xx counts as "not accepted" only when
    the provider's contract says a 5xx never creates a job; otherwise it is SUBMISSION_UNKNOWN.
    429 may be quota or shared overload (9.9.1 note on RESOURCE_EXHAUSTED); adapters refine it
    from the error body, as they refine everything else here.
    """
    if not 400 <= status <= 599:
        raise ValueError(f"HTTP {status} is not an error status")
    if status < 500:
        return {
            401: ErrorClass.AUTH,
            403: ErrorClass.PERMISSION,
            # Unknown model or endpoint for this account: another candidate may have it.
            404: ErrorClass.UNSUPPORTED_CAPABILITY,
            # The server gave up waiting for our request body: nothing was created.
            408: ErrorClass.TRANSIENT_NETWORK,
            409: ErrorClass.SUBMISSION_UNKNOWN,
            429: ErrorClass.RATE_LIMITED,
        }.get(status, ErrorClass.INVALID_INPUT)
    if not provider_contract_says_not_created:
        return ErrorClass.SUBMISSION_UNKNOWN
    if status in _OVERLOAD_STATUSES:
        return ErrorClass.PROVIDER_OVERLOADED
    return ErrorClass.INTERNAL_RETRYABLE


def may_retry_after_fix(error: ProviderError, *, repaired: bool) -> bool:
    """Whether a refused request may be sent once more after the platform repaired its input.

    The AFTER_FIX rows of the matrix (ASSET_UNAVAILABLE: re-sign or re-upload, 9.9.1) allow it
    only for a definite refusal -- the provider's answer proves no job exists -- and only when
    something was actually repaired: the same input would fail the same way."""
    return (
        repaired
        and not error.provider_may_have_accepted
        and HANDLING[error.error_class].retry_same is RetryRule.AFTER_FIX
    )
