"""`vidroute tenants get | publish | rollback | history` against a running TenantService
(SQLite): what each prints, a bad file as one line per violation (exit 2, nothing published);
and `vidroute up`'s publication of the shipped example tenants, once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clients import cli
from clients.devstack import publish_example_tenants
from controlplane.api.tenant_servicer import TenantServicer
from controlplane.domain.tenants import parse_tenants_document
from controlplane.persistence.database import Database
from controlplane.service.tenants import TenantBook, TenantConfigService
from tests.integration.api.admin_cli import admin_server, run
from vidroute_core.spec import ServiceClass

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def backend() -> str:
    return "sqlite"


@pytest.fixture
async def target(db: Database, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    async with admin_server(
        db, monkeypatch, tenants=TenantServicer(TenantConfigService(db, TenantBook(db)))
    ) as address:
        yield address


def tenants_file(tmp_path: Path, version: str, **tenants: object) -> str:
    path = tmp_path / f"{version}.yaml"
    body = {"version": version, "default": {"service_classes": {"STANDARD": {}}}}
    path.write_text(json.dumps({**body, "tenants": tenants}))
    return str(path)


async def test_get_publish_rollback_and_history(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The built-in document first; publish twice; history marks the active version and lists
    each activation; rollback goes back one; get prints the active document as published."""
    t = ("--target", target)
    code, out, _ = await run(capsys, "tenants", "get", *t)
    assert (code, out.splitlines()[0]) == (0, "# tenants-builtin (active; built in)")
    code, out, _ = await run(capsys, "tenants", "history", *t)
    assert out == "no tenants document published (the built-in one is in use)\n"
    code, out, _ = await run(capsys, "tenants", "publish", tenants_file(tmp_path, "t1"), *t)
    assert (code, out.splitlines()[0]) == (0, "t1: published and active")
    dry = await run(capsys, "tenants", "publish", tenants_file(tmp_path, "t2"), "--dry-run", *t)
    assert dry[:2] == (0, "t2: valid, not published (dry run)\n  version: t1 -> t2\n")
    await run(capsys, "tenants", "publish", tenants_file(tmp_path, "t2", acme={}), *t)
    code, out, _ = await run(capsys, "tenants", "history", *t)
    lines = out.splitlines()
    assert [(line[0], line[2:].split()[0]) for line in lines[:2]] == [("*", "t2"), (" ", "t1")]
    assert lines[-1].endswith("published t2 (replacing t1)"), out
    assert await run(capsys, "tenants", "rollback", *t) == (0, "t1: active\n", "")
    code, out, _ = await run(capsys, "tenants", "get", *t)
    assert out.splitlines()[0] == "# t1 (active; t1.yaml)"
    assert json.loads(out.split("\n", 1)[1])["version"] == "t1"
    code, out, _ = await run(capsys, "tenants", "history", "--json", *t)
    actions = [a["action"] for a in json.loads(out)["activations"]]
    assert actions[-1] == "TENANT_CONFIG_ACTION_ROLLED_BACK"


async def test_a_bad_file_is_one_line_per_violation(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two problems are two error lines naming their paths, exit 2; nothing is published."""
    bad = tenants_file(
        tmp_path, "t1", acme={"service_classes": {"GOLD": {}}, "create_rate": {"burst": 0}}
    )
    code, out, err = await run(capsys, "tenants", "publish", bad, "--target", target)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert any(line.startswith("error: tenants.acme.service_classes.GOLD: ") for line in lines)
    assert any(line.startswith("error: tenants.acme.create_rate.burst: ") for line in lines)
    code, out, _ = await run(capsys, "tenants", "history", "--target", target)
    assert "no tenants document published" in out


async def test_vidroute_up_publishes_the_example_tenants_once(
    db: Database, database_url: str
) -> None:
    """The shipped example has a STANDARD-only acme and an INTERACTIVE studio with other
    weights; `vidroute up` publishes it on a database without tenants documents, never over
    an operator's."""
    text = (Path(cli.__file__).parents[1] / "controlplane" / "tenants.example.yaml").read_text()
    example = parse_tenants_document(text)
    assert ServiceClass.INTERACTIVE not in example.entry("acme").entitled
    assert ServiceClass.INTERACTIVE in example.entry("studio").entitled
    assert example.weight("studio", "STANDARD") != example.weight("acme", "STANDARD")
    assert await publish_example_tenants(database_url) == example.version
    assert await publish_example_tenants(database_url) is None
    history = await TenantConfigService(db, TenantBook(db)).history()
    assert [(a.version, a.actor) for a in history.activations] == [(example.version, "vidroute up")]


async def test_diff_staged_scheduled_activate_and_reasons(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """publish prints the per-path diff; --staged publishes inactive until `activate`; --at
    schedules (history shows it pending, with its time); --reason is recorded and shown."""
    t = ("--target", target)
    one = {"service_classes": {"STANDARD": {"weight": 2}}}
    five = {"service_classes": {"STANDARD": {"weight": 5}}}
    await run(capsys, "tenants", "publish", tenants_file(tmp_path, "t1", acme=one), *t)
    code, out, _ = await run(
        capsys, "tenants", "publish", tenants_file(tmp_path, "t2", acme=five), "--staged", *t
    )
    assert (code, out.splitlines()) == (
        0,
        [
            "t2: published, staged (vidroute tenants activate t2)",
            "  tenants.acme.service_classes.STANDARD.weight: 2 -> 5",
            "  version: t1 -> t2",
        ],
    )
    assert (await run(capsys, "tenants", "get", *t))[1].startswith("# t1 (active")
    activated = await run(capsys, "tenants", "activate", "t2", "--reason", "weights", *t)
    assert activated == (0, "t2: active\n", "")
    code, out, _ = await run(
        capsys, "tenants", "publish", tenants_file(tmp_path, "t3"), "--at", "+1h", *t
    )
    assert code == 0
    assert out.splitlines()[0].startswith("t3: published, active at "), out
    assert (await run(capsys, "tenants", "rollback", "--reason", "oops", *t))[1] == "t1: active\n"
    code, out, _ = await run(capsys, "tenants", "history", *t)
    tail = out.splitlines()[-3:]
    assert tail[0].endswith("activated t2 (replacing t1)  -- weights"), out
    assert "PENDING: t3 to be active at this time  [asked " in tail[1], out
    assert tail[2].endswith("rolled back t1 (replacing t2)  -- oops"), out
    code, out, _ = await run(capsys, "tenants", "history", "--json", *t)
    pending = [a for a in json.loads(out)["activations"] if a.get("pending")]
    assert [(a["version"], a["action"]) for a in pending] == [
        ("t3", "TENANT_CONFIG_ACTION_SCHEDULED")
    ]


async def test_a_bad_activation_time_is_refused_before_the_call(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--at without a time zone is a usage error naming it (exit 2); nothing is published."""
    path = tenants_file(tmp_path, "t1")
    code, out, err = await run(
        capsys, "tenants", "publish", path, "--at", "2030-01-01T10:00", "--target", target
    )
    assert (code, out) == (2, "")
    assert "has no time zone" in err
    assert (
        "no tenants document published"
        in (await run(capsys, "tenants", "history", "--target", target))[1]
    )
