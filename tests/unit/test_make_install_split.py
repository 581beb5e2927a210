"""`make up` installs the runtime dependencies only, and they are enough (issue 13: "runtime and
dev dependencies split so `make up` installs less"); `make up ARGS=...` reaches `vidroute up`.

The Makefile is read through ``make -n -B`` (print every recipe, run none). The shipped code's
imports are read with `ast` and mapped to the installed distributions that provide them; each
must be a runtime dependency of the root pyproject or one of theirs, never only a dev one.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import require_server

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# What `vidroute up` runs: the control plane, the kernel, the generated protos, the CLI, the
# sidecars and emulators. The contract suite is an adapter author's (pytest) tool.
SHIPPED = ("controlplane", "vidroute_core", "vidroute", "clients", "adapter_sidecars")
DEV_TOOLS = ("adapter_sidecars/contract",)
OURS = {"controlplane", "vidroute_core", "vidroute", "clients", "adapter_sidecars", "bench"}


def _make(*args: str) -> list[str]:
    if shutil.which("make") is None:
        require_server("make is not installed")
    # Under `make test` this runs inside make: without its variables the child is a top-level
    # make that prints no "Entering/Leaving directory" lines around the recipe.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return done.stdout.splitlines()


def _pip_installs(lines: list[str]) -> list[str]:
    return [line for line in lines if "-m pip install" in line]


def test_make_up_installs_only_the_runtime_set_and_passes_args() -> None:
    """`make up ARGS=--ephemeral-ports` pip-installs `-e .` (no dev extra) with progress steps
    and runs `vidroute up --ephemeral-ports`."""
    lines = _make("up", "ARGS=--ephemeral-ports")
    installs = _pip_installs(lines)
    assert installs, lines
    assert not [line for line in installs if "[dev]" in line], installs
    assert any(line.rstrip().endswith(" -e .") for line in installs), installs
    assert any("==> [3/3]" in line for line in lines), lines
    assert lines[-1].strip() == ".venv/bin/vidroute up --ephemeral-ports"


def test_make_test_installs_the_dev_extra_under_its_stamp() -> None:
    """`make .venv/.installed` (what test, lint and CI use) installs `.[dev]` and marks the
    runtime stamp too (the dev install is a superset)."""
    lines = _make(".venv/.installed")
    assert any("-e '.[dev]'" in line for line in _pip_installs(lines)), lines
    assert any("touch .venv/.installed .venv/.installed-runtime" in line for line in lines)


def _runtime_closure() -> set[str]:
    """The runtime dependencies of the root pyproject and theirs, as installed here."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in PROJECT["dependencies"]]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for extra in req.extras or {""}:
            for raw in metadata.requires(req.name) or []:
                sub = Requirement(raw)
                if sub.marker is None or sub.marker.evaluate({"extra": extra}):
                    todo.append(sub)
    return seen


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> one file of the shipped code importing it (not stdlib, not ours)."""
    found: dict[str, str] = {}
    for top in SHIPPED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel.startswith(DEV_TOOLS):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    module = name.split(".")[0]
                    if module not in sys.stdlib_module_names and module not in OURS:
                        found.setdefault(module, rel)
    return found


def test_the_runtime_dependencies_provide_every_import_of_the_shipped_code() -> None:
    """Every third-party module the shipped code imports comes from a runtime dependency (or
    one of theirs): `make up`'s smaller install runs what it starts."""
    closure = _runtime_closure()
    providers = metadata.packages_distributions()
    missing = {
        module: (where, providers.get(module))
        for module, where in _third_party_imports().items()
        if not {canonicalize_name(d) for d in providers.get(module, [])} & closure
    }
    assert not missing, f"imported but not provided by a runtime dependency: {missing}"


def test_no_dev_tool_is_a_runtime_dependency() -> None:
    """The dev extra and the runtime list share no distribution: the split leaves the tools out."""
    runtime = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    dev = {canonicalize_name(Requirement(r).name) for r in PROJECT["optional-dependencies"]["dev"]}
    assert not runtime & dev
    assert {"pytest", "ruff", "mypy", "grpcio-tools"} <= dev
