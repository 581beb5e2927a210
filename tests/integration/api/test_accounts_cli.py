"""`vidroute accounts get | publish | rollback | history | usage` against a running
AccountService (SQLite): what each prints, a bad file as one line per violation (exit 2,
nothing published); and `vidroute up`'s publication of the shipped example accounts, once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from clients import cli
from clients.devstack import publish_example_accounts
from controlplane.api.account_servicer import AccountServicer
from controlplane.domain.accounts import parse_accounts_document
from controlplane.persistence.database import Database
from controlplane.scheduling.account_usage import AccountUsage
from controlplane.service.accounts import AccountBook, AccountConfigService
from tests.integration.api.admin_cli import admin_server, run

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def backend() -> str:
    return "sqlite"


async def _usage() -> Sequence[AccountUsage]:
    return (
        AccountUsage("runway", "prod-us", "account", 3, 3, True),
        AccountUsage("runway", "prod-us", "model:gen4.5", 2, -1, False),
    )


@pytest.fixture
async def target(db: Database, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    service = AccountConfigService(db, AccountBook(db), usage=_usage)
    async with admin_server(db, monkeypatch, accounts=AccountServicer(service)) as address:
        yield address


def accounts_file(tmp_path: Path, version: str, total: int = 3) -> str:
    path = tmp_path / f"{version}.yaml"
    body = {
        "version": version,
        "accounts": {
            "runway": {"prod-us": {"credential_ref": "env:K", "limits": {"max_concurrency": total}}}
        },
    }
    path.write_text(json.dumps(body))
    return str(path)


async def test_get_publish_rollback_history_and_usage(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The built-in document first; publish twice (the first line says what happened); history
    marks the active one; rollback goes back one; usage is a table of limit and use per
    dimension (* set by the document)."""
    t = ("--target", target)
    code, out, _ = await run(capsys, "accounts", "get", *t)
    assert (code, out.splitlines()[0]) == (0, "# accounts-builtin (active; built in)")
    code, out, _ = await run(capsys, "accounts", "history", *t)
    assert out == "no accounts document published (the built-in one is in use)\n"
    code, out, err = await run(capsys, "accounts", "publish", accounts_file(tmp_path, "a1"), *t)
    assert (code, out.splitlines()[0], err) == (0, "a1: published and active", "")
    await run(capsys, "accounts", "publish", accounts_file(tmp_path, "a2", 5), *t)
    code, out, _ = await run(capsys, "accounts", "history", *t)
    lines = out.splitlines()
    assert [(line[0], line[2:].split()[0]) for line in lines[:2]] == [("*", "a2"), (" ", "a1")]
    assert lines[-1].endswith("published a2 (replacing a1)"), out
    assert await run(capsys, "accounts", "rollback", *t) == (0, "a1: active\n", "")
    code, out, _ = await run(capsys, "accounts", "get", *t)
    assert out.splitlines()[0] == "# a1 (active; a1.yaml)"
    code, out, _ = await run(capsys, "accounts", "usage", *t)
    rows = [line.split() for line in out.splitlines()[2:] if line.strip()]
    assert rows == [
        ["runway", "prod-us", "account", "3", "3*"],
        ["runway", "prod-us", "model:gen4.5", "-", "2"],
    ], out
    code, out, _ = await run(capsys, "accounts", "usage", "--json", *t)
    assert json.loads(out)["dimensions"][0]["configured"] is True


async def test_a_bad_file_is_one_line_per_violation(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two problems are two error lines naming their paths, exit 2; nothing is published."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: a1\naccounts: {runway: {prod-us: {credential_ref: secret, limits:"
        " {max_concurrency: 0}}}}\n"
    )
    code, out, err = await run(capsys, "accounts", "publish", str(bad), "--target", target)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    where = "error: accounts.runway.prod-us"
    assert any(line.startswith(f"{where}.credential_ref: ") for line in lines), err
    assert any(line.startswith(f"{where}.limits.max_concurrency: ") for line in lines), err
    code, out, _ = await run(capsys, "accounts", "history", "--target", target)
    assert "no accounts document published" in out


async def test_vidroute_up_publishes_the_example_accounts_once(
    db: Database, database_url: str
) -> None:
    """`vidroute up` publishes the shipped example (a total on Runway's prod-us) on a database
    without accounts documents, never over an operator's."""
    text = (Path(cli.__file__).parents[1] / "controlplane" / "accounts.example.yaml").read_text()
    example = parse_accounts_document(text)
    assert example.limits("runway", "prod-us").max_concurrency == 3
    assert await publish_example_accounts(database_url) == example.version
    assert await publish_example_accounts(database_url) is None
    history = await AccountConfigService(db, AccountBook(db)).history()
    assert [(a.version, a.actor) for a in history.activations] == [(example.version, "vidroute up")]
