"""Sidecar options for emulator-only routes: off by default, declared in Describe when on."""

from __future__ import annotations

import pytest
from adapter_support import sidecar_config

from adapter_sidecars.common.config import ConfigError
from adapter_sidecars.runway.adapter import RunwayAdapter
from adapter_sidecars.veo.adapter import VeoAdapter

ADAPTERS: dict[str, tuple[type[RunwayAdapter] | type[VeoAdapter], str]] = {
    "runway": (RunwayAdapter, "task_listing"),
    "veo": (VeoAdapter, "operation_list"),
}


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_task_search_is_declared_only_with_the_option(name: str) -> None:
    """Runway and Veo declare task_search false on the shipped capabilities (the real APIs have
    no listing) and true on every entry once their listing option is on."""
    cls, option = ADAPTERS[name]
    plain = cls.from_config(sidecar_config("http://127.0.0.1:9", "KEY"))
    listing = cls.from_config(sidecar_config("http://127.0.0.1:9", "KEY", options={option: True}))
    assert plain.capabilities
    assert listing.capabilities
    assert not any(c.operations.task_search for c in plain.describe().capabilities)
    assert all(c.operations.task_search for c in listing.describe().capabilities)


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_a_non_boolean_option_is_a_config_error(name: str) -> None:
    """A listing option that is not true/false fails at start with the key named."""
    cls, option = ADAPTERS[name]
    with pytest.raises(ConfigError, match=f"provider.options.{option}"):
        cls.from_config(sidecar_config("http://127.0.0.1:9", "KEY", options={option: "yes"}))
