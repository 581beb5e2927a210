"""The web console's authentication and tenant scoping, over HTTP against the ASGI app (no
browser) on a real database: the same tokens and rules as the gRPC API."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from controlplane.api.auth import Authenticator, hash_token, new_token, parse_entries
from controlplane.console.app import Console
from controlplane.console.auth import COOKIE
from controlplane.console.csrf import COOKIE as CSRF_COOKIE
from controlplane.persistence.database import Database
from controlplane.service.billing import BillingService
from controlplane.service.console_reads import ConsoleReads
from controlplane.service.outputs import OutputService
from controlplane.service.tasks import CreateTaskInput, TaskService
from controlplane.service.tenant_limits import TenantLimitsService
from controlplane.service.tenants import TenantBook
from controlplane.storage import FilesystemObjectStore
from tests.integration.persistence.builders import make_spec
from tests.support.stack import free_port

pytestmark = pytest.mark.timeout(60)


@dataclass
class Site:
    app: Console
    tokens: dict[str, str]
    tasks: dict[str, int]  # tenant -> one of its task ids

    def client(self, who: str | None = None) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app.app),
            base_url="http://console.test",
            headers=headers,
        )


def console_for(db: Database, auth: Authenticator, objects: Path) -> Console:
    tasks = TaskService(db)
    outputs = OutputService(tasks, FilesystemObjectStore(objects))
    reads = ConsoleReads(tasks, db)
    tenants = TenantLimitsService(db, TenantBook(db))
    return Console(auth, reads, outputs=outputs, billing=BillingService(db), tenants=tenants)


async def create(db: Database, tenant: str) -> int:
    prompt = f"{tenant} prompt {secrets.token_hex(3)}"
    record, _ = await TaskService(db).create_task(
        CreateTaskInput(make_spec(tenant, prompt), f"k-{secrets.token_hex(6)}")
    )
    return record.id


@pytest.fixture
async def site(db: Database, tmp_path: Path) -> Site:
    tokens = {"alpha": new_token(), "beta": new_token(), "admin": new_token()}
    entries = parse_entries(
        [
            f"{hash_token(tokens['alpha'])}=tenant:alpha",
            f"{hash_token(tokens['beta'])}=tenant:beta",
            f"{hash_token(tokens['admin'])}=admin",
        ]
    )
    ids = {tenant: await create(db, tenant) for tenant in ("alpha", "beta")}
    return Site(console_for(db, Authenticator(entries), tmp_path), tokens, ids)


def listed_ids(html: str) -> set[int]:
    return {int(m) for m in re.findall(r'href="/tasks/(\d+)"', html)}


def csrf_field(html: str) -> str:
    """The CSRF token a page rendered into its form."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html[:300]
    return found.group(1)


async def test_a_tenant_gets_404_for_another_tenants_task_on_every_task_page(site: Site) -> None:
    """Another tenant's task is 404 on the task, its live timeline, its decisions and its output,
    while the tenant's own task page answers 200."""
    async with site.client("alpha") as alpha:
        own = await alpha.get(f"/tasks/{site.tasks['alpha']}")
        assert own.status_code == 200
        assert "alpha prompt" in own.text
        other = site.tasks["beta"]
        for path in ("", "/timeline", "/events", "/decisions", "/output/0"):
            response = await alpha.get(f"/tasks/{other}{path}")
            assert response.status_code == 404, (path, response.text[:200])
            assert "beta prompt" not in response.text
        missing = await alpha.get("/tasks/99999999")
        assert missing.status_code == 404  # worded like a task that never existed
        assert re.sub(r"\d+", "N", missing.text) == re.sub(r"\d+", "N", response.text)


