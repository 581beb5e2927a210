"""The adapter seam's one translation (`vidroute_core.wire.adapter`): every shared type survives
to_proto -> from_proto, and every proto enum value has its Python member and back."""

from __future__ import annotations

import enum
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.sizes import examples
from vidroute_core.adapter import (
    AdapterInfo,
    CallFailure,
    CancelResult,
    CompiledPlan,
    JobOutput,
    JobRef,
    JobSnapshot,
    JobState,
    OutputChunk,
    PollResult,
    RecoverQuery,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    Transformation,
    TransformationKind,
    TransportStage,
    UsageRecord,
    UsageResult,
)
from vidroute_core.capabilities.loader import load_directory, parse_entry
from vidroute_core.errors import ErrorClass, ProviderError, make_error
from vidroute_core.wire import adapter as wire
from vidroute_core.wire.capability import capability_to_proto

ROOT = Path(__file__).resolve().parents[3]

text = st.text(st.characters(codec="utf-8"), max_size=12)
ident = st.text("abcdefghij-0123456789", min_size=1, max_size=10)
micros = st.integers(min_value=0, max_value=10**12)
when = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
maybe_when = st.none() | when


@st.composite
def errors(draw: st.DrawFn) -> ProviderError:
    """Errors as `make_error` builds them (the decoder rebuilds flags with the same matrix)."""
    return make_error(
        draw(st.sampled_from(ErrorClass)),
        draw(text),
        draw(text),
        retry_after_ms=draw(st.none() | st.integers(0, 10**7)),
        raw_status_code=draw(st.none() | st.integers(1, 599)),
    )


maybe_error = st.none() | errors()
job_refs = st.builds(JobRef, ident, text, text, text)
transformations = st.builds(Transformation, text, st.sampled_from(TransformationKind), text)
plans = st.builds(
    CompiledPlan,
    provider=text,
    account=text,
    model=text,
    model_version=text,
    capability_version=text,
    price_version=text,
    request_hash=text,
    estimated_cost_micros=micros,
    currency=st.sampled_from(["", "USD", "EUR"]),
    submittable=st.booleans(),
    transformations=st.lists(transformations, max_size=3).map(tuple),
    endpoint=text,
    native_request_json=text,
)
outputs = st.builds(JobOutput, text, text, maybe_when, micros, text, st.booleans())


@st.composite
def snapshots(draw: st.DrawFn) -> JobSnapshot:
    """A snapshot; a currency travels only with a cost (it is the cost's currency)."""
    cost = draw(st.none() | micros)
    return JobSnapshot(
        state=draw(st.sampled_from(JobState)),
        raw_status=draw(text),
        raw_payload_json=draw(text),
        progress=draw(st.none() | st.floats(0.0, 1.0)),
        outputs=tuple(draw(st.lists(outputs, max_size=2))),
        failure=draw(maybe_error),
        updated_at=draw(maybe_when),
        actual_cost_micros=cost,
        currency="" if cost is None else draw(st.sampled_from(["USD", "EUR"])),
        queue_position=draw(st.none() | st.integers(0, 2**32 - 1)),
    )


submits = st.builds(
    SubmitOutcome,
    kind=st.sampled_from(SubmitKind),
    job=st.none() | job_refs,
    raw_status=text,
    error=maybe_error,
    transport_stage=st.sampled_from(TransportStage),
    request_started_at=maybe_when,
)
queries = st.builds(
    RecoverQuery,
    account=ident,
    model=ident,
    client_request_key=text,
    request_hash=text,
    provider_request_id=text,
    submitted_after=maybe_when,
    submitted_before=maybe_when,
    plan=st.none() | plans,
    request_started_at=maybe_when,
)


@st.composite
def verdicts(draw: st.DrawFn) -> RecoverResult:
    """A verdict; FOUND always names its job (the decoder demotes one that does not)."""
    verdict = draw(st.sampled_from(RecoveryVerdict))
    job = draw(job_refs) if verdict is RecoveryVerdict.FOUND else draw(st.none() | job_refs)
    return RecoverResult(verdict, method=draw(text), job=job, error=draw(maybe_error))


usage_records = st.builds(
    UsageRecord,
    provider_job_id=text,
    model=text,
    usage_time=maybe_when,
    provider_milliunits=micros,
    provider_unit=text,
    cost_micros=micros,
    currency=st.sampled_from(["", "USD"]),
    raw_json=text,
    provider_request_id=text,
    client_request_key=text,
)
chunks = st.builds(OutputChunk, st.binary(max_size=16), text, micros, maybe_error)
#: GetJob carries a snapshot, or only the error that kept the adapter from reading the job.
polls = st.builds(PollResult, snapshots(), st.none()) | st.builds(PollResult, st.none(), errors())
cancels = st.builds(CancelResult, st.booleans(), st.none() | snapshots(), maybe_error)


@settings(max_examples=examples(20, long=60))
@given(plan=plans)
def test_plan_round_trips(plan: CompiledPlan) -> None:
    """A plan an adapter built survives CompilePlan and back, its JSON form kept for re-sending."""
    back = wire.plan_from_proto(wire.plan_to_proto(plan))
    assert back == plan
    assert wire.plan_to_proto(back) == wire.plan_to_proto(plan)  # the stored form, verbatim


