"""Provider error classes, the 9.9.1 handling matrix, and the safety and unknown rules."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidroute_core.errors import (
    HANDLING,
    ErrorClass,
    FailoverRule,
    ProviderError,
    RetryRule,
    classify_http_status,
    make_error,
    may_fail_over,
    may_retry_after_fix,
    may_retry_same,
)

E, R, F = ErrorClass, RetryRule, FailoverRule
# The matrix of 9.9.1 (and breaker membership from 9.15.1), restated independently of the code:
# class: (same-provider retry, failover, unknown, counts for breaker, retryable, failoverable)
MATRIX = {
    E.INVALID_INPUT: (R.NO, F.USUALLY_NO, False, False, False, False),
    E.UNSUPPORTED_CAPABILITY: (R.NO, F.YES, False, False, False, True),
    E.SAFETY_INPUT: (R.NO, F.USUALLY_NO, False, False, False, False),
    E.SAFETY_OUTPUT: (R.PRODUCT_POLICY, F.PRODUCT_POLICY, False, False, False, False),
    E.AUTH: (R.NO, F.YES, False, False, False, True),
    E.PERMISSION: (R.NO, F.YES, False, False, False, True),
    E.QUOTA: (R.DELAYED, F.YES, False, False, True, True),
    E.RATE_LIMITED: (R.YES, F.YES, False, False, True, True),
    E.PROVIDER_OVERLOADED: (R.YES, F.YES, False, True, True, True),
    E.TRANSIENT_NETWORK: (R.YES, F.YES, False, True, True, True),
    E.ASSET_UNAVAILABLE: (R.AFTER_FIX, F.CONDITIONAL, False, False, False, True),
    E.ASSET_INVALID: (R.NO, F.USUALLY_NO, False, False, False, False),
    E.INTERNAL_RETRYABLE: (R.YES, F.YES, False, True, True, True),
    E.INTERNAL_PERMANENT: (R.NO, F.CONDITIONAL, False, False, False, True),
    E.SUBMISSION_UNKNOWN: (R.NO, F.NO, True, True, False, False),
    E.OUTPUT_EXPIRED: (R.REFRESH, F.NO, False, False, False, False),
}


def test_sixteen_classes_all_in_matrix() -> None:
    """The design's sixteen error classes exist and each has exactly one matrix row."""
    assert len(ErrorClass) == 16
    assert set(HANDLING) == set(ErrorClass) == set(MATRIX)
    assert {c.value for c in ErrorClass} == {c.name for c in ErrorClass}


@pytest.mark.parametrize("error_class", list(ErrorClass), ids=lambda c: c.value)
def test_matrix_row(error_class: ErrorClass) -> None:
    """Each class's row matches 9.9.1, and make_error derives the flags from it."""
    retry, failover, unknown, breaker, retryable, failoverable = MATRIX[error_class]
    row = HANDLING[error_class]
    assert (row.retry_same, row.failover, row.unknown, row.counts_for_breaker) == (
        retry,
        failover,
        unknown,
        breaker,
    )
    assert row.note
    err = make_error(error_class, "X", "boom", raw_status_code=500, retry_after_ms=10)
    assert (err.retryable, err.failoverable, err.provider_may_have_accepted) == (
        retryable,
        failoverable,
        unknown,
    )
    assert (err.error_class, err.code, err.message) == (error_class, "X", "boom")
    assert (err.raw_status_code, err.retry_after_ms) == (500, 10)
    assert may_retry_same(err) is retryable


def test_auth_and_permission_disable_the_account() -> None:
    """Only account misconfiguration disables the account instead of feeding the breaker."""
    assert {c for c, h in HANDLING.items() if h.disables_account} == {E.AUTH, E.PERMISSION}


def test_safety_input_never_fails_over() -> None:
    """A provider's input-safety refusal never routes the task to a more lenient provider."""
    err = make_error(E.SAFETY_INPUT, "moderation", "refused")
    assert not may_fail_over(err)
    # Even a hand-built error claiming failoverable cannot get around the rule.
    assert not may_fail_over(replace(err, failoverable=True))


def test_safety_input_failover_only_by_explicit_opt_out() -> None:
    """Only a caller that has applied the platform's own policy may lift the safety rule."""
    err = make_error(E.SAFETY_INPUT, "moderation", "refused")
    assert may_fail_over(err, safety_input_never=False)


