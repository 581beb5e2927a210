"""The composition root reads the policy settings: safety policy file, deadline defaults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.bootstrap import Settings, load_safety_policy
from controlplane.domain.deadlines import DeadlinePolicy, deadlines_for
from controlplane.domain.safety import PolicyError
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec, RoutingPolicy

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def test_deadline_settings_come_from_the_environment_with_defaults() -> None:
    """Unset variables give the platform defaults; set ones (0 included) override them."""
    assert Settings.from_env({}).deadlines == DeadlinePolicy()
    custom = Settings.from_env(
        {"VIDROUTE_MAX_TASK_AGE_S": "600", "VIDROUTE_MAX_QUEUE_DELAY_S": "0"}
    )
    assert custom.deadlines == DeadlinePolicy(max_task_age_s=600.0, max_queue_delay_s=0.0)


def test_the_shipped_policy_is_the_default_and_a_path_replaces_it(tmp_path: Path) -> None:
    """No path loads the shipped policy; a path loads that file; a bad file fails at start."""
    assert load_safety_policy().version == "platform-default-2026-12"
    mine = tmp_path / "policy.yaml"
    mine.write_text("version: mine\nrules: {max_duration_ms: 1000}\n", encoding="utf-8")
    assert load_safety_policy(str(mine)).rules.max_duration_ms == 1000
    mine.write_text("rules: {max_duration: 1000}\n", encoding="utf-8")
    with pytest.raises(PolicyError):
        load_safety_policy(str(mine))


def test_no_platform_limit_leaves_only_the_users_queue_delay() -> None:
    """With both platform limits at 0, deadline_at is unset and the user's delay still holds."""
    spec = GenerationSpec(
        tenant_id="t",
        prompt="p",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(1280, 720, 4000),
        routing=RoutingPolicy(max_queue_delay_ms=2500),
    )
    queue_at, deadline_at = deadlines_for(spec, DeadlinePolicy(0, 0), NOW)
    assert (queue_at, deadline_at) == (NOW + timedelta(milliseconds=2500), None)
