"""The sidecar's submit journal: outcomes by client_request_key, kept across a restart, and its
proof of absence when it is the accounts' sole submitter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from adapter_sidecars.common.config import ConfigError, SidecarConfig, parse_config
from adapter_sidecars.common.journal import PROVEN_ABSENT, Gate, SubmitJournal, SubmitWindow
from vidroute_core.adapter import (
    JobRef,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    TransportStage,
)
from vidroute_core.errors import ErrorClass, make_error

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


# --- proof of absence (submit_journal.sole_submitter) --------------------------------------------

SKEW_S = 5.0
ARRIVAL_S = 30.0  # submit budget + settle, as the servicer computes it
STARTED = T0 + timedelta(seconds=10)  # the attempt was committed SUBMITTING (>= T0 + skew)
BEFORE = T0 + timedelta(seconds=20)  # it went unknown; no Submit of it was sent later
SETTLED = BEFORE + timedelta(seconds=ARRIVAL_S + SKEW_S)
WINDOW = SubmitWindow(started_at=STARTED, submitted_before=BEFORE, arrival_s=ARRIVAL_S)


def authoritative(clock: Clock, path: Path | None = None) -> SubmitJournal:
    return SubmitJournal(
        retention_s=3600, path=path, sole_submitter=True, clock_skew_s=SKEW_S, clock=clock
    )


def test_an_unseen_key_is_proven_absent_once_the_covered_window_settled() -> None:
    """A sole submitter's journal that covered the whole window answers NOT_FOUND for a key it
    never saw, and from then on refuses a Submit of that key."""
    clock = Clock()
    journal = authoritative(clock)
    clock.now = SETTLED
    assert journal.verdict("never-sent", WINDOW) == (RecoveryVerdict.NOT_FOUND, None)
    gate, refusal = journal.gate("never-sent", honours_key=False)
    assert gate is Gate.REFUSE
    assert refusal is not None
    assert refusal.kind is SubmitKind.REJECTED
    assert refusal.error is not None
    assert refusal.error.code == PROVEN_ABSENT
    assert not refusal.error.provider_may_have_accepted
    assert journal.gate("never-sent", honours_key=True)[0] is Gate.REFUSE


def test_no_proof_without_sole_submitter() -> None:
    """When another process may submit for the accounts, an unseen key proves nothing."""
    clock = Clock()
    journal = SubmitJournal(retention_s=3600, clock_skew_s=SKEW_S, clock=clock)
    clock.now = SETTLED + timedelta(hours=1)
    assert journal.verdict("never-sent", WINDOW) is None
    assert journal.gate("never-sent", honours_key=False) == (Gate.SEND, None)


def test_no_proof_when_the_journal_started_after_the_request_could_arrive() -> None:
    """A journal that began recording later than the request start minus the skew allowance
    may have missed the Submit: no proof (a restarted memory journal is this case)."""
    clock = Clock()
    journal = authoritative(clock)
    clock.now = SETTLED
    late_start = SubmitWindow(T0 + timedelta(seconds=SKEW_S - 1), BEFORE, ARRIVAL_S)
    assert journal.verdict("k", late_start) is None
    on_the_edge = SubmitWindow(T0 + timedelta(seconds=SKEW_S), BEFORE, ARRIVAL_S)
    assert journal.verdict("k", on_the_edge) == (RecoveryVerdict.NOT_FOUND, None)


def test_no_proof_before_the_window_settled_or_without_a_window() -> None:
    """A Submit still in transit could arrive until submitted_before + budget + settle + skew;
    before then, or without a known request start, the journal proves nothing."""
    clock = Clock()
    journal = authoritative(clock)
    clock.now = SETTLED - timedelta(seconds=1)
    assert journal.verdict("k", WINDOW) is None
    assert journal.verdict("k") is None
    clock.now = SETTLED
    assert journal.verdict("k", SubmitWindow(None, BEFORE, ARRIVAL_S)) is None
    assert journal.gate("k", honours_key=False) == (Gate.SEND, None)
    assert journal.verdict("k", WINDOW) == (RecoveryVerdict.NOT_FOUND, None)


def test_a_journaled_key_is_never_proven_absent() -> None:
    """A key the journal saw (in flight, or ended UNKNOWN) is never turned into NOT_FOUND."""
    clock = Clock()
    journal = authoritative(clock)
    clock.now = STARTED
    journal.begin("running")
    journal.begin("lost")
    journal.finish("lost", unknown())
    clock.now = SETTLED
    assert journal.verdict("running", WINDOW) == (RecoveryVerdict.INCONCLUSIVE, None)
    assert journal.verdict("lost", WINDOW) is None


def test_file_coverage_and_the_absence_survive_a_restart(tmp_path: Path) -> None:
    """A file journal keeps its coverage start (its header) and the declared absence across
    a restart: the restarted sidecar still proves the window and still refuses the key."""
    clock = Clock()
    path = tmp_path / "journal.jsonl"
    authoritative(clock, path)
    clock.now = SETTLED
    again = authoritative(clock, path)
    assert again.covered_from() == T0
    assert again.verdict("gone", WINDOW) == (RecoveryVerdict.NOT_FOUND, None)
    third = authoritative(clock, path)
    assert third.gate("gone", honours_key=False)[0] is Gate.REFUSE
    memory = authoritative(clock)  # a memory journal restarted now covers only from now
    assert memory.covered_from() == SETTLED
    assert memory.verdict("other", WINDOW) is None


def test_a_file_without_header_covers_only_from_its_load(tmp_path: Path) -> None:
    """A journal file with no coverage header (written before it existed) proves nothing
    about requests older than the moment it was loaded."""
    clock = Clock()
    path = tmp_path / "journal.jsonl"
    path.write_text('{"key":"x","event":"begin","at":"2026-06-01T11:00:00+00:00"}\n')
    clock.now = SETTLED
    journal = authoritative(clock, path)
    assert journal.covered_from() == SETTLED
    assert journal.verdict("k", WINDOW) is None


def test_retention_moves_the_coverage_start_forward() -> None:
    """Entries older than the retention are pruned, so coverage never reaches further back
    than now - retention: an old window is no longer proven."""
    clock = Clock()
    journal = SubmitJournal(retention_s=60, sole_submitter=True, clock_skew_s=SKEW_S, clock=clock)
    clock.now = T0 + timedelta(seconds=100)
    assert journal.covered_from() == T0 + timedelta(seconds=40)
    assert journal.verdict("k", WINDOW) is None


def _journal_config(
    section: dict[str, object], environ: dict[str, str] | None = None
) -> SidecarConfig:
    return parse_config(
        {
            "provider": {"base_url": "http://127.0.0.1:1"},
            "accounts": [{"name": "prod-us", "credential_ref": "env:K"}],
            "submit_journal": section,
        },
        environ or {},
    )


def test_sole_submitter_is_off_unless_set_to_a_boolean() -> None:
    """sole_submitter defaults to false, must be a YAML boolean (a string is refused, naming
    the key), and the clock-skew allowance is scaled with every other duration."""
    assert not _journal_config({}).submit_journal_sole_submitter
    assert _journal_config({"sole_submitter": True}).submit_journal_sole_submitter
    with pytest.raises(ConfigError, match=r"submit_journal\.sole_submitter"):
        _journal_config({"sole_submitter": "yes"})
    with pytest.raises(ConfigError, match="unknown keys"):
        _journal_config({"sole_submiter": True})
    scaled = _journal_config({"clock_skew_s": 5}, {"VIDROUTE_TIME_SCALE": "0.1"})
    assert scaled.submit_journal_clock_skew_s == pytest.approx(0.5)
    journal = SubmitJournal.from_config(_journal_config({"sole_submitter": True}))
    assert journal.sole_submitter
    assert journal.clock_skew_s == 5.0
