"""The console's Accounts page: each account's limits against its use under the active
accounts document, for an admin; refused to a tenant."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import pytest

from controlplane.api.auth import Authenticator, hash_token, new_token, parse_entries
from controlplane.console.app import Console
from controlplane.persistence.database import Database
from controlplane.scheduling.account_usage import AccountUsage
from controlplane.service.accounts import AccountBook, AccountConfigService
from controlplane.service.console_reads import ConsoleReads
from controlplane.service.tasks import TaskService

pytestmark = pytest.mark.timeout(60)


async def _usage() -> Sequence[AccountUsage]:
    return [
        AccountUsage("runway", "prod-us", "account", 3, 3, True),
        AccountUsage("runway", "prod-us", "model:gen4.5", 2, 1, False),
    ]


async def test_the_accounts_page_shows_limits_against_use(db: Database) -> None:
    """An admin sees every dimension's use and limit, who set it, and the active version; a
    full dimension is marked; a tenant gets 403."""
    service = AccountConfigService(db, AccountBook(db), usage=_usage)
    await service.publish(
        "version: a-7\naccounts: {runway: {prod-us: {credential_ref: env:K,"
        " limits: {max_concurrency: 3}}}}\n"
    )
    admin, tenant = new_token(), new_token()
    auth = Authenticator(
        parse_entries([f"{hash_token(admin)}=admin", f"{hash_token(tenant)}=tenant:acme"])
    )
    console = Console(auth, ConsoleReads(TaskService(db), db), accounts=service)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console.app), base_url="http://console.test"
    ) as browser:
        page = await browser.get("/accounts", headers={"authorization": f"Bearer {admin}"})
        refused = await browser.get("/accounts", headers={"authorization": f"Bearer {tenant}"})
    assert page.status_code == 200, page.text
    html = page.text
    assert "accounts document a-7" in html
    assert '<tr class="limit-full"><td>runway</td><td>prod-us</td><td>account</td>' in html
    assert "<td>model:gen4.5</td>" in html
    assert "capability / default" in html
    assert refused.status_code == 403
