"""A task's stored outputs: every sample of the adopted job (design 9.22).

``generation_tasks.output_asset`` is one JSON object: the first sample's fields at the top
level (what a single-output task always stored, so every reader of one output keeps working)
and, since jobs may render several samples, ``samples``: the list of every stored sample in
``sample_index`` order, the first included. A row written before samples existed has no
``samples`` and reads as its one sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["output_document", "stored_samples"]


def output_document(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``output_asset`` of `samples` (at least one, each with its ``sample_index``)."""
    if not samples:
        raise ValueError("a delivered task has at least one stored sample")
    ordered = sorted((dict(s) for s in samples), key=lambda s: int(s.get("sample_index", 0)))
    return {**ordered[0], "samples": ordered}


def stored_samples(output_asset: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Every stored sample of an ``output_asset`` (old single-object rows: the one), in order."""
    if not output_asset:
        return []
    samples = output_asset.get("samples")
    if isinstance(samples, list) and samples:
        return [dict(s) for s in samples if isinstance(s, Mapping)]
    first = {k: v for k, v in output_asset.items() if k != "samples"}
    first.setdefault("sample_index", 0)
    return [first]
