"""`routing.required_model` binds in every routing mode (issue 20): an AUTO task asking for
runway's veo3.1 used to run gen4.5 and be charged for it. Dispatched on a real database, each
mode's attempt runs the required model."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.persistence.database import Database
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.dispatcher import DispatchOutcome
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import dispatch_one, make_spec
from tests.integration.scheduling.test_dispatcher import new_task
from vidroute_core.spec import RoutingMode

MODEL = "veo3.1"


@pytest.mark.parametrize(
    "mode", [RoutingMode.AUTO, RoutingMode.PREFERRED, RoutingMode.STRICT_MODEL]
)
async def test_the_attempt_runs_the_required_model_in_every_mode(
    db: Database, make_dispatcher: DispatcherFactory, mode: RoutingMode
) -> None:
    """AUTO, PREFERRED (preferring another provider) and STRICT_MODEL tasks requiring runway's
    veo3.1 each get an attempt on veo3.1, every other model explained as ineligible."""
    routing: dict[str, Any] = {"mode": mode, "required_model": MODEL}
    if mode is RoutingMode.PREFERRED:
        routing["preferred_providers"] = ("google",)
    task = await new_task(db, make_spec(**routing))
    result = await dispatch_one(make_dispatcher(), task)
    assert result.outcome is DispatchOutcome.SELECTED
    assert result.decision is not None
    others = [v for v in result.decision.verdicts if v.candidate.model != MODEL]
    assert others
    assert not any(v.eligible for v in others)
    detail = await TaskQueries(db).get_task(task.id)
    assert detail is not None
    [attempt] = detail.attempts
    assert attempt.provider_model == MODEL
