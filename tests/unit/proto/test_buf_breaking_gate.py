"""CI gates lint before it tests, and its `buf breaking` step fails on a broken contract
(issue 25: "buf breaking against the previous main", checked from a clean clone's history).

scripts/buf_breaking.sh runs on a throwaway git repository with a two-commit proto history, so
each test shows the gate failing or passing on a change made for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import require_server

ROOT = Path(__file__).resolve().parents[3]
BUF = ROOT / "node_modules" / ".bin" / "buf"

V1 = """syntax = "proto3";

package demo.v1;

// A thing.
message Thing {
  // Its name.
  string name = 1;
  // Its size.
  int64 size = 2;
}
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with the gate script, buf.yaml and two commits of proto/demo/v1."""
    if not BUF.exists() or shutil.which("git") is None:
        require_server("needs node_modules' buf (make node_modules/.installed) and git")
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "buf_breaking.sh", tmp_path / "scripts")
    shutil.copy(ROOT / "buf.yaml", tmp_path)
    proto = tmp_path / "proto" / "demo" / "v1"
    proto.mkdir(parents=True)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.invalid")
    _git(tmp_path, "config", "user.name", "t")
    (proto / "thing.proto").write_text(V1)
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "v1")
    (proto / "thing.proto").write_text(
        V1.replace("}\n", "  // Its colour.\n  string colour = 3;\n}\n")
    )
    _git(tmp_path, "commit", "-q", "-am", "add colour")
    return tmp_path


def _gate(repo: Path, depth: str = "10") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BUF": str(BUF), "BUF_BREAKING_DEPTH": depth}
    return subprocess.run(
        ["bash", "scripts/buf_breaking.sh"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_compatible_history_passes(repo: Path) -> None:
    """Adding a field is compatible with both earlier contracts: exit 0, both checked."""
    done = _gate(repo)
    assert done.returncode == 0, done.stderr
    assert "compatible with 2 earlier contract(s)" in done.stdout


def test_a_changed_field_type_fails_and_names_the_field(repo: Path) -> None:
    """A field whose type changes in the working tree fails the gate with buf's line, the
    commit it breaks and the fix."""
    thing = repo / "proto" / "demo" / "v1" / "thing.proto"
    thing.write_text(thing.read_text().replace("int64 size = 2", "string size = 2"))
    done = _gate(repo)
    assert done.returncode == 1
    assert 'Field "2" with name "size" on message "Thing" changed type' in done.stderr
    assert "breaks the contract of" in done.stderr
    assert "package version (vidroute.<area>.v2)" in done.stderr


def test_a_break_committed_before_the_last_commit_still_fails(repo: Path) -> None:
    """A removal committed one commit before HEAD fails against the commit before it, which
    HEAD~1 alone would not see."""
    thing = repo / "proto" / "demo" / "v1" / "thing.proto"
    thing.write_text(thing.read_text().replace("  // Its colour.\n  string colour = 3;\n", ""))
    _git(repo, "commit", "-q", "-am", "drop colour")
    (repo / "README").write_text("a later commit that does not touch proto/\n")
    _git(repo, "add", "README")
    _git(repo, "commit", "-q", "-m", "docs")
    done = _gate(repo)
    assert done.returncode == 1
    assert 'Previously present field "3" with name "colour"' in done.stderr
    assert "add colour" in done.stderr


def test_a_shallow_clone_is_refused_not_passed(
    repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A shallow clone cannot see the earlier contracts, so the gate exits 2 saying how to fix
    it rather than passing unchecked."""
    shallow = tmp_path_factory.mktemp("shallow") / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)],
        check=True,
        capture_output=True,
    )
    done = _gate(shallow)
    assert done.returncode == 2
    assert "git fetch --unshallow" in done.stderr


def test_ci_runs_lint_then_the_readme_test_command() -> None:
    """.ci/run runs `make lint` before `make test`, so a gate failure stops CI first."""
    commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip().startswith("make ")
    ]
    assert commands == ["make lint", "make test"]


def test_make_lint_runs_every_gate() -> None:
    """`make lint` runs ruff check and format, mypy on the packages and on the tests, the
    ignore check, buf lint and the history-based buf breaking."""
    if shutil.which("make") is None:
        require_server("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    recipe = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "lint"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for step in (
        ".venv/bin/ruff check .",
        ".venv/bin/ruff format --check .",
        ".venv/bin/mypy ||",
        ".venv/bin/mypy --explicit-package-bases tests",
        "scripts/check_type_ignores.py",
        "buf lint",
        "bash scripts/buf_breaking.sh",
    ):
        assert step in recipe, step
