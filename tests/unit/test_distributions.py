"""The deployable distributions (packaging/) cover the source tree once, and agree with the
developer install (the root pyproject) on commands and dependency ranges.

A new package directory -- another provider's sidecar, a new kernel module tree -- must be
staged by exactly one distribution, or it would silently ship in no image (or in two).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scripts.build_dists import NAMES, pyproject, stage_paths

ROOT = Path(__file__).resolve().parents[2]
ROOT_PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The root pyproject's import packages (its setuptools include list, without the globs).
TOP_PACKAGES = ("vidroute", "vidroute_core", "controlplane", "adapter_sidecars", "clients")


def shipped_units() -> list[str]:
    """Each top-level package, or for adapter_sidecars (split across two distributions) each of
    its subpackages and its own __init__.py."""
    units = []
    for top in TOP_PACKAGES:
        if top != "adapter_sidecars":
            units.append(top)
            continue
        units.append("adapter_sidecars/__init__.py")
        units.extend(
            f"adapter_sidecars/{p.name}"
            for p in sorted((ROOT / top).iterdir())
            if p.is_dir() and (p / "__init__.py").exists()
        )
    return units


def test_every_package_is_staged_by_exactly_one_distribution() -> None:
    staged = {name: set(stage_paths(name)) for name in NAMES}
    for unit in shipped_units():
        owners = [name for name, paths in staged.items() if unit in paths]
        assert len(owners) == 1, f"{unit} is staged by {owners or 'no distribution'}"
    everything = {p for paths in staged.values() for p in paths}
    assert everything == set(shipped_units()), "a staged path that is no package"


def test_the_developer_install_has_every_command_of_the_distributions() -> None:
    """`pip install -e .` gives the same console scripts, pointing at the same functions."""
    scripts: dict[str, str] = {}
    for name in NAMES:
        for script, target in pyproject(name)["project"].get("scripts", {}).items():
            assert script not in scripts, f"{script} is in two distributions"
            scripts[script] = target
    assert scripts == ROOT_PROJECT["scripts"]


def test_the_distributions_ask_for_no_other_ranges_than_the_developer_install() -> None:
    """Each third-party requirement of a distribution is one the root pyproject has, with the
    same version range, so a wheel never runs on versions the test suite did not."""
    listed = ROOT_PROJECT["dependencies"] + ROOT_PROJECT["optional-dependencies"]["dev"]
    root = {canonicalize_name(r.name): r for r in map(Requirement, listed)}
    ours = {canonicalize_name(pyproject(n)["project"]["name"]) for n in NAMES}
    for name in NAMES:
        for requirement in map(Requirement, pyproject(name)["project"]["dependencies"]):
            dist = canonicalize_name(requirement.name)
            if dist in ours:
                continue
            assert dist in root, f"{name}: {requirement} is not in the root pyproject"
            assert requirement.specifier == root[dist].specifier, (name, str(requirement))
            assert requirement.extras <= root[dist].extras, (name, str(requirement))
