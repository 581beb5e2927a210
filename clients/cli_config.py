"""Where the client commands connect, and as whom: flags, environment, then a config file.

Precedence, first found wins:

* target: ``--target``, ``VIDROUTE_TARGET``, the file's ``target``, ``localhost:8051``;
* token: ``--token``, ``VIDROUTE_TOKEN``, the file's ``token``, the dev admin token that
  `vidroute up` left in ``./var`` (`clients.auth`), none;
* TLS: ``--tls`` / ``--no-tls``, the file's ``tls`` (``true``: the system roots, or ``ca_file``).

The file is TOML at ``$VIDROUTE_CONFIG``, else ``$XDG_CONFIG_HOME/vidroute/config.toml`` (default
``~/.config/vidroute/config.toml``); a missing default file is no error, a missing
``$VIDROUTE_CONFIG`` is (`vidroute_core.settings.ClientEnv`), and so is a broken file::

    target = "vidroute.internal.example.com:443"
    token = "vrt_..."
    tls = true
    ca_file = "/etc/ssl/certs/internal-ca.pem"   # optional
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from clients import auth as client_auth
from vidroute_core.settings import ClientEnv

DEFAULT_TARGET = "localhost:8051"
_KEYS = frozenset({"target", "token", "tls", "ca_file"})


class ConfigError(ValueError):
    """The config file cannot be read as the CLI's configuration (a usage error)."""


@dataclass(frozen=True)
class Connection:
    """The resolved target, token and transport security of one command."""

    target: str
    token: str
    tls: bool = False
    ca_file: Path | None = None


def config_path(env: Mapping[str, str]) -> Path:
    """``$VIDROUTE_CONFIG``, else the XDG config home's ``vidroute/config.toml``."""
    if env.get("VIDROUTE_CONFIG"):
        return Path(env["VIDROUTE_CONFIG"]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "vidroute" / "config.toml"


def read_file(path: Path) -> dict[str, object]:
    """The file's keys ({} when there is no file); unknown keys and wrong types are errors."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config {path}: {exc}") from None
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(f"config {path}: unknown key(s) {', '.join(unknown)}")
    for key in ("target", "token", "ca_file"):
        if key in data and not isinstance(data[key], str):
            raise ConfigError(f"config {path}: {key} must be a string")
    if "tls" in data and not isinstance(data["tls"], bool):
        raise ConfigError(f"config {path}: tls must be true or false")
    return data


def resolve(
    target: str | None = None,
    token: str | None = None,
    tls: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> Connection:
    """The connection of one command from its flags (None: not given), `env` and the file."""
    env = os.environ if env is None else env
    declared = ClientEnv.load(env)  # an unknown VIDROUTE_* name, a missing named file: refused
    file = read_file(declared.config or config_path(env))
    chosen_target = target or declared.target or str(file.get("target") or "")
    chosen_token = token or declared.token or str(file.get("token") or "")
    if not chosen_token:
        chosen_token = client_auth.token_from_env(env)
    ca = file.get("ca_file")
    return Connection(
        target=chosen_target or DEFAULT_TARGET,
        token=chosen_token.strip(),
        tls=bool(file.get("tls", False)) if tls is None else tls,
        ca_file=Path(str(ca)).expanduser() if ca else None,
    )
