"""The explain record the unit of work writes for a decision (`persistence.explain`, rendered
once from the snapshot) holds exactly `RouteDecisionSnapshot.to_json`'s keys, order and values."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.domain.routing.decision import Outcome, RouteDecisionSnapshot, Verdict
from controlplane.domain.routing.selection import route
from controlplane.persistence._bulk import JsonText, _json_text
from controlplane.persistence.explain import as_document, as_json
from tests.support.sizes import examples
from tests.unit.domain.test_fast_routing import SHADOW, decisions
from tests.unit.domain.test_routing import CATALOG, CFG


def _pairs(text: object) -> Any:
    """The JSON text decoded with every object as its list of (key, value) pairs: key order
    counts (SQLite keeps the text as written)."""
    assert isinstance(text, bytes)
    return json.loads(text, object_pairs_hook=list)


@settings(
    max_examples=examples(75, long=300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(case=decisions(), shadow=st.booleans(), leased=st.integers(0, 2))
def test_the_rendered_record_is_the_snapshots_json(case: Any, shadow: bool, leased: int) -> None:
    """Every decision (selected, waiting, failed; with or without a shadow policy and refused
    leases) renders to the text of its `to_json`, key for key in the same order."""
    spec, ctx, compiled = case
    made = route("7", spec, CATALOG, compiled, cfg=SHADOW if shadow else CFG, ctx=ctx,
                 catalog_version="cat-x")  # fmt: skip
    if made.ranked:
        made = made.after_leasing(
            made.ranked[leased] if leased < len(made.ranked) else None, list(made.ranked[:leased])
        )
    text = as_json(made)
    assert type(text) is JsonText
    assert _pairs(text) == _pairs(json.dumps(made.to_json()).encode())
    assert json.loads(_json_text(text)) == as_document(made) == made.to_json()


def test_values_json_must_escape_are_rendered_as_json_dumps_reads_them() -> None:
    """A candidate and a reason with quotes, backslashes, control and non-ASCII characters, and
    an estimate of None, decode to the same values in the same order."""
    odd = dataclasses.replace(CATALOG[0], account='acc"\\\n\u00e9\u2028', region="r\u0000")
    verdict = Verdict(
        odd, False, "NO_CAPACITY", 'full "window"\t\u00fc', estimated_cost_micros=None
    )
    made = RouteDecisionSnapshot("1", Outcome.NO_CAPACITY, "p\u00e9", "cat", (verdict,), ())
    assert _pairs(as_json(made)) == _pairs(json.dumps(made.to_json()).encode())


def test_a_document_passes_through_as_a_copy() -> None:
    """A record given as a document (tests, tools) is written as it is."""
    doc = {"outcome": "SELECTED", "candidates": []}
    assert as_json(doc) == doc
    assert as_json(doc) is not doc
    assert orjson.loads(_json_text(JsonText(b'{"a":1}'))) == {"a": 1}
