"""A routing decision's explain record as stored JSON, rendered once (issue 22, design 9.10.2).

The dispatcher hands the `RouteDecisionSnapshot` itself to the unit of work; the record is
serialised here, once, when the row is written: each verdict's text is its candidate's static
keys, pre-rendered once per candidate (`Candidate.explain_text`), with the verdict's own values
spliced in and its remaining keys (`Verdict.explain_rest`'s) encoded by orjson from the values
the verdict holds (tuples, enums) without building lists of them first. No per-verdict
dict of the whole record is built and encoded again, which had cost about as much as routing
the task (bench/RESULTS.md). The values, keys and order are `RouteDecisionSnapshot.to_json`'s
(`tests/unit/persistence/test_explain_text.py` holds them equal).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from controlplane.domain.routing.decision import (
    Components,
    RouteDecisionSnapshot,
    Verdict,
    round6,
)
from controlplane.persistence._bulk import JsonText

__all__ = ["Explain", "as_document", "as_json"]

#: A stored decision: the snapshot (rendered here) or an already built document (tests, tools).
Explain = RouteDecisionSnapshot | Mapping[str, Any]

# As `_bulk`'s: non-str keys as json.dumps writes them; what orjson refuses raises TypeError.
_OPTIONS = (
    orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
)
_CLOSE = b"}"


def _verdict(v: Verdict) -> bytes:
    """`v.to_json()` as JSON text. The keys after the static ones are `Verdict.explain_rest`'s,
    with the values orjson renders as they are (the transformations' tuples and `StrEnum`
    kinds, the raw components' tuple) instead of lists built first: half the cost."""
    head, mid = v.candidate.explain_text
    cost = v.estimated_cost_micros
    rest: dict[str, Any] = {}
    if not v.eligible:
        rest["reason"] = v.reason
        rest["detail"] = v.detail
    comps = v.components
    if v.score is not None:
        rest["score"] = round6(v.score)
        rest["components"] = comps.as_dict() if type(comps) is Components else dict(comps)
    if v.penalties:
        rest["penalties"] = dict(v.penalties)
    if v.compile is not None:
        rest["transformations"] = v.compile.transformations
    if v.canary:
        rest["canary"] = True
    if type(comps) is Components:
        rest["raw_components"] = comps.raw
    return b"".join(
        (
            head,
            b"true" if v.eligible else b"false",
            mid,
            b"null" if cost is None else orjson.dumps(cost),
            b"," + orjson.dumps(rest, option=_OPTIONS)[1:] if rest else _CLOSE,
        )
    )


def as_json(decision: Explain) -> JsonText | dict[str, Any]:
    """The record for a bulk-inserted JSON column (`_bulk.insert_rows`): a snapshot's JSON
    text, written as it is, or a plain copy of a document."""
    if not isinstance(decision, RouteDecisionSnapshot):
        return dict(decision)
    try:
        verdicts = orjson.Fragment(b"[" + b",".join(map(_verdict, decision.verdicts)) + b"]")
        return JsonText(orjson.dumps(decision.to_json(verdicts), option=_OPTIONS))
    except TypeError:  # a value orjson refuses (an int past 64 bits, ...): json.dumps's way
        return JsonText(json.dumps(decision.to_json()).encode())


def as_document(decision: Explain) -> dict[str, Any]:
    """The record as JSON values, for a column SQLAlchemy's JSON type binds (the single-row
    path: a decision without an attempt)."""
    if isinstance(decision, RouteDecisionSnapshot):
        return decision.to_json()
    return dict(decision)
