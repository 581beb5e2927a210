"""The adapter author's README recipe, run literally on a fresh checkout, passes.

A `git clone` of the repository's committed HEAD stands for the author's checkout (with this
repository's ``.venv`` linked in, and ``PYTHONPATH`` on the clone so its code is what runs).
The first ``sh`` block of README's "For adapter authors" section is run as one bash script
(``bash -e``, the ``&`` processes in the script's own process group, killed afterwards) with
exactly one substitution, the one the recipe documents: its live variables line is replaced
by the chosen adapter's line with free ports (`tests.support.author_recipe.for_adapter`), so
a busy port on this machine cannot fail it. Both runs in the block, the pytest plugin form and
``vidroute-contract``, must report passes and no failure or error.

``make test`` runs the recipe for Runway; ``VIDROUTE_RECIPE_ADAPTERS=all`` (or a comma list:
``runway,veo``) runs it for each named adapter.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.author_recipe import for_adapter, recipe_block, recipe_variables

ROOT = Path(__file__).resolve().parents[2]
ALL_ADAPTERS = ("runway", "veo", "selfhosted")
RUN_DEADLINE_S = 300.0
_SUMMARY = re.compile(r"^=+ (?P<body>.*\b(?:passed|failed|error|errors|deselected)\b.*) =+$", re.M)

pytestmark = pytest.mark.e2e


def _selected() -> list[str]:
    raw = os.environ.get("VIDROUTE_RECIPE_ADAPTERS", "").strip()
    if not raw:
        return ["runway"]
    if raw == "all":
        return list(ALL_ADAPTERS)
    return [name.strip() for name in raw.split(",") if name.strip()]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of HEAD with this repository's virtualenv linked in as ``.venv``."""
    dest = tmp_path_factory.mktemp("author") / "vidroute"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (dest / ".venv").symlink_to(ROOT / ".venv")
    return dest


def _clean_env(checkout: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VIDROUTE_"))}
    env["PYTHONPATH"] = str(checkout)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(script: Path, checkout: Path, log: Path) -> int:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", str(script)],
            cwd=checkout,
            env=_clean_env(checkout),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=RUN_DEADLINE_S)
        except subprocess.TimeoutExpired:
            return -1
        finally:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the script's process group (its ``&`` children too), SIGKILL what remains."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue


def test_the_recipe_is_substituted_only_in_its_variables_line() -> None:
    """The only line the test changes is the variables line; every command stays literal."""
    block = recipe_block((ROOT / "README.md").read_text(encoding="utf-8"))
    script = for_adapter(block, "veo", {"emulator_port": 1, "adapter_port": 2})
    changed = [
        (a, b) for a, b in zip(block.splitlines(), script.splitlines(), strict=True) if a != b
    ]
    assert changed == [
        (
            next(line for line in block.splitlines() if line.startswith("adapter=")),
            "adapter=veo emulator_port=1 adapter_port=2 emulator_flags=''",
        )
    ]


@pytest.mark.timeout(RUN_DEADLINE_S + 60)
@pytest.mark.parametrize("adapter", _selected())
def test_readme_recipe_passes_on_a_fresh_checkout(
    checkout: Path, adapter: str, tmp_path: Path
) -> None:
    """The README's adapter-author block, run as typed on a clone of HEAD, exits 0 with every
    contract test passed: the plugin form runs the whole suite, the command its Describe tests."""
    block = recipe_block((checkout / "README.md").read_text(encoding="utf-8"))
    assert adapter in recipe_variables(block), f"the recipe has no variables for {adapter}"
    ports = {"emulator_port": _free_port(), "adapter_port": _free_port()}
    script = tmp_path / "recipe.sh"
    script.write_text(for_adapter(block, adapter, ports), encoding="utf-8")
    log = tmp_path / "recipe.log"
    status = _run(script, checkout, log)
    output = log.read_text(encoding="utf-8", errors="replace")
    tail = "\n".join(output.splitlines()[-60:])
    assert status == 0, f"recipe exited {status}:\n{tail}"
    summaries = [m.group("body") for m in _SUMMARY.finditer(output)]
    runs = [s for s in summaries if " in " in s and re.search(r"\d+ passed", s)]
    assert len(runs) == 2, f"expected the plugin run and the command run, got {summaries}"
    for summary in runs:
        assert not re.search(r"\d+ (failed|error|errors)\b", summary), summary
    plugin_passed = int(re.search(r"(\d+) passed", runs[0]).group(1))  # type: ignore[union-attr]  # a None match fails the test with AttributeError, as wanted
    assert plugin_passed >= 40, f"the plugin run passed only {plugin_passed}: {runs[0]}"