async def test_a_tenant_lists_only_its_own_tasks_and_the_admin_lists_all(site: Site) -> None:
    """The task list (page and live rows) holds only the caller's tenant's tasks; asking for
    another tenant is 403; the admin sees both tenants and may filter by one."""
    async with site.client("alpha") as alpha, site.client("admin") as admin:
        for path in ("/tasks", "/tasks/rows"):
            page = await alpha.get(path)
            assert page.status_code == 200
            assert listed_ids(page.text) == {site.tasks["alpha"]}
        assert (await alpha.get("/tasks", params={"tenant": "beta"})).status_code == 403
        everything = await admin.get("/tasks")
        assert set(site.tasks.values()) <= listed_ids(everything.text)
        only_beta = await admin.get("/tasks", params={"tenant": "beta"})
        assert listed_ids(only_beta.text) == {site.tasks["beta"]}
        queued = await admin.get("/tasks/rows", params={"state": "QUEUED", "provider": "veo"})
        assert listed_ids(queued.text) == set()  # no attempt yet: on no provider
        bad = await admin.get("/tasks", params={"state": "NOPE"})
        assert bad.status_code == 400
        assert (await admin.get("/tasks", params={"since": "yesterday"})).status_code == 400


async def test_the_time_filter_keeps_the_tasks_created_in_the_window(site: Site) -> None:
    """`since` and `until` (datetime-local, UTC) bound the creation time of the listed tasks."""
    future = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    past = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    async with site.client("admin") as admin:
        window = await admin.get("/tasks", params={"since": past, "until": future})
        assert listed_ids(window.text) == set(site.tasks.values())
        assert listed_ids((await admin.get("/tasks", params={"since": future})).text) == set()
        assert listed_ids((await admin.get("/tasks/rows", params={"until": past})).text) == set()


async def test_provider_pages_need_the_admin_role(site: Site) -> None:
    """Providers, breakers, tenants and reconciliation are 403 for a tenant and 200 for the
    admin."""
    async with site.client("alpha") as alpha, site.client("admin") as admin:
        for path in (
            "/providers",
            "/breakers",
            "/tenants",
            "/reconciliation",
            "/reconciliation?date=2026-06-01",
        ):
            assert (await alpha.get(path)).status_code == 403, path
            assert (await admin.get(path)).status_code == 200, path


async def test_sign_in_sets_a_strict_httponly_cookie_and_bad_tokens_get_nothing(
    site: Site,
) -> None:
    """Without credentials a page redirects to /login; a wrong token is 401 and sets no cookie;
    the right one sets an HttpOnly SameSite=Strict cookie that then authenticates the pages;
    signing out deletes it. A wrong bearer header is 401, not a redirect."""
    async with site.client() as browser:
        first = await browser.get("/tasks/1")
        assert first.status_code == 303
        assert first.headers["location"] == "/login?next=%2Ftasks%2F1"
        csrf = csrf_field((await browser.get(first.headers["location"])).text)
        wrong = await browser.post("/login", data={"token": "vr_not-a-token", "csrf": csrf})
        assert wrong.status_code == 401
        assert "set-cookie" not in wrong.headers
        signed = await browser.post(
            "/login?next=/tasks",
            data={"token": site.tokens["beta"], "csrf": csrf},
            follow_redirects=False,
        )
        assert signed.status_code == 303
        cookie = signed.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}=")
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
        page = await browser.get("/tasks")
        assert page.status_code == 200
        assert listed_ids(page.text) == {site.tasks["beta"]}
        out = await browser.post("/logout", data={"csrf": csrf})
        assert out.status_code == 303
        assert (await browser.get("/tasks")).status_code == 303
        evil = await browser.post(
            "/login?next=//evil.example/x", data={"token": site.tokens["beta"], "csrf": csrf}
        )
        assert evil.headers["location"] == "/tasks"  # never an open redirect
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=site.app.app),
        base_url="http://console.test",
        headers={"authorization": "Bearer vr_wrong"},
    ) as tool:
        assert (await tool.get("/tasks")).status_code == 401


