"""One log line per ending (issue 20): every terminal task and every ABANDONED attempt.

The unit of work notes each such move it writes (`Ending`); the database logs the notes once
the unit committed (`log_endings`), so a move that rolled back never logs and a committed one
always does, whichever worker wrote it. Each line binds the ids (`vidroute_core.logs`) and
carries the reason the caller sees: the state change's reason code and the failure GetTask,
WatchTask and the console show (class, code, message).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.persistence.records import Failure
from vidroute_core.logs import bind_ids

log = logging.getLogger(__name__)

#: States whose line is a warning: something did not go as asked.
_BAD = frozenset({"FAILED", "ABANDONED"})


@dataclass(frozen=True, slots=True)
class Ending:
    """A terminal task move, or an attempt's move to ABANDONED (then `attempt_id` is set)."""

    task_id: int
    state: str
    reason: str
    failure: Failure | None = None
    attempt_id: int | None = None

    def line(self) -> str:
        who = f"task {self.task_id}"
        if self.attempt_id is not None:
            who = f"attempt {self.attempt_id} of task {self.task_id}"
        text = f"{who} ended {self.state}: {self.reason or 'no reason given'}"
        f = self.failure
        if f is not None:
            text += f" ({f.failure_class} {f.code}: {f.message})"
        return text


def log_endings(endings: Iterable[Ending]) -> None:
    """Log each committed ending once, with its ids bound."""
    for e in endings:
        with bind_ids(task_id=e.task_id, attempt_id=e.attempt_id):
            log.log(logging.WARNING if e.state in _BAD else logging.INFO, "%s", e.line())
