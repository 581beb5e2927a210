"""The README's adapter-author recipe agrees with the profiles and the shipped configs, for all
three adapters, without starting anything (the recipe itself runs in
tests/e2e/test_adapter_author_recipe.py, for Runway in ``make test``).

What must agree: the emulator flags of the recipe give the emulator exactly the profile's
``emulator_options`` (CI starts it with those); the recipe's adapter port is the example
config's ``listen`` port; and the example config at the recipe's ``VIDROUTE_TIME_SCALE`` gives
the suite short timings (so the recipe's stall tests cost seconds).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter_sidecars.contract.profile import load_profile
from adapter_sidecars.contract.timings import with_adapter_config
from adapter_sidecars.emulators.core import EmulatorConfig
from adapter_sidecars.emulators.runner import config_from_args, config_parser
from tests.support.author_recipe import recipe_block, recipe_variables

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = ("runway", "veo", "selfhosted")
EMULATOR_CONFIGS = {
    "runway": "adapter_sidecars.emulators.runway:RunwayConfig",
    "veo": "adapter_sidecars.emulators.veo:VeoConfig",
    "selfhosted": "adapter_sidecars.emulators.selfhosted:SelfHostedConfig",
}


def _emulator_config(name: str, flags: str) -> EmulatorConfig:
    module, cls_name = EMULATOR_CONFIGS[name].split(":")
    config_cls: type[EmulatorConfig] = getattr(importlib.import_module(module), cls_name)
    args = config_parser(config_cls, name).parse_args(["--port", "0", *shlex.split(flags)])
    return config_from_args(config_cls, args)


def _scale(block: str) -> str:
    match = re.search(r"^export VIDROUTE_TIME_SCALE=(\S+)", block, re.M)
    assert match, "the recipe sets no VIDROUTE_TIME_SCALE"
    return match.group(1)


BLOCK = recipe_block((ROOT / "README.md").read_text(encoding="utf-8"))
VARIABLES = recipe_variables(BLOCK)


def test_recipe_names_every_adapter() -> None:
    """The recipe gives the variables of each of our three adapters."""
    assert sorted(VARIABLES) == sorted(ADAPTERS), VARIABLES


@pytest.mark.parametrize("name", ADAPTERS)
def test_recipe_emulator_flags_give_the_profile_emulator_options(name: str) -> None:
    """Started with the recipe's flags, the emulator has every setting the profile assumes."""
    profile = load_profile(name)
    assert profile.emulator_options, f"profile {name} declares no emulator_options"
    config = dataclasses.asdict(_emulator_config(name, VARIABLES[name]["emulator_flags"]))
    wanted: dict[str, Any] = dict(profile.emulator_options)
    assert {key: config[key] for key in wanted} == wanted


@pytest.mark.parametrize("name", ADAPTERS)
def test_recipe_ports_are_the_example_config_ports(name: str) -> None:
    """The recipe's ports are the example config's listen port and its emulator base URL's."""
    example = ROOT / "adapter_sidecars" / name / "config.example.yaml"
    data = yaml.safe_load(example.read_text(encoding="utf-8"))
    assert str(data["listen"]) == f"127.0.0.1:{VARIABLES[name]['adapter_port']}"
    assert data["provider"]["base_url"] == f"http://127.0.0.1:{VARIABLES[name]['emulator_port']}"


def test_recipe_points_the_sidecar_at_the_recipe_emulator() -> None:
    """The sidecar line takes its listen port and provider URL from the recipe's variables."""
    sidecar = re.compile(
        r"^VIDROUTE_ADAPTER_BASE_URL=http://127\.0\.0\.1:\$emulator_port \\\n"
        r"\s+\.venv/bin/python -m adapter_sidecars\.\$adapter .*"
        r"--listen 127\.0\.0\.1:\$adapter_port &$",
        re.M,
    )
    assert sidecar.search(BLOCK), BLOCK


@pytest.mark.parametrize("name", ADAPTERS)
def test_recipe_time_scale_gives_the_suite_short_timings(name: str) -> None:
    """At the recipe's time scale the example config's submit read and settle are seconds."""
    example = ROOT / "adapter_sidecars" / name / "config.example.yaml"
    scale = _scale(BLOCK)
    profile = with_adapter_config(load_profile(name), example, {"VIDROUTE_TIME_SCALE": scale})
    unscaled = with_adapter_config(load_profile(name), example, {})
    assert profile.submit_read_timeout_s == pytest.approx(
        unscaled.submit_read_timeout_s * float(scale)
    )
    assert 0 < profile.submit_read_timeout_s <= 2.0
    assert profile.recovery_settle_s <= 1.0
