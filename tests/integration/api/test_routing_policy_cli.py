"""`vidroute routing publish | rollback | policies | canaries` against a running RoutingService
(SQLite): what each prints, a bad file as one line per violation (exit 2, nothing published)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.api.routing_servicer import RoutingServicer
from controlplane.persistence.database import Database
from controlplane.service.routing_policies import RoutingPolicyService
from tests.integration.api.admin_cli import admin_server, run

pytestmark = pytest.mark.timeout(120)
WEIGHTS = {
    "quality": 0.28,
    "success": 0.22,
    "latency": 0.18,
    "cost": 0.14,
    "capacity": 0.10,
    "region": 0.04,
    "preference": 0.04,
}
CANARY = "runway/gen4.5/prod-us"


@pytest.fixture
def backend() -> str:
    return "sqlite"


@pytest.fixture
async def target(db: Database, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    async with admin_server(
        db, monkeypatch, routing=RoutingServicer(policies=RoutingPolicyService(db))
    ) as address:
        yield address


def policy_file(tmp_path: Path, version: str, **extra: object) -> str:
    path = tmp_path / f"{version}.yaml"
    path.write_text(json.dumps({"version": version, "weights": {"default": WEIGHTS}, **extra}))
    return str(path)


async def test_publish_list_rollback_and_canaries(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Publish twice, list (active marked), roll back to the first, list the canary."""
    t = ("--target", target)
    first = policy_file(tmp_path, "v1", canaries={CANARY: {"stages": [1, 5]}})
    code, out, _ = await run(capsys, "routing", "publish", first, *t)
    assert (code, out.splitlines()[0]) == (0, "v1: published and active")
    assert "  version: (absent) -> v1" in out.splitlines()
    dry = await run(capsys, "routing", "publish", policy_file(tmp_path, "v2"), "--dry-run", *t)
    assert dry[:2] == (
        0,
        "v2: valid, not published (dry run)\n"
        '  canaries: {"runway/gen4.5/prod-us": {"stages": [1, 5]}} -> (absent)\n'
        "  version: v1 -> v2\n",
    )
    await run(capsys, "routing", "publish", policy_file(tmp_path, "v2"), *t)
    code, out, _ = await run(capsys, "routing", "policies", *t)
    assert code == 0
    rows = [(line[0], line[2:].split()[0]) for line in out.splitlines()]
    assert rows == [("*", "v2"), (" ", "v1")]
    assert "v2.yaml" in out.splitlines()[0]
    assert await run(capsys, "routing", "rollback", *t) == (0, "v1: active\n", "")
    again = await run(capsys, "routing", "publish", policy_file(tmp_path, "v2"), *t)
    assert again[1].splitlines()[0] == (
        "v2: already published, not active (vidroute routing rollback v2)"
    )
    code, out, _ = await run(capsys, "routing", "policies", "--json", *t)
    active = [p["version"] for p in json.loads(out)["policies"] if p.get("active")]
    assert active == ["v1"]
    code, out, _ = await run(capsys, "routing", "canaries", *t)
    row = next(line for line in out.splitlines() if line.startswith(CANARY))
    assert row.split()[1:5] == ["1%", "1%", "->", "5%"], out
    assert "ACTIVE" in row, out
    assert f"{CANARY}  " in out
    assert "STARTED  0% -> 1%  published" in out


async def test_a_bad_file_is_one_line_per_violation(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two problems are two error lines naming their paths, exit 2; nothing is published."""
    bad = policy_file(tmp_path, "v1", hysteresis_delta=4, min_dwell_s=-1)
    code, out, err = await run(capsys, "routing", "publish", bad, "--target", target)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert any(line.startswith("error: hysteresis_delta: ") for line in lines), err
    assert any(line.startswith("error: min_dwell_s: ") for line in lines), err
    code, out, _ = await run(capsys, "routing", "policies", "--target", target)
    assert "no routing policy published" in out


async def test_staged_activate_and_history(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A staged policy is not active until `routing activate`; `routing history` lists each
    activation with who, what it replaced and the reason."""
    t = ("--target", target)
    await run(capsys, "routing", "publish", policy_file(tmp_path, "v1"), *t)
    _, out, _ = await run(capsys, "routing", "publish", policy_file(tmp_path, "v2"), "--staged", *t)
    assert out.splitlines() == [
        "v2: published, staged (vidroute routing activate v2)",
        "  version: v1 -> v2",
    ]
    assert await run(capsys, "routing", "activate", "v2", "--reason", "go", *t) == (
        0,
        "v2: active\n",
        "",
    )
    _code, out, _ = await run(capsys, "routing", "history", *t)
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert lines[0].endswith("published v1")
    assert lines[1].endswith("activated v2 (replacing v1)  -- go")
