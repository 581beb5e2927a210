"""The sidecar's submit journal: every Submit outcome by client_request_key (design 9.17.4).

No acceptance may be lost across the seam between the control plane and the sidecar. A Submit
whose gRPC caller gave up (its deadline passed) still runs to its end inside the sidecar; the
journal keeps that late outcome, and RecoverSubmission reads the journal before asking the
provider anything. One journal per sidecar process:

* `begin(key)` marks a provider call in flight; `finish(key, outcome)` records how it ended
  (ACCEPTED with the job, REJECTED, UNKNOWN; an exception of the call is UNKNOWN).
* `gate(key, honours_key)` decides whether a new provider call for the key may start. Never
  while one is in flight or after an ACCEPTED (the journaled outcome is the answer); after an
  UNKNOWN only when the provider honours the idempotency key (the provider then deduplicates);
  after definite REJECTEDs always, because nothing was created and the control plane's
  RETRY_SAME deliberately re-sends with the same key.
* `verdict(key, window)`: FOUND when any outcome of the key was ACCEPTED, NOT_FOUND when every
  outcome was a definite REJECTED, INCONCLUSIVE while a call is in flight; None when the journal
  knows nothing conclusive (no entry, or only UNKNOWN), so the adapter's own search runs.

Absence from the journal is a proof (NOT_FOUND) only when the journal is authoritative for the
key's whole submit `window` (`SubmitWindow`): the sidecar is its accounts' sole submitter
(``submit_journal.sole_submitter``; otherwise another process may have sent it), the journal's
coverage began no later than the attempt's request start minus the clock-skew allowance (every
Submit that could carry the key arrived while it was recording: `begin` is written before a
byte goes to the provider), and the window has settled (now >= submitted_before + the submit
budget + the recovery settle + the skew), so a Submit still in transit from a dead control
plane would have arrived and been journaled. The NOT_FOUND is journaled (fsync'd) before it is
answered, as a definite rejection SUBMIT_PROVEN_ABSENT; from then on a Submit of that key is
refused without any provider call (the refusal is journaled too), so a very late stale request
cannot create a job after absence was declared.

Coverage starts when the journal started recording: the process start for a memory journal; for
a file journal the time its header was first written (kept across restarts and compactions; a
file without a header starts coverage at the load). Retention prunes entries first seen before
now - retention, so coverage is never older than that horizon.
A memory journal forgets its declared absences on a restart; its coverage then starts anew, so
it proves nothing about older requests, and a stale Submit queued for the old process died with
that process's sockets.

Durability: with `path` set the journal is an append-only JSON-lines file (fsync'd per line),
replayed and compacted (entries older than the retention dropped) when the sidecar starts and
whenever enough lines were appended, so the file stays bounded and a restarted
sidecar still knows every outcome of the retention window. A call that was in flight when the
process died has no outcome line: after the restart it counts as UNKNOWN (its fate was never
seen). Without a path the journal lives in memory only and a restart forgets it.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from adapter_sidecars.common.config import SidecarConfig
from adapter_sidecars.common.journal_records import dump_outcome, load_outcome
from vidroute_core.adapter import JobRef, RecoveryVerdict, SubmitKind, SubmitOutcome
from vidroute_core.errors import ErrorClass, make_error

__all__ = ["JOURNAL_METHOD", "PROVEN_ABSENT", "Gate", "SubmitJournal", "SubmitWindow"]

log = logging.getLogger(__name__)
JOURNAL_METHOD = "submit_journal"
#: Appended lines after which the file is rewritten (at least; more with many live keys).
_COMPACT_AFTER = 1000
#: The code of the journal's own definite rejection: recovery proved the key absent.
PROVEN_ABSENT = "SUBMIT_PROVEN_ABSENT"
_HEADER = "covered_from"  # the file's first record: when this journal started recording


class Gate(enum.Enum):
    """What `SubmitJournal.gate` allows for a new Submit of a key."""

    SEND = "SEND"  # start a provider call
    IN_FLIGHT = "IN_FLIGHT"  # a call for the key runs now: answer UNKNOWN, send nothing
    REPLAY = "REPLAY"  # answer the journaled outcome, send nothing
    REFUSE = "REFUSE"  # the key was declared absent: refuse (journal it), send nothing


@dataclass(frozen=True, slots=True)
class SubmitWindow:
    """When an attempt's Submit could have reached this sidecar (control plane's clock)."""

    started_at: datetime | None  # the attempt was committed SUBMITTING: no Submit before this
    submitted_before: datetime | None  # no Submit of the attempt was sent after this
    arrival_s: float  # the submit budget + the recovery settle: a Submit's longest way here


@dataclass(slots=True)
class _Entry:
    """What the journal knows about one key."""

    first_at: datetime
    in_flight: int = 0
    outcomes: list[SubmitOutcome] = field(default_factory=list)

    def accepted(self) -> SubmitOutcome | None:
        return next((o for o in self.outcomes if o.kind is SubmitKind.ACCEPTED and o.job), None)

    def definitely_rejected(self) -> bool:
        return bool(self.outcomes) and all(_definite_rejection(o) for o in self.outcomes)

    def proven_absent(self) -> SubmitOutcome | None:
        return next((o for o in self.outcomes if _is_absence(o)), None)


def append_durably(path: Path, record: dict[str, Any]) -> None:
    """Append `record` to the JSON-lines file at `path` (owner-only), one write and an fsync:
    a journal entry must be on disk before what it records is reported."""
    line = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_absence(outcome: SubmitOutcome) -> bool:
    return outcome.error is not None and outcome.error.code == PROVEN_ABSENT


def _definite_rejection(outcome: SubmitOutcome) -> bool:
    return outcome.kind is SubmitKind.REJECTED and not (
        outcome.error is not None and outcome.error.provider_may_have_accepted
    )


class SubmitJournal:
    """Submit outcomes by client_request_key (see the module docstring)."""

    def __init__(
        self,
        *,
        retention_s: float,
        path: Path | None = None,
        sole_submitter: bool = False,
        clock_skew_s: float = 5.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.retention_s = retention_s
        self.path = path
        self.sole_submitter = sole_submitter
        self.clock_skew_s = clock_skew_s
        self._clock = clock
        self._started = clock()  # a file journal replaces it with its header's time
        self._entries: dict[str, _Entry] = {}
        self._appended = 0
        self._compacted_lines = 0  # lines the last rewrite left; the file stays under 2x + 1000
        if path is not None:
            self._load(path)

    @classmethod
    def from_config(cls, config: SidecarConfig) -> SubmitJournal:
        """The journal a sidecar's configuration asks for (``submit_journal``)."""
        journal = cls(
            retention_s=config.submit_journal_retention_s,
            path=config.submit_journal_path,
            sole_submitter=config.submit_journal_sole_submitter,
            clock_skew_s=config.submit_journal_clock_skew_s,
        )
        if journal.path is None:
            log.warning(
                "submit journal in memory only: a restarted sidecar forgets late submit "
                "outcomes (set submit_journal.path to keep them)"
            )
        else:
            log.info("submit journal %s: %d keys replayed", journal.path, len(journal))
        return journal

    @property
    def durable(self) -> bool:
        """Whether the journal survives a restart (it is a file)."""
        return self.path is not None

    def covered_from(self) -> datetime:
        """Since when every Submit this sidecar received is in the journal (module docstring)."""
        return max(self._started, self._clock() - timedelta(seconds=self.retention_s))

    # -- writing -----------------------------------------------------------------------------
    def begin(self, key: str) -> None:
        """A provider call for `key` starts now."""
        now = self._clock()
        entry = self._entries.setdefault(key, _Entry(now))
        entry.in_flight += 1
        self._append({"key": key, "event": "begin", "at": now.isoformat()})

    def finish(self, key: str, outcome: SubmitOutcome) -> None:
        """The provider call for `key` ended with `outcome`."""
        now = self._clock()
        entry = self._entries.setdefault(key, _Entry(now))
        entry.in_flight = max(0, entry.in_flight - 1)
        entry.outcomes.append(outcome)
        record = {"key": key, "event": "outcome", "at": now.isoformat()}
        self._append({**record, **dump_outcome(outcome)})
        if outcome.kind is not SubmitKind.REJECTED:
            log.info(
                "journal: submit %s %s job=%s",
                key,
                outcome.kind.value,
                outcome.job.provider_job_id if outcome.job else "-",
            )

    def abort(self, key: str) -> None:
        """The call for `key` was refused before anything was sent (a malformed request)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.in_flight = max(0, entry.in_flight - 1)
        if not entry.outcomes and not entry.in_flight:
            del self._entries[key]
        self._append({"key": key, "event": "abort", "at": self._clock().isoformat()})

    def crashed(self, key: str, exc: BaseException) -> None:
        """The provider call for `key` raised: its fate is unknown."""
        self.finish(
            key,
            SubmitOutcome(
                SubmitKind.UNKNOWN,
                error=make_error(
                    ErrorClass.SUBMISSION_UNKNOWN,
                    "ADAPTER_EXCEPTION",
                    f"the submit raised {type(exc).__name__}",
                ),
            ),
        )

    # -- reading -----------------------------------------------------------------------------
    def gate(self, key: str, *, honours_key: bool) -> tuple[Gate, SubmitOutcome | None]:
        """May a new Submit of `key` call the provider? (module docstring)."""
        self._prune()
        entry = self._entries.get(key)
        if entry is None:
            return Gate.SEND, None
        absent = entry.proven_absent()
        if absent is not None:
            return Gate.REFUSE, absent
        if entry.in_flight:
            return Gate.IN_FLIGHT, None
        accepted = entry.accepted()
        if accepted is not None:
            return Gate.REPLAY, accepted
        unsure = [o for o in entry.outcomes if not _definite_rejection(o)]
        if not unsure or honours_key:
            return Gate.SEND, None
        return Gate.REPLAY, unsure[-1]

    def refused(self, key: str, absent: SubmitOutcome) -> None:
        """A Submit of a key declared absent was refused: journal it, as evidence."""
        log.warning("journal: submit %s refused, the key was declared absent", key)
        self.finish(key, absent)

    def verdict(
        self, key: str, window: SubmitWindow | None = None
    ) -> tuple[RecoveryVerdict, JobRef | None] | None:
        """The journal's recovery verdict for `key`, or None when it cannot decide."""
        self._prune()
        entry = self._entries.get(key)
        if entry is None:
            if not self.proves_absence(window):
                return None
            # Journaled (fsync'd) before it is answered: from now on the key is refused.
            self.finish(key, _absence(key))
            log.info("journal: submit %s proven absent (sole submitter, window covered)", key)
            return RecoveryVerdict.NOT_FOUND, None
        accepted = entry.accepted()
        if accepted is not None:
            return RecoveryVerdict.FOUND, accepted.job
        if entry.in_flight:
            return RecoveryVerdict.INCONCLUSIVE, None
        if entry.definitely_rejected():
            return RecoveryVerdict.NOT_FOUND, None
        return None

    def proves_absence(self, window: SubmitWindow | None) -> bool:
        """Would every Submit of `window` be in this journal by now? (module docstring)"""
        if not self.sole_submitter or window is None:
            return False
        if window.started_at is None or window.submitted_before is None:
            return False
        skew = timedelta(seconds=self.clock_skew_s)
        if self.covered_from() > window.started_at - skew:
            return False  # the journal started after the Submit could have arrived
        settled_at = window.submitted_before + timedelta(seconds=window.arrival_s) + skew
        return self._clock() >= settled_at

    def __len__(self) -> int:
        return len(self._entries)

    # -- persistence -------------------------------------------------------------------------
    def _prune(self) -> None:
        horizon = self._clock() - timedelta(seconds=self.retention_s)
        old = [k for k, e in self._entries.items() if e.first_at < horizon and not e.in_flight]
        for key in old:
            del self._entries[key]

    def _append(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        append_durably(self.path, record)
        self._appended += 1
        if self._appended > max(_COMPACT_AFTER, self._compacted_lines):
            # Rewrite what the retention still keeps (this record included: the in-memory
            # state already has it), so the file stays bounded.
            self._prune()
            self._compact(self.path)
            self._appended = 0

    def _load(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                if number == 1 and record.get("event") == _HEADER:
                    self._started = datetime.fromisoformat(record["at"])
                    continue
                key, at = str(record["key"]), datetime.fromisoformat(record["at"])
            except (ValueError, KeyError, TypeError):
                # A torn last line of a crash: everything before it is intact.
                log.warning("journal %s: line %d unreadable, skipped", path, number)
                continue
            entry = self._entries.setdefault(key, _Entry(at))
            if record.get("event") == "outcome":
                entry.outcomes.append(load_outcome(record))
            elif record.get("event") == "begin":
                entry.in_flight += 1
                continue
            entry.in_flight = max(0, entry.in_flight - 1)
            if not entry.outcomes and not entry.in_flight:  # aborted before sending
                del self._entries[key]
        for key, entry in self._entries.items():
            for _ in range(entry.in_flight):  # died mid-call: the fate was never seen
                entry.outcomes.append(
                    SubmitOutcome(
                        SubmitKind.UNKNOWN,
                        error=make_error(
                            ErrorClass.SUBMISSION_UNKNOWN,
                            "SIDECAR_RESTARTED",
                            f"submit {key} was in flight when the sidecar stopped",
                        ),
                    )
                )
            entry.in_flight = 0
        self._prune()
        self._compact(path)

    def _compact(self, path: Path) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        lines = 0
        with tmp.open("w", encoding="utf-8") as out:
            out.write(json.dumps({"event": _HEADER, "at": self._started.isoformat()}) + "\n")
            for key, entry in self._entries.items():
                at = entry.first_at.isoformat()
                for outcome in entry.outcomes:
                    record = {"key": key, "event": "outcome", "at": at}
                    line = json.dumps({**record, **dump_outcome(outcome)}, sort_keys=True)
                    out.write(line + "\n")
                    lines += 1
                for _ in range(entry.in_flight):  # still running: its outcome line follows
                    out.write(json.dumps({"key": key, "event": "begin", "at": at}) + "\n")
                    lines += 1
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        self._compacted_lines = lines


def _absence(key: str) -> SubmitOutcome:
    return SubmitOutcome(
        SubmitKind.REJECTED,
        error=make_error(
            ErrorClass.INTERNAL_PERMANENT,
            PROVEN_ABSENT,
            f"submit {key} was proven absent by the submit journal; it is never sent",
        ),
    )