def test_unknown_submission_never_retried_or_failed_over() -> None:
    """A possibly accepted submission is neither retried nor failed over: it needs recovery."""
    err = make_error(E.SUBMISSION_UNKNOWN, "timeout", "response lost")
    assert err.provider_may_have_accepted
    assert not may_retry_same(err)
    assert not may_fail_over(err)
    assert not may_fail_over(err, safety_input_never=False)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"error_class": E.SUBMISSION_UNKNOWN, "provider_may_have_accepted": False},
        {"error_class": E.INTERNAL_RETRYABLE, "retryable": True},
        {"error_class": E.INTERNAL_RETRYABLE, "failoverable": True},
    ],
)
def test_provider_error_refuses_blind_retry_shapes(kwargs: dict[str, object]) -> None:
    """A ProviderError cannot claim a possibly accepted job is safe to retry or fail over."""
    base: dict[str, object] = {
        "code": "c",
        "message": "m",
        "retryable": False,
        "failoverable": False,
        "provider_may_have_accepted": True,
    }
    with pytest.raises(ValueError, match=r"accepted|provider may hold"):
        ProviderError(**(base | kwargs))  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them


def test_negative_retry_after_rejected() -> None:
    """retry_after_ms, when given, must not be negative."""
    with pytest.raises(ValueError, match="retry_after_ms"):
        make_error(E.RATE_LIMITED, "429", "slow down", retry_after_ms=-1)


@given(st.sampled_from(list(ErrorClass)), st.booleans())
def test_may_fail_over_agrees_with_flags(error_class: ErrorClass, never: bool) -> None:
    """Outside the safety rule, may_fail_over follows the error's failoverable flag."""
    err = make_error(error_class, "c", "m")
    expected = err.failoverable
    if error_class is E.SAFETY_INPUT:
        expected = not never
    assert may_fail_over(err, safety_input_never=never) is expected


@pytest.mark.parametrize(
    ("status", "not_created", "expected"),
    [
        (400, False, E.INVALID_INPUT),
        (422, True, E.INVALID_INPUT),
        (401, False, E.AUTH),
        (403, False, E.PERMISSION),
        (404, False, E.UNSUPPORTED_CAPABILITY),
        (408, False, E.TRANSIENT_NETWORK),
        (409, True, E.SUBMISSION_UNKNOWN),
        (429, False, E.RATE_LIMITED),
        (500, True, E.INTERNAL_RETRYABLE),
        (502, True, E.PROVIDER_OVERLOADED),
        (503, True, E.PROVIDER_OVERLOADED),
        (504, True, E.PROVIDER_OVERLOADED),
        (500, False, E.SUBMISSION_UNKNOWN),
        (503, False, E.SUBMISSION_UNKNOWN),
        (504, False, E.SUBMISSION_UNKNOWN),
    ],
)
def test_classify_http_status(status: int, not_created: bool, expected: ErrorClass) -> None:
    """HTTP statuses map per 9.9.1; a 5xx is unknown unless the contract says nothing was made."""
    assert classify_http_status(status, provider_contract_says_not_created=not_created) is expected


@pytest.mark.parametrize("status", [200, 202, 302, 399, 600])
def test_classify_http_status_rejects_non_errors(status: int) -> None:
    """Only 4xx and 5xx statuses are classified; anything else is a caller bug."""
    with pytest.raises(ValueError, match="not an error"):
        classify_http_status(status, provider_contract_says_not_created=True)


@given(st.sampled_from(list(ErrorClass)), st.booleans())
def test_a_retry_after_fix_needs_an_after_fix_class_a_refusal_and_a_repair(
    error_class: ErrorClass, repaired: bool
) -> None:
    """Only an AFTER_FIX class (ASSET_UNAVAILABLE), definitely refused, and actually repaired may
    be sent once more; a possibly accepted submit never is, whatever was repaired."""
    error = make_error(error_class, "X", "m")
    allowed = may_retry_after_fix(error, repaired=repaired)
    assert allowed == (repaired and error_class is E.ASSET_UNAVAILABLE)
    if error.provider_may_have_accepted:
        assert not allowed
