"""The dispatching process's collector settings (controlplane.scheduling.heap)."""

from __future__ import annotations

import gc

import pytest

from controlplane.scheduling import heap


def test_tune_gc_freezes_the_startup_heap_and_raises_generation_0_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first call moves what is alive into the permanent generation and collects generation
    0 every 10,000 allocations, generations 1 and 2 keeping their ratios; a second changes
    nothing."""
    monkeypatch.setitem(heap._STATE, "tuned", False)
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        frozen_before = gc.get_freeze_count()
        keep = [[i] for i in range(1000)]  # alive at the freeze
        assert heap.tune_gc() is True
        assert gc.get_freeze_count() >= frozen_before + len(keep)
        assert gc.get_threshold() == (heap.GEN0_THRESHOLD, 10, 10)
        frozen = gc.get_freeze_count()
        assert heap.tune_gc() is False
        # Nothing frozen again (frozen objects may still be freed by reference counting).
        assert gc.get_freeze_count() <= frozen
        assert gc.get_threshold() == (heap.GEN0_THRESHOLD, 10, 10)
    finally:
        gc.unfreeze()  # the rest of the test session keeps the default collector
        gc.set_threshold(*before)
