"""The collector settings of a process that dispatches (issue 10: dispatcher CPU per task).

With CPython's default thresholds (700, 10, 10) a dispatch round of 256 tasks runs hundreds of
generation-0 collections, and each full collection walks every object alive since start-up
(imports, the catalog, SQLAlchemy's compiled statements: ~130,000 of them): in
``bench.dispatch`` the collector was 0.4-0.5 ms of the ~1.2 ms of dispatcher CPU per task.

`tune_gc`, once per process (`vidroute serve` / `up` once the control plane has started, in
`clients.cli`; the benchmarks after their set-up):

- ``gc.freeze()`` after one full collection: what start-up built moves to the permanent
  generation and is never walked again. Reference counting still frees it when it goes; only
  a reference cycle among those objects, made garbage later, stays (start-up state lives for
  the whole process anyway).
- generation 0 collected every `GEN0_THRESHOLD` allocations instead of 700: most of a round's
  objects die by reference counting before a collection sees them, so fewer survive into the
  older generations. Generations 1 and 2 keep their ratios (10, 10): cyclic garbage is still
  found, ~14x less often.
"""

from __future__ import annotations

import gc

__all__ = ["GEN0_THRESHOLD", "tune_gc"]

GEN0_THRESHOLD = 10_000

_STATE = {"tuned": False}


def tune_gc() -> bool:
    """Freeze the start-up heap and raise the generation-0 threshold (see module); True the
    first time in a process, False (nothing done) after."""
    if _STATE["tuned"]:
        return False
    _STATE["tuned"] = True
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GEN0_THRESHOLD, gen0), gen1, gen2)
    return True
