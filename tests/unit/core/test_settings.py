"""The declared environment (`vidroute_core.settings`): unknown names and bad values stop a start
with one line naming the variable; the defaults are the ones the programs had."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapter_sidecars.common.config import parse_config
from clients.cli_config import DEFAULT_TARGET, resolve
from controlplane.bootstrap import DEFAULT_DATABASE_URL, DEFAULT_LISTEN, Settings, dispatcher_config
from controlplane.scheduling.dispatcher import DispatcherConfig
from controlplane.storage.base import MAX_PRESIGN_S
from vidroute_core.settings import (
    MAX_PRESIGN_S as DECLARED_MAX_PRESIGN_S,
)
from vidroute_core.settings import (
    OTHER_PROGRAMS,
    ClientEnv,
    ControlPlaneEnv,
    SettingsError,
    SidecarEnv,
    check_names,
)


def test_a_misspelled_name_is_refused_naming_the_closest_known_one() -> None:
    """VIDROUTE_DATABSE_URL does not silently serve SQLite: one line names it and the fix."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"VIDROUTE_DATABSE_URL": "postgresql+asyncpg://db/vidroute"})
    assert str(caught.value) == (
        "VIDROUTE_DATABSE_URL is not a vidroute setting (did you mean VIDROUTE_DATABASE_URL?)"
    )
    assert "\n" not in str(caught.value)


def test_the_name_check_fails_on_unknown_and_passes_on_every_known_name() -> None:
    """Every declared name of every program, and the tests' own, is accepted by every program;
    a made-up one is not (the rule can fail)."""
    every = {
        name: "x"
        for program in (ControlPlaneEnv, SidecarEnv, ClientEnv)
        for name in program.variables()
    }
    check_names({**every, **dict.fromkeys(OTHER_PROGRAMS, "1"), "PATH": "/bin"})
    with pytest.raises(SettingsError, match="VIDROUTE_MADE_UP is not a vidroute setting"):
        check_names({"VIDROUTE_MADE_UP": "1"})


def test_an_empty_unknown_name_is_unset_and_not_refused() -> None:
    """An empty variable configures nothing (empty is unset), so a blanked one is not refused."""
    check_names({"VIDROUTE_MADE_UP": ""})
    assert Settings.from_env({"VIDROUTE_DATABASE_URL": ""}).database_url == DEFAULT_DATABASE_URL


def test_a_lower_case_vidroute_name_is_refused_too() -> None:
    """``vidroute_listen`` is not VIDROUTE_LISTEN: refused with the right spelling offered."""
    with pytest.raises(SettingsError, match=r"did you mean VIDROUTE_LISTEN\?"):
        check_names({"vidroute_listen": "127.0.0.1:1"})


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("VIDROUTE_LOG_LEVEL", "LOUD", "Input should be 'DEBUG', 'INFO'"),
        ("VIDROUTE_LOG_FORMAT", "xml", "Input should be 'json' or 'text'"),
        ("VIDROUTE_SHARD_COUNT", "0", "greater than or equal to 1"),
        ("VIDROUTE_SHARD_COUNT", "two", "valid integer"),
        ("VIDROUTE_DISPATCH_BATCH_SIZE", "0", "greater than or equal to 1"),
        ("VIDROUTE_DISPATCH_BATCH_SIZE", "5000", "less than or equal to 4096"),
        ("VIDROUTE_API_ONLY", "maybe", "valid boolean"),
        ("VIDROUTE_TIME_SCALE", "2", "less than or equal to 1"),
        ("VIDROUTE_OUTPUT_URL_TTL_S", str(MAX_PRESIGN_S + 1), "less than or equal to"),
        ("VIDROUTE_MAX_TASK_AGE_S", "-1", "greater than or equal to 0"),
        ("VIDROUTE_AUTH", "maybe", "Input should be '', 'required' or 'off'"),
        ("VIDROUTE_ADAPTERS", "runway", "item 1 is not name=value"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(name: str, value: str, says: str) -> None:
    """A value the control plane cannot use stops it, the line naming variable and value."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({name: value})
    line = str(caught.value)
    assert line.startswith(f"{name}={value!r}: ")
    assert says in line
    assert "\n" not in line


def test_a_secret_value_is_never_repeated_in_the_error() -> None:
    """A malformed VIDROUTE_CALLBACK_SECRETS is named, its value (a secret) is not shown."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"VIDROUTE_CALLBACK_SECRETS": "whsec_hunter2"})
    assert "VIDROUTE_CALLBACK_SECRETS" in str(caught.value)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    "name",
    [
        "VIDROUTE_AUTH_FILE",
        "VIDROUTE_BILLING_FILE",
        "VIDROUTE_WEBHOOKS_FILE",
        "VIDROUTE_ROUTING_POLICY_FILE",
        "VIDROUTE_SAFETY_POLICY",
    ],
)
def test_a_named_file_that_is_missing_is_an_error(tmp_path: Path, name: str) -> None:
    """A file variable naming no file stops the start rather than being ignored or crashing."""
    with pytest.raises(SettingsError, match=rf"^{name}='.*missing.yaml': Path does not point"):
        Settings.from_env({name: str(tmp_path / "missing.yaml")})


