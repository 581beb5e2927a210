"""Sidecar configuration: a YAML file plus environment overrides.

Format (every key but ``provider.base_url`` and ``accounts`` has a default)::

    listen: 127.0.0.1:8061             # env VIDROUTE_ADAPTER_LISTEN
    provider:
      base_url: http://127.0.0.1:8101  # env VIDROUTE_ADAPTER_BASE_URL
      options: {api_version: 2024-11-06}   # adapter-specific knobs
    timeouts:                          # seconds; env VIDROUTE_ADAPTER_<NAME>_TIMEOUT
      connect: 5
      write: 10
      read: 30
      submit_read: 60                  # read timeout of the create call only
      pool: 5
    health:
      probe_interval_seconds: 10
    shutdown_grace_seconds: 10
    time_scale: 1.0                    # env VIDROUTE_TIME_SCALE; tests only, see below
    capabilities_dir: null             # default: the adapter package's capabilities/
    submit_journal:                    # submit outcomes by client_request_key (common.journal)
      path: null                       # env VIDROUTE_ADAPTER_SUBMIT_JOURNAL; null: memory only
      retention_s: 21600               # >= the control plane's recovery window (1800 s)
      sole_submitter: false            # true only if no other process submits for these accounts
      clock_skew_s: 5                  # allowed skew between the control plane's clock and ours
    accounts:
      - name: prod-us
        region: us
        credential_ref: env:RUNWAY_API_KEY        # or file:/run/secrets/runway
        options: {on_behalf_of: tenant-ops}       # adapter-specific per account

``credential_ref`` names where the secret lives; the secret itself is read at use time (so a
rotated file is picked up) and only ever held in a `Secret`, whose repr is masked. A dev default
may follow the variable name shell-style, ``env:RUNWAY_API_KEY:-key_dev``; never use one in
production configs. Only the composition root passes ``os.environ`` in; nothing here reads it.

``time_scale`` (or ``VIDROUTE_TIME_SCALE``, which wins) multiplies every duration of the
sidecar together: timeouts, ``provider.options.*_seconds`` (the recovery settle window), the
health probe interval, the shutdown grace, and any ``*_seconds`` field added later
(`vidroute_core.timescale`). A test compresses time with it so that every deadline keeps
its production order against the control plane's, which reads the same variable. Production
configurations never set it (default 1.0).

``submit_journal.sole_submitter`` makes the journal authoritative for absence: RecoverSubmission
may then answer NOT_FOUND for a key the journal never saw (`common.journal`). Set it true only
when this process (or the one process at a time owning its journal file) is the ONLY submitter
for its accounts: one replica, no other sidecar or tool submitting with them, and no overlap of
an old and a new process (k8s: ``replicas: 1`` with ``strategy: {type: Recreate}``; the shipped
manifests run RollingUpdate or two replicas and keep it false, tests/unit/k8s checks that). A
wrong true can declare absent a job another submitter created. ``clock_skew_s`` widens the
window the journal must have covered, because the attempt's times come from the control plane's
clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from vidroute_core.timescale import SECONDS, TimeScaleError, check_factor, scale_durations


class ConfigError(ValueError):
    """The configuration file or an override is invalid; the message names the key."""


class Secret:
    """A credential value that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The raw value, for building one request header."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))


@dataclass(frozen=True, slots=True)
class CredentialRef:
    """Where a secret lives: ``env:NAME[:-dev_default]`` or ``file:/path``."""

    ref: str
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        scheme, _, rest = self.ref.partition(":")
        if scheme not in ("env", "file") or not rest:
            raise ConfigError(f"credential_ref {self._shown()!r} must be env:NAME or file:/path")

    def _shown(self) -> str:
        # A dev default is still a secret-looking string: never echo it.
        return self.ref.split(":-", 1)[0]

    def __repr__(self) -> str:
        return f"CredentialRef({self._shown()!r})"

    def resolve(self) -> Secret:
        """Read the secret now; raises `ConfigError` when it is missing or empty."""
        scheme, _, rest = self.ref.partition(":")
        if scheme == "env":
            name, _, default = rest.partition(":-")
            value = self.environ.get(name) or default
            if not value:
                raise ConfigError(f"environment variable {name} (credential) is not set")
            return Secret(value)
        try:
            value = Path(rest).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read credential file {rest}: {exc.strerror}") from None
        if not value:
            raise ConfigError(f"credential file {rest} is empty")
        return Secret(value)


