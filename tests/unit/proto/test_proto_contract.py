"""The proto contract is lint-clean and the committed generated code is fresh."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BUF = ROOT / "node_modules" / ".bin" / "buf"


def _diff(left: Path, right: Path) -> list[str]:
    cmp = filecmp.dircmp(left, right, ignore=["__pycache__"])
    out = [f"only in {left}: {n}" for n in cmp.left_only]
    out += [f"only in {right}: {n}" for n in cmp.right_only]
    out += [f"differs: {left / n}" for n in cmp.diff_files]
    for sub in cmp.common_dirs:
        out += _diff(left / sub, right / sub)
    return out


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    """Regenerating vidroute/ from proto/ with scripts/gen_proto.py changes nothing."""
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    assert _diff(ROOT / "vidroute", tmp_path / "vidroute") == []


def _buf() -> str:
    found = str(BUF) if BUF.exists() else shutil.which("buf")
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("buf is not installed (make test runs npm ci)", pytrace=False)
        pytest.skip("buf is not installed; run `npm ci`")
    return found


def test_buf_lint_is_clean() -> None:
    """`buf lint` (STANDARD + COMMENTS) reports nothing on proto/."""
    result = subprocess.run([_buf(), "lint"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_breaking_is_configured_and_passes_against_itself(tmp_path: Path) -> None:
    """buf.yaml configures FILE breaking rules, and the contract is compatible with itself."""
    assert "FILE" in (ROOT / "buf.yaml").read_text()
    image = tmp_path / "image.binpb"
    subprocess.run([_buf(), "build", "-o", str(image)], cwd=ROOT, check=True)
    result = subprocess.run(
        [_buf(), "breaking", "--against", str(image)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_breaking_detects_a_removed_field(tmp_path: Path) -> None:
    """Deleting a field from a copy of the contract is reported as a breaking change."""
    image = tmp_path / "image.binpb"
    subprocess.run([_buf(), "build", "-o", str(image)], cwd=ROOT, check=True)
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "proto", copy / "proto")
    shutil.copy(ROOT / "buf.yaml", copy / "buf.yaml")
    money = copy / "proto" / "vidroute" / "common" / "v1" / "money.proto"
    money.write_text(money.read_text().replace("  string currency_code = 2;\n", ""))
    result = subprocess.run(
        [_buf(), "breaking", "--against", str(image)],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "currency_code" in result.stdout + result.stderr