def test_a_missing_cli_config_file_is_an_error_and_the_default_one_is_not(
    tmp_path: Path,
) -> None:
    """$VIDROUTE_CONFIG naming no file is refused; no file at the default XDG path is fine."""
    with pytest.raises(SettingsError, match=r"^VIDROUTE_CONFIG='.*nope.toml': Path does not"):
        resolve(env={"VIDROUTE_CONFIG": str(tmp_path / "nope.toml")})
    assert resolve(env={"XDG_CONFIG_HOME": str(tmp_path)}).target == DEFAULT_TARGET
    config = tmp_path / "c.toml"
    config.write_text('target = "example:1"\n', encoding="utf-8")
    assert resolve(env={"VIDROUTE_CONFIG": str(config)}).target == "example:1"


def test_the_defaults_are_the_ones_the_control_plane_had() -> None:
    """An empty environment configures what it always did (README's defaults column)."""
    settings = Settings.from_env({})
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.listen == DEFAULT_LISTEN
    assert (settings.redis_url, settings.broker_url, settings.shard_count) == (None, None, 1)
    assert (settings.log_level, settings.log_format, settings.time_scale) == ("INFO", "json", 1.0)
    assert settings.output_url_ttl_s == 3600
    assert (settings.adapter_submit_margin_s, settings.adapter_submit_timeout_s) == (5.0, 0.0)
    assert settings.deadlines.max_task_age_s == 86400
    assert settings.deadlines.max_queue_delay_s == 21600
    assert not settings.api_only
    assert not settings.adapters
    assert not settings.auth_tokens


def test_values_are_parsed_as_before() -> None:
    """Pairs, flags, case and numbers read as the hand-written parser read them."""
    settings = Settings.from_env(
        {
            "VIDROUTE_ADAPTERS": " runway=127.0.0.1:1 , veo=127.0.0.1:2,",
            "VIDROUTE_API_ONLY": "yes",
            "VIDROUTE_LOG_LEVEL": "debug",
            "VIDROUTE_SHARD_COUNT": "3",
            "VIDROUTE_MAX_QUEUE_DELAY_S": "0",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        }
    )
    assert settings.adapters == {"runway": "127.0.0.1:1", "veo": "127.0.0.1:2"}
    assert settings.api_only
    assert settings.log_level == "DEBUG"
    assert settings.shard_count == 3
    assert settings.deadlines.max_queue_delay_s == 0
    assert settings.otel_env == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}


def test_the_dispatch_batch_size_is_the_shipped_default_or_the_environments() -> None:
    """The dispatcher the composition root builds takes VIDROUTE_DISPATCH_BATCH_SIZE, else
    `DispatcherConfig`'s default; its round reads at least two batches of queue heads."""
    shipped = dispatcher_config(Settings.from_env({}))
    assert shipped.batch_size == DispatcherConfig().batch_size == 256
    assert shipped.scan_limit == 512
    tuned = dispatcher_config(Settings.from_env({"VIDROUTE_DISPATCH_BATCH_SIZE": "1000"}))
    assert (tuned.batch_size, tuned.scan_limit) == (1000, 2000)
    small = dispatcher_config(Settings.from_env({"VIDROUTE_DISPATCH_BATCH_SIZE": "8"}))
    assert (small.batch_size, small.scan_limit) == (8, 512)


def test_the_sidecar_overrides_are_the_declared_ones_and_win_over_the_file() -> None:
    """A sidecar's declared VIDROUTE_ADAPTER_* values override its file; a bad one is refused."""
    env = SidecarEnv.load({"VIDROUTE_ADAPTER_READ_TIMEOUT": "7", "VIDROUTE_TIME_SCALE": "1.0"})
    data = {
        "provider": {"base_url": "http://127.0.0.1:1"},
        "time_scale": 0.5,
        "accounts": [{"name": "a", "credential_ref": "env:K:-dev"}],
    }
    config = parse_config(data, {}, env.overrides())
    assert config.timeouts.read == 7
    assert config.time_scale == 1.0
    with pytest.raises(SettingsError, match="VIDROUTE_ADAPTER_POOL_TIMEOUT='0': Input should be"):
        SidecarEnv.load({"VIDROUTE_ADAPTER_POOL_TIMEOUT": "0"})


def test_the_declared_presign_limit_is_the_object_stores() -> None:
    """The kernel's copy of SigV4's 7-day limit is the storage layer's."""
    assert DECLARED_MAX_PRESIGN_S == MAX_PRESIGN_S
