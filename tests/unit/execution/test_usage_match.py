"""`match_usage`: a usage record names this attempt's job only with a job id AND its identity."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from controlplane.execution.evidence import EvidenceKind
from controlplane.execution.usage_match import match_usage
from vidroute_core.adapter import UsageRecord

KEY = "crk-ours"
WHEN = datetime(2026, 6, 1, tzinfo=UTC)


def record(job: str, key: str = "", request: str = "", model: str = "gen4.5") -> UsageRecord:
    return UsageRecord(
        job,
        model,
        WHEN,
        1000,
        "credits",
        10_000,
        "USD",
        "{}",
        provider_request_id=request,
        client_request_key=key,
    )


records = st.lists(
    st.builds(
        record,
        job=st.sampled_from(["", "job-a", "job-b"]),
        key=st.sampled_from(["", KEY, "crk-other"]),
        request=st.sampled_from(["", "req-1", "req-2"]),
        model=st.sampled_from(["gen4.5", "gen4_turbo", ""]),
    ),
    max_size=6,
)


@given(records)
def test_an_adopted_job_always_carries_our_identity(rows: list[UsageRecord]) -> None:
    """Whatever the rows, an adopted job id is non-empty and some row of our model ties it to
    our client key, and it is the only job id so tied."""
    found = match_usage(rows, model="gen4.5", client_request_key=KEY)
    ours = {
        r.provider_job_id
        for r in rows
        if r.provider_job_id and r.client_request_key == KEY and r.model in ("", "gen4.5")
    }
    if found.job_id:
        assert ours == {found.job_id}
        assert found.evidence == ()
    else:
        assert len(ours) != 1


def test_daily_totals_are_an_aggregate_never_a_job() -> None:
    """Runway-like rows (no job id, no identity) adopt nothing and are aggregate evidence."""
    found = match_usage([record(""), record("")], model="gen4.5", client_request_key=KEY)
    assert found.job_id == ""
    [(kind, details)] = found.evidence
    assert kind is EvidenceKind.USAGE_AGGREGATE
    assert details["milliunits"] == 2000


def test_the_recorded_request_id_also_identifies() -> None:
    """A row carrying the provider request id we recorded names our job."""
    found = match_usage(
        [record("job-a", request="req-1"), record("job-b", request="req-2")],
        model="gen4.5",
        client_request_key=KEY,
        provider_request_id="req-1",
    )
    assert found.job_id == "job-a"