@dataclass(frozen=True, slots=True)
class Account:
    """A provider account the sidecar may use."""

    name: str
    region: str
    credential: CredentialRef
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Timeouts:
    """HTTP timeouts in seconds; `submit_read` bounds the create call's wait for a response."""

    connect: float = field(default=5.0, metadata=SECONDS)
    write: float = field(default=10.0, metadata=SECONDS)
    read: float = field(default=30.0, metadata=SECONDS)
    submit_read: float = field(default=60.0, metadata=SECONDS)
    pool: float = field(default=5.0, metadata=SECONDS)


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    """Everything a sidecar needs to start."""

    base_url: str
    accounts: tuple[Account, ...]
    listen: str = "127.0.0.1:0"
    timeouts: Timeouts = field(default_factory=Timeouts)
    probe_interval_seconds: float = 10.0
    shutdown_grace_seconds: float = 10.0
    capabilities_dir: Path | None = None
    # The submit journal's append-only file (None: memory only, forgotten on restart) and how
    # long it keeps an outcome; retention must cover the control plane's recovery window.
    submit_journal_path: Path | None = None
    submit_journal_retention_s: float = 21600.0
    # The journal proves absence only when this sidecar is its accounts' only submitter (above).
    submit_journal_sole_submitter: bool = False
    submit_journal_clock_skew_s: float = 5.0
    provider_options: Mapping[str, Any] = field(default_factory=dict)
    # The factor every duration above was already multiplied by (1.0 in production); adapter
    # code that falls back to a built-in default duration multiplies it by this.
    time_scale: float = 1.0

    def account(self, name: str) -> Account | None:
        """The named account; empty name means the first (default) account."""
        if not name:
            return self.accounts[0]
        return next((a for a in self.accounts if a.name == name), None)


_TIMEOUT_KEYS = ("connect", "write", "read", "submit_read", "pool")