@settings(max_examples=60)
@given(snapshot=snapshots())
def test_snapshot_round_trips(snapshot: JobSnapshot) -> None:
    """A job snapshot survives JobStatus and back."""
    msg = wire.snapshot_to_proto(snapshot)
    assert msg is not None
    assert wire.snapshot_from_proto(msg) == snapshot


@settings(max_examples=60)
@given(outcome=submits)
def test_submit_outcome_round_trips(outcome: SubmitOutcome) -> None:
    """A submit outcome survives SubmitResponse and back."""
    assert wire.submit_from_proto(wire.submit_to_proto(outcome)) == outcome


@given(outcome=submits, failure=st.sampled_from(CallFailure))
def test_a_call_failure_never_goes_on_the_wire(
    outcome: SubmitOutcome, failure: CallFailure
) -> None:
    """`CallFailure` is the control plane's own fact: encoding drops it, nothing else changes."""
    sent = replace(outcome, call_failure=failure)
    assert wire.submit_from_proto(wire.submit_to_proto(sent)) == outcome
    assert sent.uncertain_at == failure.value


@settings(max_examples=60)
@given(query=queries)
def test_recover_query_round_trips(query: RecoverQuery) -> None:
    """A recovery query survives RecoverSubmissionRequest and back."""
    assert wire.recover_query_from_proto(wire.recover_query_to_proto(query)) == query


@settings(max_examples=60)
@given(result=verdicts())
def test_recover_result_round_trips(result: RecoverResult) -> None:
    """A recovery verdict survives RecoverSubmissionResponse and back."""
    assert wire.recover_from_proto(wire.recover_to_proto(result)) == result


@settings(max_examples=40)
@given(
    poll=polls,
    cancel=cancels,
    ref=job_refs,
    usage=st.builds(UsageResult, st.lists(usage_records, max_size=3).map(tuple), maybe_error),
    chunk=chunks,
)
def test_the_other_answers_round_trip(
    poll: PollResult, cancel: CancelResult, ref: JobRef, usage: UsageResult, chunk: OutputChunk
) -> None:
    """GetJob, CancelJob, ListUsage, FetchOutput answers and job refs survive their messages."""
    assert wire.poll_from_proto(wire.poll_to_proto(poll)) == poll
    assert wire.cancel_from_proto(wire.cancel_to_proto(cancel)) == cancel
    assert wire.job_ref_from_proto(wire.job_ref_to_proto(ref)) == ref
    assert wire.usage_from_proto(wire.usage_to_proto(usage)) == usage
    assert wire.chunk_from_proto(wire.chunk_to_proto(chunk)) == chunk


def test_describe_carries_the_capabilities_as_documents() -> None:
    """Describe's entries come back as schema documents that parse to the same entries."""
    caps = tuple(load_directory(ROOT / "adapter_sidecars" / "runway" / "capabilities"))
    info = AdapterInfo("runway", "1.2.3", caps, submit_budget_s=42.0)
    described = wire.describe_from_proto(
        wire.describe_to_proto(info, journal_retention_s=600.0, journal_durable=True)
    )
    assert (described.adapter, described.adapter_version) == ("runway", "1.2.3")
    assert described.submit_budget_s == 42.0
    assert (described.submit_journal_retention_s, described.submit_journal_durable) == (600, True)
    again = [capability_to_proto(parse_entry(d)) for d in described.capability_documents]
    assert again == [capability_to_proto(c) for c in caps]


@pytest.mark.parametrize("py_enum", list(wire.ENUMS), ids=lambda e: e.__name__)
def test_every_proto_value_has_its_member_and_back(py_enum: type[enum.Enum]) -> None:
    """Each non-zero proto value maps to a Python member and back to the same number."""
    descriptor, _, _ = wire.ENUMS[py_enum]
    for value in descriptor.values:
        member = wire.enum_from_proto(py_enum, value.number)
        if value.number == 0:
            continue  # unset: the cautious member (or none), checked below
        assert member is not None, value.name
        assert wire.enum_to_proto(member) == value.number


@pytest.mark.parametrize("py_enum", list(wire.ENUMS), ids=lambda e: e.__name__)
def test_every_member_is_a_proto_value(py_enum: type[enum.Enum]) -> None:
    """Each Python member names a proto value; only the member an unset value reads as may be
    the proto's zero (TransportStage.NONE: "no transport failure")."""
    _, _, unset = wire.ENUMS[py_enum]
    for member in py_enum:
        number = wire.enum_to_proto(member)
        assert number != 0 or member is unset, member
        assert wire.enum_from_proto(py_enum, number) is member


def test_call_failure_has_no_proto_enum() -> None:
    """The control-plane-only `CallFailure` is not part of the wire translation."""
    assert CallFailure not in wire.ENUMS
    assert TransportStage.NONE.value not in {
        v.name.removeprefix("TRANSPORT_STAGE_") for v in wire.ENUMS[TransportStage][0].values
    }
