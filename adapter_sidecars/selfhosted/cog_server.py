"""Start a local Cog model server (coglet, PyPI ``cog``) running a predictor with this Python.

``python -m cog.server.http`` spawns the predictor in a worker subprocess with the ``python``
found on PATH (provider-apis.md §3.5), so the interpreter's own ``bin`` goes first on PATH:
otherwise the worker fails with ``No module named 'coglet'`` and the server stays STARTING.
``WEBHOOK_AUTH_TOKEN`` makes coglet send ``Authorization: Bearer <token>`` with every webhook,
which the sidecar's receiver checks. The server logs JSON lines on stdout, among them one
``"Starting prediction"`` per GPU run with its ``prediction_id``: `prediction_runs` counts
them (the tests' proof that no prediction ran twice).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DEFAULT_PREDICTOR", "cog_server_command", "prediction_runs"]

#: The repository's stand-in video model (models/cog_video).
DEFAULT_PREDICTOR = Path(__file__).resolve().parents[2] / "models" / "cog_video" / "predict.py"


def cog_server_command(
    port: int,
    *,
    predictor: Path = DEFAULT_PREDICTOR,
    webhook_token: str = "",
    host: str = "127.0.0.1",
    environ: Mapping[str, str] | None = None,
    max_concurrency: int = 1,
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a Cog server for `predictor` (``file.py``, class ``Predictor``);
    `max_concurrency` predictions at once (COG_MAX_CONCURRENCY; the predictor is async)."""
    env = dict(os.environ if environ is None else environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in (bindir, env.get("PATH", "")) if p)
    env["PORT"] = str(port)
    env["COG_PREDICT_TYPE_STUB"] = f"{predictor}:Predictor"  # relative to the server's cwd
    env.pop("WEBHOOK_AUTH_TOKEN", None)
    env.pop("COG_MAX_CONCURRENCY", None)
    if max_concurrency > 1:
        env["COG_MAX_CONCURRENCY"] = str(max_concurrency)
    if webhook_token:
        env["WEBHOOK_AUTH_TOKEN"] = webhook_token
    argv = [sys.executable, "-m", "cog.server.http", "--host", host]
    return argv, env


def start_cog_server(
    port: int,
    log_path: Path,
    *,
    predictor: Path = DEFAULT_PREDICTOR,
    webhook_token: str = "",
    max_concurrency: int = 1,
) -> subprocess.Popen[bytes]:
    """Start the server in `predictor`'s directory."""
    argv, env = cog_server_command(
        port,
        predictor=predictor.resolve(),
        webhook_token=webhook_token,
        max_concurrency=max_concurrency,
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            argv,
            cwd=predictor.parent,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def prediction_runs(log_text: str) -> dict[str, int]:
    """How many times the server started each prediction id (its own log's word)."""
    runs: dict[str, int] = {}
    for line in log_text.splitlines():
        if "Starting prediction" not in line:
            continue
        try:
            fields = json.loads(line).get("fields", {})
        except ValueError:
            continue
        if fields.get("message") == "Starting prediction" and fields.get("prediction_id"):
            pid = str(fields["prediction_id"])
            runs[pid] = runs.get(pid, 0) + 1
    return runs