def _number(value: Any, key: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a number, got {value!r}") from None
    if number <= 0:
        raise ConfigError(f"{key} must be positive")
    return number


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a mapping")
    return value


def _time_scale(data: Mapping[str, Any], environ: Mapping[str, str]) -> float:
    raw = environ.get("VIDROUTE_TIME_SCALE")
    source = "VIDROUTE_TIME_SCALE" if raw else "time_scale"
    try:
        return check_factor(raw if raw else data.get("time_scale", 1.0), source)
    except TimeScaleError as exc:
        raise ConfigError(str(exc)) from None


def parse_config(
    data: Mapping[str, Any],
    environ: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
) -> SidecarConfig:
    """Build a config from parsed YAML, apply the ``VIDROUTE_*`` `overrides` (by default those
    in `environ`; the sidecar's root passes the declared ones, `SidecarEnv.overrides`), then the
    time scale. `environ` is what ``env:`` credential references read."""
    overrides = environ if overrides is None else overrides
    config = _parse_unscaled(data, environ, overrides)
    factor = _time_scale(data, overrides)
    return replace(scale_durations(config, factor), time_scale=factor)


def _parse_unscaled(
    data: Mapping[str, Any], environ: Mapping[str, str], overrides: Mapping[str, str]
) -> SidecarConfig:
    provider = _mapping(data.get("provider"), "provider")
    base_url = overrides.get("VIDROUTE_ADAPTER_BASE_URL") or provider.get("base_url")
    if not base_url or not str(base_url).startswith(("http://", "https://")):
        raise ConfigError("provider.base_url must be an http(s) URL")
    raw_timeouts = _mapping(data.get("timeouts"), "timeouts")
    unknown = set(raw_timeouts) - set(_TIMEOUT_KEYS)
    if unknown:
        raise ConfigError(f"timeouts: unknown keys {sorted(unknown)}")
    values = {k: _number(v, f"timeouts.{k}") for k, v in raw_timeouts.items()}
    for key in _TIMEOUT_KEYS:
        env_value = overrides.get(f"VIDROUTE_ADAPTER_{key.upper()}_TIMEOUT")
        if env_value:
            values[key] = _number(env_value, f"VIDROUTE_ADAPTER_{key.upper()}_TIMEOUT")
    accounts = _accounts(data.get("accounts"), environ)
    health = _mapping(data.get("health"), "health")
    caps = data.get("capabilities_dir") or overrides.get("VIDROUTE_ADAPTER_CAPABILITIES_DIR")
    return SidecarConfig(
        base_url=str(base_url).rstrip("/"),
        accounts=accounts,
        listen=overrides.get("VIDROUTE_ADAPTER_LISTEN") or str(data.get("listen", "127.0.0.1:0")),
        timeouts=Timeouts(**values),
        probe_interval_seconds=_number(
            health.get("probe_interval_seconds", 10), "health.probe_interval_seconds"
        ),
        shutdown_grace_seconds=_number(
            data.get("shutdown_grace_seconds", 10), "shutdown_grace_seconds"
        ),
        capabilities_dir=Path(caps) if caps else None,
        provider_options=_mapping(provider.get("options"), "provider.options"),
        **_journal(_mapping(data.get("submit_journal"), "submit_journal"), overrides),
    )


def _journal(raw: Mapping[str, Any], overrides: Mapping[str, str]) -> dict[str, Any]:
    unknown = set(raw) - {"path", "retention_s", "sole_submitter", "clock_skew_s"}
    if unknown:
        raise ConfigError(f"submit_journal: unknown keys {sorted(unknown)}")
    path = overrides.get("VIDROUTE_ADAPTER_SUBMIT_JOURNAL") or raw.get("path")
    return {
        "submit_journal_path": Path(str(path)) if path else None,
        "submit_journal_retention_s": _number(
            raw.get("retention_s", 21600), "submit_journal.retention_s"
        ),
        "submit_journal_sole_submitter": _flag(
            raw.get("sole_submitter", False), "submit_journal.sole_submitter"
        ),
        "submit_journal_clock_skew_s": _number(
            raw.get("clock_skew_s", 5), "submit_journal.clock_skew_s"
        ),
    }


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def _accounts(raw: Any, environ: Mapping[str, str]) -> tuple[Account, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("accounts must be a non-empty list")
    accounts: list[Account] = []
    for i, raw_item in enumerate(raw):
        item = _mapping(raw_item, f"accounts[{i}]")
        name, region, ref = item.get("name"), item.get("region", ""), item.get("credential_ref")
        if not name or not isinstance(name, str):
            raise ConfigError(f"accounts[{i}].name is required")
        if not isinstance(ref, str):
            raise ConfigError(f"accounts[{i}].credential_ref is required")
        if any(a.name == name for a in accounts):
            raise ConfigError(f"accounts[{i}]: duplicate account {name!r}")
        accounts.append(
            Account(
                name=name,
                region=str(region),
                credential=CredentialRef(ref, environ),
                options=_mapping(item.get("options"), f"accounts[{i}].options"),
            )
        )
    return tuple(accounts)


def load_config(
    path: Path, environ: Mapping[str, str], overrides: Mapping[str, str] | None = None
) -> SidecarConfig:
    """Read `path` and apply the overrides (`parse_config`)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return parse_config(data, environ, overrides)
