"""The ``vidroute_contract`` pytest plugin: installed as an entry point, inert without
``--vidroute-adapter``, a clear usage error when its options are incomplete.

Each test runs pytest as a subprocess in an empty directory (no conftest, no project config),
the way an adapter author's project loads the installed plugin.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def test_the_plugin_is_a_pytest11_entry_point() -> None:
    """The installed distribution declares ``vidroute_contract`` in the pytest11 group."""
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert found.get("vidroute_contract") == "adapter_sidecars.contract.plugin"


def test_without_vidroute_adapter_the_plugin_adds_no_tests_or_fixtures(tmp_path: Path) -> None:
    """In a project with one plain test, the plugin collects nothing more and no fixture of it
    exists (a test asking for ``adapter`` errors), while its options are listed in --help."""
    (tmp_path / "test_plain.py").write_text(
        "def test_plain():\n    pass\n\n\ndef test_wants_adapter(adapter):\n    pass\n",
        encoding="utf-8",
    )
    run = _pytest(tmp_path, "-q", "-rA")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 passed, 1 error" in run.stdout, run.stdout
    assert "fixture 'adapter' not found" in run.stdout, run.stdout
    helptext = _pytest(tmp_path, "--help").stdout
    for option in ("--vidroute-adapter", "--vidroute-emulator", "--vidroute-profile"):
        assert option in helptext


def test_incomplete_options_are_a_usage_error(tmp_path: Path) -> None:
    """``--vidroute-adapter`` without an emulator and profile exits 4 naming what is missing."""
    run = _pytest(tmp_path, "--vidroute-adapter", "127.0.0.1:1", "-q")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "needs --vidroute-adapter HOST:PORT, --vidroute-emulator URL" in run.stderr


def test_an_unreachable_emulator_stops_the_run_with_one_line(tmp_path: Path) -> None:
    """With nothing listening, the suite runs no test: it exits 4 naming the emulator URL."""
    run = _pytest(
        tmp_path,
        "--vidroute-adapter",
        "127.0.0.1:1",
        "--vidroute-emulator",
        "http://127.0.0.1:1",
        "--vidroute-profile",
        "runway",
        "--vidroute-ready-timeout",
        "0.5",
        "-q",
    )
    assert run.returncode == 4, run.stdout + run.stderr
    assert "passed" not in run.stdout, run.stdout
    assert "failed" not in run.stdout, run.stdout
    assert "emulator http://127.0.0.1:1 not reachable after 0.5 s" in run.stdout, run.stdout
