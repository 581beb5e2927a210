"""The Cog backend's prediction journal: every webhook the model server sent, kept durably.

A Cog server (provider-apis.md §3.5) has no GET of a prediction by id: the only record of how a
prediction ended is the webhook it sent. So the sidecar journals each webhook before it answers
it (a 2xx tells coglet to stop retrying), and GetJob, recovery and usage read this journal.

* `accepted(id)`: the sidecar's PUT was answered, the prediction exists (its age starts here).
* `received(id, payload)`: a webhook arrived. A ``data:`` URL output (Cog's default for file
  outputs) is decoded and kept as a blob beside the journal, so the journal lines stay small and
  FetchOutput can stream the bytes; the payload keeps a ``cog://`` reference instead.
* `latest(id)`: the most advanced payload seen (a terminal one is never replaced: a webhook
  retried after another, or out of order, cannot move a prediction back).

With a path the journal is an append-only JSON-lines file, fsync'd per line (blobs first), and
replayed on start, so a restarted sidecar still answers for predictions that finished while it
ran before; entries older than the retention are dropped at load. Without a path: memory only.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from adapter_sidecars.common.journal import append_durably

__all__ = ["OUTPUT_SCHEME", "TERMINAL", "PredictionJournal", "PredictionRecord"]

log = logging.getLogger(__name__)
#: Cog's terminal prediction statuses.
TERMINAL = frozenset({"succeeded", "failed", "canceled"})
#: Outputs the journal holds are referenced as ``cog://<prediction id>/output/<index>``.
OUTPUT_SCHEME = "cog"
_RANK = {"starting": 0, "processing": 1}


@dataclass(slots=True)
class PredictionRecord:
    """What the journal knows about one prediction."""

    first_at: datetime
    accepted_at: datetime | None = None
    model: str = ""  # the capability model it was submitted for
    payload: dict[str, Any] | None = None  # the most advanced webhook body
    received_at: datetime | None = None
    webhooks: int = 0
    blobs: dict[int, tuple[str, bytes | None]] = field(default_factory=dict)  # idx -> (mime, data)

    @property
    def status(self) -> str:
        return str((self.payload or {}).get("status", ""))

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


def _rank(status: str) -> int:
    return 2 if status in TERMINAL else _RANK.get(status, 0)


class PredictionJournal:
    """Webhooks by prediction id (see the module docstring)."""

    def __init__(
        self,
        *,
        retention_s: float,
        path: Path | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.retention_s = retention_s
        self.path = path
        self._clock = clock
        self._records: dict[str, PredictionRecord] = {}
        #: Since when this journal receives webhooks (a prediction it never heard of has been
        #: silent at least since then).
        self.started_at = clock()
        if path is not None:
            self._blob_dir = path.with_name(path.name + ".outputs")
            self._load(path)

    # -- writing -----------------------------------------------------------------------------
    def accepted(self, prediction_id: str, model: str = "") -> None:
        """The model server answered our PUT for `prediction_id` (run for `model`)."""
        now = self._clock()
        record = self._records.setdefault(prediction_id, PredictionRecord(now))
        if record.accepted_at is None:
            record.accepted_at, record.model = now, model
            entry = {"id": prediction_id, "event": "accepted", "at": now.isoformat()}
            self._append({**entry, "model": model})

    def received(self, prediction_id: str, payload: Mapping[str, Any]) -> None:
        """A webhook for `prediction_id` arrived; journaled before it is acknowledged."""
        now = self._clock()
        record = self._records.setdefault(prediction_id, PredictionRecord(now))
        kept = self._keep_outputs(prediction_id, dict(payload), record)
        self._append({"id": prediction_id, "event": "webhook", "at": now.isoformat(), "body": kept})
        self._apply(record, kept, now)

    def _apply(self, record: PredictionRecord, body: dict[str, Any], at: datetime) -> None:
        record.webhooks += 1
        newer = record.payload is None or _rank(str(body.get("status", ""))) >= _rank(record.status)
        if newer and not record.terminal:  # an end is final: a late "processing" never undoes it
            record.payload, record.received_at = body, at

    def _keep_outputs(
        self, prediction_id: str, body: dict[str, Any], record: PredictionRecord
    ) -> dict[str, Any]:
        output = body.get("output")
        items = output if isinstance(output, list) else [output]
        kept: list[Any] = []
        for index, item in enumerate(items):
            decoded = _data_url(item) if isinstance(item, str) else None
            if decoded is None:
                kept.append(item)
                continue
            mime, data = decoded
            record.blobs[index] = (mime, self._write_blob(prediction_id, index, data))
            kept.append(f"{OUTPUT_SCHEME}://{prediction_id}/output/{index}#{mime}")
        if "output" in body:
            body["output"] = kept if isinstance(output, list) else kept[0]
        return body

    def _write_blob(self, prediction_id: str, index: int, data: bytes) -> bytes | None:
        if self.path is None:
            return data
        self._blob_dir.mkdir(parents=True, exist_ok=True)
        target = self._blob(prediction_id, index)
        tmp = target.with_suffix(".tmp")
        with tmp.open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        return None  # read from the file when fetched

    def _blob(self, prediction_id: str, index: int) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in prediction_id)
        return self._blob_dir / f"{safe}.{index}"

    # -- reading -----------------------------------------------------------------------------
    def get(self, prediction_id: str) -> PredictionRecord | None:
        """The record of `prediction_id`, if the journal has one."""
        return self._records.get(prediction_id)

    def output(self, prediction_id: str, index: int) -> tuple[str, bytes] | None:
        """(MIME type, bytes) of one decoded output, or None when the journal has none."""
        record = self._records.get(prediction_id)
        if record is None or index not in record.blobs:
            return None
        mime, data = record.blobs[index]
        if data is not None:
            return mime, data
        try:
            return mime, self._blob(prediction_id, index).read_bytes()
        except OSError:
            return None

    def finished_between(
        self, start: datetime, end: datetime
    ) -> Iterator[tuple[str, PredictionRecord]]:
        """Predictions whose terminal webhook arrived in [start, end)."""
        for prediction_id, record in self._records.items():
            if record.terminal and record.received_at and start <= record.received_at < end:
                yield prediction_id, record

    def __len__(self) -> int:
        return len(self._records)

    # -- persistence -------------------------------------------------------------------------
    def _append(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        append_durably(self.path, record)

    def _load(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            return
        horizon = self._clock() - timedelta(seconds=self.retention_s)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                entry = json.loads(line)
                prediction_id, at = str(entry["id"]), datetime.fromisoformat(entry["at"])
            except (ValueError, KeyError, TypeError):
                log.warning("prediction journal %s: line %d unreadable, skipped", path, number)
                continue
            record = self._records.setdefault(prediction_id, PredictionRecord(at))
            if entry.get("event") == "accepted":
                record.accepted_at = record.accepted_at or at
                record.model = str(entry.get("model") or record.model)
            elif isinstance(entry.get("body"), dict):
                body = entry["body"]
                self._apply(record, body, at)
                for index, item in enumerate(_as_list(body.get("output"))):
                    if isinstance(item, str) and item.startswith(f"{OUTPUT_SCHEME}://"):
                        record.blobs[index] = (item.partition("#")[2], None)
        for prediction_id in [k for k, r in self._records.items() if r.first_at < horizon]:
            del self._records[prediction_id]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _data_url(value: str) -> tuple[str, bytes] | None:
    """(MIME type, bytes) of a base64 ``data:`` URL, else None."""
    if not value.startswith("data:"):
        return None
    header, sep, data = value[5:].partition(",")
    if not sep or not header.endswith(";base64"):
        return None
    try:
        return header.removesuffix(";base64") or "application/octet-stream", base64.b64decode(
            data, validate=True
        )
    except (binascii.Error, ValueError):
        return None
