"""Run an installed wheel's entry point as production would: only that wheel and what it declares.

The developer's venv holds every package of the repository (an editable install) and every
third-party library of every side. To see what a deployable really needs, the wheels are
installed with ``pip install --no-deps --target DIR`` and run by an interpreter started with
``-S`` (no site-packages, so no editable finder and no source tree). The venv's site-packages is
appended to ``sys.path`` for the third-party code, behind an import hook that refuses every file
there that does not belong to a distribution the installed wheels declare (directly or through
dependencies, extras followed): an undeclared import fails as it would in the image, while an
optional one (``try: import click``) is skipped as it would be there too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SITE = sysconfig.get_paths()["purelib"]
# The child's first statements: its import path (the target, the standard library without ""
# -- the working directory --, then site-packages), the hook that hides undeclared files, and a
# report of every loaded module at exit. Then it runs one entry point of one distribution.
BOOT = """
import atexit, importlib.abc, importlib.machinery, json, os, sys
sys.path[:] = [os.environ["VIDROUTE_TARGET"]] + [p for p in sys.path if p] + [
    os.environ["VIDROUTE_SITE"]
]
_SITE = os.environ["VIDROUTE_SITE"] + os.sep
with open(os.environ["VIDROUTE_ALLOWED"]) as _fh:
    _ALLOWED = frozenset(json.load(_fh))

class _DeclaredOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        origin = spec.origin if spec is not None else None
        if origin and origin.startswith(_SITE) and origin not in _ALLOWED:
            raise ModuleNotFoundError(f"{name} is not declared ({origin})", name=name)
        return spec

sys.meta_path.insert(0, _DeclaredOnly())

def _report():
    files = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}
    with open(os.environ["VIDROUTE_MODULES_OUT"], "w") as fh:
        json.dump({n: f for n, f in files.items() if f}, fh)

atexit.register(_report)
if len(sys.argv) > 2:
    from importlib import metadata
    dist = metadata.distribution(sys.argv[1])
    [ep] = [e for e in dist.entry_points if e.name == sys.argv[2]]
    sys.argv = sys.argv[2:]
    raise SystemExit(ep.load()())
exec(sys.argv[1])
"""


def pip_install(target: Path, *args: str, timeout: float = 120) -> Path:
    """`pip install --target TARGET ARGS...` with this interpreter's pip, quietly."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
            str(target),
            *args,
        ],
        check=True,
        timeout=timeout,
    )
    return target


def install(wheels: Iterable[Path], target: Path) -> Path:
    """Exactly these wheels (`--no-deps`), nothing fetched (`--no-index`)."""
    return pip_install(target, "--no-deps", "--no-index", *map(str, wheels))


def installed_distributions(target: Path) -> list[metadata.Distribution]:
    return [metadata.PathDistribution(p) for p in sorted(target.glob("*.dist-info"))]


def declared_closure(requirements: Iterable[str]) -> set[str]:
    """Every distribution the requirements pull in, extras followed, by canonical name."""
    seen: set[tuple[str, str]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        for extra in ("", *sorted(req.extras)):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            try:
                requires = metadata.distribution(name).requires or []
            except metadata.PackageNotFoundError:
                continue  # one of the wheels under test: its own requirements are listed
            for child in map(Requirement, requires):
                if child.marker is None or child.marker.evaluate({"extra": extra}):
                    child.marker = None
                    todo.append(child)
    return {name for name, _ in seen}


def allowed_files(target: Path) -> list[str]:
    """The site-packages files of the distributions the wheels in `target` declare."""
    dists = installed_distributions(target)
    ours = {canonicalize_name(d.metadata["Name"]) for d in dists}
    declared = declared_closure(r for d in dists for r in d.requires or ()) - ours
    files: list[str] = []
    for name in sorted(declared):
        dist = metadata.distribution(name)
        files.extend(os.path.normpath(str(dist.locate_file(f))) for f in dist.files or ())
    return files


class Isolated:
    """One entry point of a distribution installed in `target`, as its own process."""

    def __init__(self, target: Path, workdir: Path, dist: str, script: str, *args: str) -> None:
        self.target, self.script = target, script
        self.modules_out = workdir / f"{script}.modules.json"
        self.log_path = workdir / f"{script}.log"
        allowed = workdir / f"{target.name}.allowed.json"
        if not allowed.exists():
            allowed.write_text(json.dumps(allowed_files(target)))
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
            "VIDROUTE_TARGET": str(target),
            "VIDROUTE_SITE": SITE,
            "VIDROUTE_ALLOWED": str(allowed),
            "VIDROUTE_MODULES_OUT": str(self.modules_out),
            "PYTHONUNBUFFERED": "1",
        }
        self.argv = [sys.executable, "-S", "-c", BOOT, dist, script, *args]
        self.workdir = workdir

    def code(self, source: str) -> subprocess.CompletedProcess[str]:
        """Run Python `source` (not an entry point) on the same isolated path."""
        return subprocess.run(
            [sys.executable, "-S", "-c", BOOT, source],
            check=False,  # the caller reads the refusal from stderr
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def run(self, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv,
            check=False,  # the caller asserts the exit code with the output at hand
            cwd=self.workdir,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def start(self, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        with self.log_path.open("wb") as log:
            return subprocess.Popen(
                self.argv,
                cwd=self.workdir,
                env={**self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def loaded_modules(self) -> dict[str, str]:
        """Module name -> file of everything the process had imported when it exited."""
        modules: dict[str, str] = json.loads(self.modules_out.read_text())
        return modules

    def wait_for_port(self, proc: subprocess.Popen[bytes], port_file: Path) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip():
                return int(port_file.read_text())
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"{self.script} did not become ready:\n{self.log()}")

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        """SIGTERM, as the kubelet sends; SIGKILL if it does not exit in 20 s."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        return int(proc.returncode)