async def test_sign_in_and_sign_out_refuse_a_post_without_the_forms_csrf_token(
    site: Site,
) -> None:
    """A sign-in or sign-out POST without the CSRF field, with a wrong one, or without the CSRF
    cookie (what another site's form sends) is 403 and changes nothing: no session cookie is
    set, a signed-in browser stays signed in; with the form's token both work."""
    async with site.client() as browser:
        form = await browser.get("/login")
        assert form.status_code == 200
        csrf = csrf_field(form.text)
        assert browser.cookies.get(CSRF_COOKIE) == csrf  # double submit: cookie and field
        assert "SameSite=strict" in form.headers["set-cookie"]
        token = site.tokens["alpha"]
        for forged in ({"token": token}, {"token": token, "csrf": csrf[:-2] + "xx"}):
            refused = await browser.post("/login", data=forged)
            assert refused.status_code == 403, forged
            assert COOKIE not in refused.headers.get("set-cookie", "")
            assert (await browser.get("/tasks")).status_code == 303  # still signed out
        async with site.client() as other_site:  # the field copied, but no cookie sent
            refused = await other_site.post("/login", data={"token": token, "csrf": csrf})
            assert refused.status_code == 403
            assert COOKIE not in refused.headers.get("set-cookie", "")
        signed = await browser.post("/login", data={"token": token, "csrf": csrf})
        assert signed.status_code == 303
        assert (await browser.get("/tasks")).status_code == 200
        for forged_out in ({}, {"csrf": "not-the-token"}):
            kept = await browser.post("/logout", data=forged_out)
            assert kept.status_code == 403, forged_out
            assert "set-cookie" not in kept.headers  # the session cookie is not deleted
            page = await browser.get("/tasks")
            assert page.status_code == 200  # still signed in
        assert csrf_field(page.text) == csrf  # every page's sign-out form carries it
        out = await browser.post("/logout", data={"csrf": csrf})
        assert out.status_code == 303
        assert (await browser.get("/tasks")).status_code == 303


async def test_without_tokens_every_visitor_is_an_admin_like_the_api(
    db: Database, tmp_path: Path
) -> None:
    """Authentication off (no tokens): no sign-in, and the admin pages answer."""
    ids = {await create(db, "alpha"), await create(db, "beta")}
    console = console_for(db, Authenticator({}), tmp_path)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console.app), base_url="http://console.test"
    ) as anyone:
        page = await anyone.get("/tasks")
        assert page.status_code == 200
        assert ids <= listed_ids(page.text)
        assert (await anyone.get("/providers")).status_code == 200


async def test_task_events_stream_as_server_sent_events_and_resume_after_a_cursor(
    site: Site, db: Database
) -> None:
    """A finished task's events stream in order with their cursors as SSE ids, then ``end``;
    from a Last-Event-ID only the later ones come."""
    task_id = site.tasks["alpha"]
    await TaskService(db).cancel_task(task_id, "not needed")
    async with site.client("alpha") as alpha:
        whole = await alpha.get(f"/tasks/{task_id}/events")
        assert whole.status_code == 200
        assert whole.headers["content-type"].startswith("text/event-stream")
        ids = [int(i) for i in re.findall(r"^id: (\d+)$", whole.text, re.M)]
        assert len(ids) >= 2
        assert ids == sorted(ids)
        assert '"state": "CANCELLED"' in whole.text
        assert whole.text.endswith("event: end\ndata: {}\n\n")
        resumed = await alpha.get(
            f"/tasks/{task_id}/events", headers={"last-event-id": str(ids[0])}
        )
        assert [int(i) for i in re.findall(r"^id: (\d+)$", resumed.text, re.M)] == ids[1:]
        bad = await alpha.get(f"/tasks/{task_id}/events", params={"after": "x"})
        assert bad.status_code == 400


async def test_a_database_that_does_not_answer_is_503_not_a_crash(tmp_path: Path) -> None:
    """With the database down the pages answer 503 with a retry hint, never 500."""
    down = Database.from_url(f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/none")
    try:
        console = console_for(down, Authenticator({}), tmp_path)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=console.app), base_url="http://console.test"
        ) as anyone:
            for path in ("/tasks", "/tasks/1", "/tasks/1/decisions", "/breakers"):
                response = await anyone.get(path)
                assert response.status_code == 503, (path, response.text[:300])
                assert response.headers["retry-after"] == "1"
    finally:
        await down.dispose()
