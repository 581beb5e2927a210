"""The programs as processes refuse a misspelled ``VIDROUTE_*`` name or a bad value at start:
one line on stderr naming it, exit status 78 (the control plane; a sidecar: 2), nothing written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIDECAR_CONFIG = ROOT / "adapter_sidecars/runway/config.example.yaml"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _run(workdir: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """`python <args>` in `workdir` with only `env` of the VIDROUTE_ variables."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("VIDROUTE_")}
    return subprocess.run(
        [sys.executable, *args],
        cwd=workdir,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_serve_with_a_misspelled_name_exits_with_one_line_naming_it(tmp_path: Path) -> None:
    """`vidroute serve` with VIDROUTE_DATABSE_URL (a typo) says so and the fix in one line,
    exits 78 and creates no database: before, it served SQLite under ./var."""
    done = _run(
        tmp_path,
        ["-m", "clients.cli", "serve", "--listen", "127.0.0.1:0"],
        VIDROUTE_DATABSE_URL="postgresql+asyncpg://postgres@127.0.0.1:5432/vidroute",
        VIDROUTE_API_ONLY="1",
    )
    assert done.returncode == 78, done.stderr
    assert done.stderr.splitlines() == [
        "error: VIDROUTE_DATABSE_URL is not a vidroute setting "
        "(did you mean VIDROUTE_DATABASE_URL?)"
    ]
    assert not (tmp_path / "var").exists()


def test_serve_with_a_bad_log_level_exits_with_one_line_naming_it(tmp_path: Path) -> None:
    """`vidroute serve` with VIDROUTE_LOG_LEVEL=LOUD is refused in one line, exit 78."""
    done = _run(
        tmp_path,
        ["-m", "clients.cli", "serve", "--listen", "127.0.0.1:0"],
        VIDROUTE_LOG_LEVEL="LOUD",
        VIDROUTE_API_ONLY="1",
    )
    assert done.returncode == 78, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: VIDROUTE_LOG_LEVEL='LOUD': Input should be 'DEBUG'")


def test_up_and_migrate_refuse_a_typo_before_writing_anything(tmp_path: Path) -> None:
    """`vidroute up` and `vidroute migrate` refuse a typo the same way, `up` a bad time scale
    too; `up` writes no dev tokens."""
    for args in (["up", "--ephemeral-ports"], ["migrate"]):
        done = _run(tmp_path, ["-m", "clients.cli", *args], VIDROUTE_SHARDS="4")
        assert done.returncode == 78, done.stderr
        assert done.stderr.splitlines() == [
            "error: VIDROUTE_SHARDS is not a vidroute setting (did you mean VIDROUTE_SHARD_COUNT?)"
        ]
    done = _run(tmp_path, ["-m", "clients.cli", "up", "--ephemeral-ports"], VIDROUTE_TIME_SCALE="5")
    assert done.returncode == 78, done.stderr
    assert done.stderr.splitlines() == [
        "error: VIDROUTE_TIME_SCALE='5': Input should be less than or equal to 1"
    ]
    assert not (tmp_path / "var").exists()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"VIDROUTE_LOG_LEVEL": "LOUD"},
            "VIDROUTE_LOG_LEVEL='LOUD': "
            "Input should be 'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL'",
        ),
        (
            {"VIDROUTE_ADAPTER_BASE_URI": "http://127.0.0.1:1"},
            "VIDROUTE_ADAPTER_BASE_URI is not a vidroute setting "
            "(did you mean VIDROUTE_ADAPTER_BASE_URL?)",
        ),
    ],
)
def test_a_sidecar_refuses_a_bad_environment_in_one_line(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    """A sidecar's entry point refuses a bad value or an unknown name: one line, exit 2."""
    done = _run(tmp_path, ["-m", "adapter_sidecars.runway", "--config", str(SIDECAR_CONFIG)], **env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"vidroute-adapter-runway: configuration error: {says}"]
