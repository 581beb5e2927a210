"""The stored explain JSON of a decision (route_decisions.candidate_snapshot) is rendered as it
was before the per-candidate cache and the rounding cache: same keys, order and values."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.domain.routing import decision as decision_module
from controlplane.domain.routing.decision import Components, Verdict
from controlplane.domain.routing.selection import route
from controlplane.persistence._bulk import _json_text
from tests.support.sizes import examples
from tests.unit.domain.test_fast_routing import SHADOW, decisions
from tests.unit.domain.test_routing import CATALOG, CFG


def _verdict_as_before(v: Verdict) -> dict[str, Any]:
    """`Verdict.to_json` as written before the caches (commit dfc705d)."""
    c = v.candidate
    data: dict[str, Any] = {
        "id": c.id,
        "eligible": v.eligible,
        "provider": c.provider,
        "account": c.account,
        "account_id": c.account_id,
        "region": c.region,
        "model": c.model,
        "model_version": c.model_version,
        "capability_version": c.capability_version,
        "price_version": c.price.price_version,
        "lifecycle": c.lifecycle,
        "currency": c.price.currency,
        "estimated_cost_micros": v.estimated_cost_micros,
    }
    if not v.eligible:
        data.update(reason=v.reason, detail=v.detail)
    comps = v.components
    if v.score is not None:
        plain = (
            {
                n: round(x, 6)
                for n, x in zip(decision_module.COMPONENT_NAMES, comps.raw, strict=True)
            }
            if isinstance(comps, Components)
            else dict(comps)
        )
        data.update(score=round(v.score, 6), components=plain)
    if v.penalties:
        data["penalties"] = dict(v.penalties)
    if v.compile is not None:
        data["transformations"] = [[f, k.value, d] for f, k, d in v.compile.transformations]
    if v.canary:
        data["canary"] = True
    if isinstance(comps, Components):
        data["raw_components"] = list(comps.raw)
    return data


@settings(
    max_examples=examples(75, long=300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(case=decisions(), shadow=st.booleans(), task=st.sampled_from(["1", "77"]))
def test_every_candidates_stored_json_is_rendered_as_before(
    case: Any, shadow: bool, task: str
) -> None:
    """Each verdict's keys (in order) and values, and the whole snapshot's JSON text decoded,
    equal the pre-cache rendering, also when the candidate cache was just dropped."""
    spec, ctx, compiled = case
    cfg = SHADOW if shadow else CFG
    made = route(task, spec, CATALOG, compiled, cfg=cfg, ctx=ctx, catalog_version="cat-x")
    if made.ranked:
        made = made.after_leasing(made.ranked[0], list(made.ranked[1:2]))
    for v in made.verdicts:
        assert list(v.to_json().items()) == list(_verdict_as_before(v).items())
    snapshot = made.to_json()
    assert [list(c.items()) for c in snapshot["candidates"]] == [
        list(_verdict_as_before(v).items()) for v in made.verdicts
    ]
    if made.shadow_policy_version:
        assert snapshot["shadow"]["scores"] == {
            cid: round(s, 6) for cid, s in made.shadow_scores.items()
        }
    assert json.loads(_json_text(snapshot)) == json.loads(json.dumps(snapshot))


def test_a_verdict_of_another_candidate_object_with_the_same_id_renders_its_own_fields() -> None:
    """The static keys belong to each candidate object: a new catalog's candidate under the same
    id (a new capability version) shows its own versions, never another object's."""
    old = CATALOG[0]
    new = dataclasses.replace(old, capability_version="cap-next", model_version="v-next")
    first = Verdict(old, False, "NO_CAPACITY", "full").to_json()
    second = Verdict(new, False, "NO_CAPACITY", "full").to_json()
    assert first["capability_version"] == old.capability_version
    assert (second["capability_version"], second["model_version"]) == ("cap-next", "v-next")


def test_round6_is_round_to_6_places_for_every_value() -> None:
    """Remembered roundings equal ``round(x, 6)`` in value, sign and type (0.0/-0.0, 1/1.0)."""
    values = [0.0, -0.0, 1, 1.0, 0.1234565, 2.5e-7, -3.0000005, 1e300, float("inf")]
    for x in values + values:
        got, want = decision_module.round6(x), round(x, 6)
        assert (repr(got), type(got)) == (repr(want), type(want))
