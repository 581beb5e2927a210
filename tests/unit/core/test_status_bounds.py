"""The status mapping's bounds: a BadRequest stays under 8 KiB however many rules a request
breaks, and an outage is UNAVAILABLE with a RetryInfo."""

from __future__ import annotations

import base64

from google.rpc import code_pb2, error_details_pb2, status_pb2

from vidroute_core.exceptions import InvalidSpec, Unavailable
from vidroute_core.validation import FieldViolation
from vidroute_core.wire.status import MAX_VIOLATIONS, to_status


def _trailer_bytes(status: object) -> int:
    """Size of what the client receives as metadata: details (base64) plus the message."""
    total = len(status.details.encode())  # type: ignore[attr-defined]  # a grpc Status, typed object by its caller
    for key, value in status.trailing_metadata:  # type: ignore[attr-defined]  # a grpc Status, typed object by its caller
        raw = value if isinstance(value, bytes) else value.encode()
        total += len(key) + len(base64.b64encode(raw) if key.endswith("-bin") else raw)
    return total


def _details(status: object) -> status_pb2.Status:
    for key, value in status.trailing_metadata:  # type: ignore[attr-defined]  # a grpc Status, typed object by its caller
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    raise AssertionError("no status details")


def test_thousands_of_violations_fit_under_8_kib_with_a_count() -> None:
    violations = [
        FieldViolation(f"references[{i}].object_uri" + "x" * 500, "y" * 5000) for i in range(5000)
    ]
    status = to_status(InvalidSpec(violations))
    assert _trailer_bytes(status) < 8 * 1024
    bad = error_details_pb2.BadRequest()
    assert _details(status).details[0].Unpack(bad)
    shown = len(bad.field_violations) - 1
    assert 0 < shown <= MAX_VIOLATIONS
    assert bad.field_violations[-1].description == f"... and {5000 - shown} more"
    assert all(len(v.description) <= 240 for v in bad.field_violations)


def test_many_short_violations_stop_at_the_count() -> None:
    status = to_status(InvalidSpec([FieldViolation(f"f{i}", "bad") for i in range(100)]))
    bad = error_details_pb2.BadRequest()
    assert _details(status).details[0].Unpack(bad)
    assert len(bad.field_violations) == MAX_VIOLATIONS + 1
    assert bad.field_violations[-1].description == f"... and {100 - MAX_VIOLATIONS} more"


def test_few_violations_are_reported_whole() -> None:
    status = to_status(InvalidSpec([FieldViolation("prompt", "required and must not be blank")]))
    bad = error_details_pb2.BadRequest()
    assert _details(status).details[0].Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("prompt", "required and must not be blank")
    ]
    assert "prompt: required" in status.details


def test_unavailable_carries_a_retry_hint() -> None:
    status = to_status(Unavailable("database", retry_after_s=1.5))
    detail = _details(status)
    assert detail.code == code_pb2.UNAVAILABLE
    info = error_details_pb2.RetryInfo()
    assert detail.details[0].Unpack(info)
    assert (info.retry_delay.seconds, info.retry_delay.nanos) == (1, 500_000_000)
