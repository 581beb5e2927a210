"""The dispatcher's view of the quality aggregates (design 9.14): one read per refresh.

`QualityBook.table` reads ``quality_aggregates`` at most once every `refresh_s` (whatever the
number of tasks routed; the dispatcher asks once per round) and turns it into a
`domain.quality.QualityTable`, whose scores are computed once per bucket and prior. A failed read
keeps the last table (logged): routing must not stop for it. Each read also hands the models'
whole-mode acceptance and regeneration ratios to the metrics `sink`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from controlplane.domain.quality import (
    WHOLE_MODE,
    BucketId,
    QualityConfig,
    QualityCounts,
    QualityTable,
)
from controlplane.persistence.database import Database

log = logging.getLogger(__name__)


QualitySink = Callable[[Mapping[tuple[str, str, str], tuple[float, float]]], None]


def whole_mode_ratios(
    counts: Mapping[BucketId, QualityCounts],
) -> dict[tuple[str, str, str], tuple[float, float]]:
    """``(provider, model, mode) -> (user acceptance ratio, regeneration ratio)`` of the models
    with verdicts, from their whole-mode rows (the gauges' figures)."""
    return {
        (p, m, mode): (c.user_acceptance_ratio, c.regeneration_ratio)
        for (p, m, mode, bucket), c in counts.items()
        if bucket == WHOLE_MODE and c.verdicts
    }


class QualityBook:
    """The dispatcher's cached `QualityTable` (module docstring)."""

    def __init__(
        self,
        db: Database,
        *,
        refresh_s: float = 5.0,
        config: QualityConfig | None = None,
        sink: QualitySink | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db, self._refresh_s, self._sink, self._monotonic = db, refresh_s, sink, monotonic
        self._cfg = config or QualityConfig()
        self._table = QualityTable({}, self._cfg, version="empty")
        self._read_at: float | None = None
        self.reads = 0

    def invalidate(self) -> None:
        """Read again at the next `table` call."""
        self._read_at = None

    async def table(self) -> QualityTable:
        now = self._monotonic()
        if self._read_at is not None and now - self._read_at < self._refresh_s:
            return self._table
        self._read_at = now
        try:
            async with self._db.reads() as reads:
                counts = await reads.quality_aggregates()
        except Exception:  # keep routing on the last figures
            log.warning("quality aggregates could not be read; using the last ones", exc_info=True)
            return self._table
        self.reads += 1
        self._table = QualityTable(counts, self._cfg, version=f"q{self.reads}")
        if self._sink is not None:
            self._sink(whole_mode_ratios(counts))
        return self._table
