"""Build the deployable wheels: one per ``packaging/<name>/pyproject.toml``.

    python scripts/build_dists.py [--out DIR] [NAME ...]      # default: every distribution, ./dist

The repository root holds one source tree and the root pyproject is the developer install (all
packages, all entry points: ``make up``/``make test``). Each deployable ships only its part:

    core          vidroute-core              vidroute (protos) + vidroute_core
    client        vidroute-client            clients: the SDK and the `vidroute` command
    controlplane  vidroute-controlplane      controlplane (depends on vidroute-client)
    adapters      vidroute-adapters          adapter_sidecars: common + runway, veo, selfhosted
    contract      vidroute-adapter-contract  adapter_sidecars: contract suite + emulators

setuptools cannot package files outside its project directory, so each build copies the paths
its pyproject lists under ``[tool.vidroute-stage] paths`` into a fresh directory beside that
pyproject and runs ``pip wheel --no-deps --no-build-isolation`` there: no network, the running
interpreter's setuptools, and a wheel holding exactly what was staged (a test checks that).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
NAMES = ("core", "client", "controlplane", "adapters", "contract")
# Never shipped: bytecode and caches of a developer's tree.
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache")


def pyproject(name: str) -> dict[str, Any]:
    """The parsed ``packaging/<name>/pyproject.toml``."""
    return tomllib.loads((PACKAGING / name / "pyproject.toml").read_text(encoding="utf-8"))


def stage_paths(name: str) -> list[str]:
    """The repository-relative paths distribution `name` is built from."""
    paths: list[str] = pyproject(name)["tool"]["vidroute-stage"]["paths"]
    return paths


def wheel_name(name: str) -> str:
    """The file name of the wheel of distribution `name` (pure Python, any platform)."""
    project = pyproject(name)["project"]
    return f"{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"


def stage(name: str, into: Path) -> Path:
    """Copy the pyproject and the source paths of `name` into `into`; return that directory."""
    shutil.copy2(PACKAGING / name / "pyproject.toml", into / "pyproject.toml")
    for rel in stage_paths(name):
        source, target = ROOT / rel, into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=IGNORED)
        else:
            shutil.copy2(source, target)
    return into


def build(name: str, out: Path) -> Path:
    """Build the wheel of distribution `name` into `out`; return the wheel's path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"vidroute-{name}-") as tmp:
        staged = stage(name, Path(tmp))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-build-isolation",
                "--wheel-dir",
                str(out),
                str(staged),
            ],
            check=True,
            cwd=staged,
        )
    return out / wheel_name(name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {NAMES}; default: all")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="wheel directory")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(NAMES)
    if unknown:
        parser.error(f"unknown distributions {sorted(unknown)}; known: {NAMES}")
    for name in args.names or NAMES:
        print(build(name, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
