"""The sidecar's submit journal: outcomes by client_request_key, kept across a restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from adapter_sidecars.common.journal import Gate, SubmitJournal
from adapter_sidecars.common.types import (
    JobRef,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    TransportStage,
)
from controlplane.domain.errors import ErrorClass, make_error

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def accepted(job_id: str = "job-1") -> SubmitOutcome:
    return SubmitOutcome(SubmitKind.ACCEPTED, job=JobRef(job_id, "prod-us", "gen4.5"))


def rejected(error_class: ErrorClass = ErrorClass.RATE_LIMITED) -> SubmitOutcome:
    return SubmitOutcome(SubmitKind.REJECTED, error=make_error(error_class, "HTTP_429", "slow"))


def unknown() -> SubmitOutcome:
    return SubmitOutcome(
        SubmitKind.UNKNOWN,
        error=make_error(ErrorClass.SUBMISSION_UNKNOWN, "READ_TIMEOUT", "no answer"),
        transport_stage=TransportStage.AWAIT_RESPONSE,
    )


def test_in_flight_key_sends_nothing_and_is_inconclusive() -> None:
    """While a call for a key runs, a second Submit may not call the provider and recovery
    cannot decide."""
    journal = SubmitJournal(retention_s=60)
    journal.begin("k")
    assert journal.gate("k", honours_key=True) == (Gate.IN_FLIGHT, None)
    assert journal.verdict("k") == (RecoveryVerdict.INCONCLUSIVE, None)


def test_accepted_is_replayed_and_found() -> None:
    """A journaled acceptance answers a duplicate Submit and recovery finds its job."""
    journal = SubmitJournal(retention_s=60)
    journal.begin("k")
    journal.finish("k", accepted())
    gate, outcome = journal.gate("k", honours_key=False)
    assert gate is Gate.REPLAY
    assert outcome is not None
    assert outcome.job is not None
    assert outcome.job.provider_job_id == "job-1"
    verdict = journal.verdict("k")
    assert verdict is not None
    assert verdict[0] is RecoveryVerdict.FOUND
    assert verdict[1] is not None
    assert verdict[1].provider_job_id == "job-1"


def test_definite_rejection_allows_retry_and_proves_absence() -> None:
    """Definite rejections created nothing: the same key may be sent again (RETRY_SAME) and
    recovery may say NOT_FOUND."""
    journal = SubmitJournal(retention_s=60)
    journal.begin("k")
    journal.finish("k", rejected())
    assert journal.gate("k", honours_key=False) == (Gate.SEND, None)
    assert journal.verdict("k") == (RecoveryVerdict.NOT_FOUND, None)


def test_unknown_blocks_a_second_call_unless_the_provider_deduplicates() -> None:
    """After an UNKNOWN a provider without idempotency keys gets no second call; one that
    honours the key may be re-sent (it deduplicates); recovery must ask the provider."""
    journal = SubmitJournal(retention_s=60)
    journal.begin("k")
    journal.finish("k", unknown())
    gate, outcome = journal.gate("k", honours_key=False)
    assert gate is Gate.REPLAY
    assert outcome is not None
    assert outcome.kind is SubmitKind.UNKNOWN
    assert journal.gate("k", honours_key=True) == (Gate.SEND, None)
    assert journal.verdict("k") is None


def test_rejection_after_unknown_is_not_proof_of_absence() -> None:
    """An earlier UNKNOWN of the key may have created the job, so a later rejection is not a
    NOT_FOUND."""
    journal = SubmitJournal(retention_s=60)
    for outcome in (unknown(), rejected(ErrorClass.INVALID_INPUT)):
        journal.begin("k")
        journal.finish("k", outcome)
    assert journal.verdict("k") is None


def test_file_journal_survives_a_restart(tmp_path: Path) -> None:
    """A restarted sidecar replays its file: the acceptance is still found, and a call that
    was in flight when the process died counts as UNKNOWN (never re-sent blindly)."""
    path = tmp_path / "journal.jsonl"
    first = SubmitJournal(retention_s=60, path=path)
    first.begin("done")
    first.finish("done", accepted("job-9"))
    first.begin("cut")
    again = SubmitJournal(retention_s=60, path=path)
    verdict = again.verdict("done")
    assert verdict is not None
    assert verdict[1] is not None
    assert verdict[1].provider_job_id == "job-9"
    gate, outcome = again.gate("cut", honours_key=False)
    assert gate is Gate.REPLAY
    assert outcome is not None
    assert outcome.kind is SubmitKind.UNKNOWN
    assert again.durable


def test_entries_older_than_the_retention_are_forgotten(tmp_path: Path) -> None:
    """The journal keeps an outcome for its retention window, then drops it (also on replay)."""
    clock = Clock()
    path = tmp_path / "journal.jsonl"
    journal = SubmitJournal(retention_s=60, path=path, clock=clock)
    journal.begin("k")
    journal.finish("k", accepted())
    clock.now = T0 + timedelta(seconds=59)
    assert journal.verdict("k") is not None
    clock.now = T0 + timedelta(seconds=61)
    assert SubmitJournal(retention_s=60, path=path, clock=clock).verdict("k") is None
    assert journal.verdict("k") is None


def test_the_file_is_compacted_and_keeps_every_live_key(tmp_path: Path) -> None:
    """Once enough lines were appended the file is rewritten without expired keys, and a
    replay still knows every live key, a call still in flight included."""
    clock = Clock()
    path = tmp_path / "journal.jsonl"
    journal = SubmitJournal(retention_s=60, path=path, clock=clock)
    for i in range(400):
        journal.begin(f"old{i}")
        journal.finish(f"old{i}", accepted(f"job-old-{i}"))
    clock.now = T0 + timedelta(seconds=120)
    for i in range(300):
        journal.begin(f"k{i}")
        journal.finish(f"k{i}", accepted(f"job-{i}"))
    journal.begin("running")
    assert len(path.read_text().splitlines()) < 800
    again = SubmitJournal(retention_s=60, path=path, clock=clock)
    assert len(again) == 301
    verdict = again.verdict("k0")
    assert verdict is not None
    assert verdict[1] is not None
    assert verdict[1].provider_job_id == "job-0"
    assert again.verdict("old0") is None
    assert again.gate("running", honours_key=False)[0] is Gate.REPLAY
