"""The read-only web console: server-rendered pages (Starlette + Jinja2) with htmx for live parts.

Pages: ``/tasks`` (filters: tenant, state, provider, created since/until; the rows re-read every
2 s), ``/tasks/{id}`` (the timeline, re-read on each of the task's events, streamed as server-sent
events from ``TaskService.watch``, until the task is terminal; the stored output in a
``<video>``), ``/tasks/{id}/decisions`` (the explain table of every route decision),
``/providers`` (capability versions, prices, health windows, leases), ``/breakers`` (states and
their history), ``/tenants`` (each tenant's entitlements, weights and caps against its use now,
`TenantLimitsService`), ``/accounts`` (each provider account's limits against its use now,
under the active accounts document), ``/reconciliation`` (the stored report of a day, its rows'
ids and the losses booked from them with their dispute state). Every
read goes through `ConsoleReads` and the other services with the signed-in caller, so the API's
scoping holds: a tenant gets 404 for another tenant's task and 403 on the admin pages. htmx is
vendored in ``static/`` (no CDN: the console works offline).

One action besides signing in and out: an admin moves a booked loss's dispute from the
reconciliation page (``POST /disputes/{id}/move``: disputed, refunded with the amount the
provider credited, written off; a reason each time), through `BillingService.move_dispute`,
the move ``vidroute disputes move`` makes. Like sign-out it is honoured only with the page's
CSRF token (`controlplane.console.csrf`); a refused move changes nothing.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from controlplane.api.auth import Authenticator
from controlplane.console import auth as session
from controlplane.console import csrf, shaping
from controlplane.console.headers import SecurityHeaders
from controlplane.domain.disputes import DISPUTE_MACHINE
from controlplane.domain.states import TASK_MACHINE, TaskState
from controlplane.persistence.records import TaskEventRecord
from controlplane.service.access import Caller
from controlplane.service.accounts import AccountConfigService
from controlplane.service.billing import BillingService, DisputeMoveInput
from controlplane.service.console_reads import ConsoleReads, TaskFilter
from controlplane.service.outputs import OutputService
from controlplane.service.tasks import parse_cursor, parse_task_id
from controlplane.service.tenant_limits import TenantLimitsService
from vidroute_core.exceptions import (
    InvalidSpec,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    Unavailable,
)
from vidroute_core.validation import FieldViolation

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
POLL = "every 2s"  # the task list's rows
TIMELINE_POLL = "every 10s"  # a timeline's fallback; its task's events refresh it at once
_RANGE = re.compile(r"bytes=(\d{0,19})-(\d{0,19})")
Handler = Callable[[Request, Caller], Awaitable[Response]]


class Console:
    """The console's routes over the services; `app` is the ASGI application."""

    def __init__(
        self,
        auth: Authenticator,
        reads: ConsoleReads,
        *,
        outputs: OutputService | None = None,
        billing: BillingService | None = None,
        tenants: TenantLimitsService | None = None,
        accounts: AccountConfigService | None = None,
    ) -> None:
        self._auth, self._reads, self._outputs, self._billing = auth, reads, outputs, billing
        self._tenants = tenants
        self._accounts = accounts  # the accounts document and usage (None: no Accounts page)
        env = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(),
            undefined=StrictUndefined,  # a misspelt field is an error in the tests, not blank
        )
        env.filters.update(money=shaping.money, compact=shaping.compact, ts=_ts)
        self._templates = Jinja2Templates(env=env)
        guarded = [
            ("/tasks", self.tasks),
            ("/tasks/rows", self.task_rows),
            ("/tasks/{task_id}", self.task),
            ("/tasks/{task_id}/timeline", self.task_timeline),
            ("/tasks/{task_id}/events", self.task_events),
            ("/tasks/{task_id}/decisions", self.decisions),
            ("/tasks/{task_id}/output/{sample}", self.output),
            ("/providers", self.providers),
            ("/breakers", self.breakers),
            ("/tenants", self.tenants),
            ("/accounts", self.accounts),
            ("/reconciliation", self.reconciliation),
        ]
        routes: list[BaseRoute] = [Route(path, self._guard(fn)) for path, fn in guarded]
        routes += [
            Route("/disputes/{dispute_id}/move", self._guard(self.move_dispute), methods=["POST"]),
            Route("/", lambda r: RedirectResponse("/tasks", 303)),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        self.app = SecurityHeaders(Starlette(routes=routes))

    # ---- plumbing ---------------------------------------------------------------------------
    def _page(self, request: Request, name: str, code: int = 200, **context: Any) -> Response:
        context.setdefault("caller", None)
        context["auth_enabled"] = self._auth.enabled
        token = csrf.token_of(request)
        context["csrf"] = token or csrf.new_token()  # the forms' hidden field
        page = self._templates.TemplateResponse(request, name, context, status_code=code)
        if token is None:
            csrf.set_cookie(page, context["csrf"], secure=self._secure(request))
        return page

    def _guard(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            caller = session.caller_of(self._auth, request)
            if caller is None:
                if request.headers.get("authorization") is not None:
                    return Response("invalid bearer token\n", 401, {"www-authenticate": "Bearer"})
                return RedirectResponse(f"/login?{urlencode({'next': request.url.path})}", 303)
            try:
                return await handler(request, caller)
            except NotFound as exc:
                return self._error(request, caller, 404, str(exc))
            except PermissionDenied as exc:
                return self._error(request, caller, 403, str(exc))
            except (InvalidSpec, PreconditionFailed) as exc:
                return self._error(request, caller, 400, str(exc))
            except Unavailable as exc:
                return self._error(request, caller, 503, str(exc))
            except (OSError, TimeoutError) as exc:  # the database does not answer
                log.warning("console %s: a dependency is unavailable: %r", request.url.path, exc)
                return self._error(request, caller, 503, "a dependency is unavailable; retry")

        return endpoint

    def _error(self, request: Request, caller: Caller, status: int, message: str) -> Response:
        page = self._page(
            request, "error.html", status, caller=caller, status=status, message=message
        )
        if status == 503:
            page.headers["retry-after"] = "1"
        return page

    def _secure(self, request: Request) -> bool:
        return request.url.scheme == "https"

    # ---- sign in ------------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        target = request.query_params.get("next", "/tasks")
        if not target.startswith("/") or target.startswith("//"):
            target = "/tasks"  # only our own paths: no open redirect
        if request.method == "GET":
            return self._page(request, "login.html", next=target, failed=False, forged=False)
        form = await _form(request)
        if not csrf.accepted(request, form):
            return self._page(request, "login.html", 403, next=target, failed=False, forged=True)
        token = form.get("token", "")
        if session.sign_in(self._auth, token) is None:
            return self._page(request, "login.html", 401, next=target, failed=True, forged=False)
        response = RedirectResponse(target, 303)
        session.set_session(response, token, secure=self._secure(request))
        return response

    async def logout(self, request: Request) -> Response:
        if not csrf.accepted(request, await _form(request)):
            caller = session.caller_of(self._auth, request)
            return self._page(
                request,
                "error.html",
                403,
                caller=caller,
                status=403,
                message="This sign-out did not come from a console page; nothing was changed.",
            )
        response = RedirectResponse("/login", 303)
        session.end_session(response, secure=self._secure(request))
        return response

    # ---- tasks --------------------------------------------------------------------------------
    def _filter(self, request: Request) -> tuple[TaskFilter, dict[str, str]]:
        q = {k: v.strip() for k, v in request.query_params.items() if v.strip()}
        state = q.get("state")
        if state is not None and state not in TaskState.__members__:
            raise _invalid("state", f"must be one of {', '.join(TaskState.__members__)}")
        return (
            TaskFilter(
                tenant_id=q.get("tenant"),
                state=TaskState[state] if state else None,
                provider=q.get("provider"),
                since=_when(q.get("since"), "since"),
                until=_when(q.get("until"), "until"),
                page_token=q.get("page"),
            ),
            q,
        )

    async def tasks(self, request: Request, caller: Caller) -> Response:
        query, raw = self._filter(request)
        rows, token = await self._reads.list_tasks(query, caller)
        return self._page(
            request,
            "tasks.html",
            caller=caller,
            rows=rows,
            next_page=token,
            q=raw,
            qs=urlencode(raw),
            states=list(TaskState.__members__),
            poll=POLL,
        )

    async def task_rows(self, request: Request, caller: Caller) -> Response:
        query, raw = self._filter(request)
        rows, _ = await self._reads.list_tasks(query, caller)
        return self._page(request, "_task_rows.html", rows=rows, qs=urlencode(raw), poll=POLL)

    async def _timeline_context(self, request: Request, caller: Caller) -> dict[str, Any]:
        found = await self._reads.timeline(parse_task_id(request.path_params["task_id"]), caller)
        detail = found.detail
        terminal = TASK_MACHINE.is_terminal(detail.task.state)
        return {
            "caller": caller,
            "task": detail.task,
            "detail": detail,
            "accounts": found.account_names,
            "entries": shaping.timeline(
                detail, found.events, found.account_names, found.observations
            ),
            "samples": shaping.samples(detail) if detail.task.state is TaskState.SUCCEEDED else [],
            "poll": None if terminal else TIMELINE_POLL,
        }

    async def task(self, request: Request, caller: Caller) -> Response:
        return self._page(request, "task.html", **await self._timeline_context(request, caller))

    async def task_timeline(self, request: Request, caller: Caller) -> Response:
        context = await self._timeline_context(request, caller)
        return self._page(request, "_timeline.html", **context)

    async def task_events(self, request: Request, caller: Caller) -> Response:
        """The task's events as server-sent events, from `TaskService.watch` (what WatchTask
        streams): ``task`` per event (its cursor is the SSE id, so a reconnecting browser
        resumes after the last one it saw), then ``end`` once the task is terminal."""
        task_id = parse_task_id(request.path_params["task_id"])
        raw = request.headers.get("last-event-id") or request.query_params.get("after", "")
        after = parse_cursor(raw.strip())
        await self._reads.visible(task_id, caller)  # NotFound before the stream starts
        return StreamingResponse(
            _sse(self._reads.watch(task_id, after, caller)),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def decisions(self, request: Request, caller: Caller) -> Response:
        found = await self._reads.timeline(parse_task_id(request.path_params["task_id"]), caller)
        tables = [shaping.explain(d) for d in found.detail.route_decisions]
        return self._page(
            request, "decisions.html", caller=caller, task=found.detail.task, tables=tables
        )

    async def output(self, request: Request, caller: Caller) -> Response:
        """The stored sample's bytes from the object store, with HTTP ranges (video seeking)."""
        if self._outputs is None:
            raise Unavailable("object store")
        task_id = parse_task_id(request.path_params["task_id"])
        index = _index(request.path_params["sample"])
        sample = await self._outputs.sample(task_id, index, caller)
        size = int(sample.get("size_bytes", 0))
        start, end, status = 0, size - 1, 200
        wanted = _RANGE.fullmatch(request.headers.get("range", "").strip())
        if wanted is not None and size > 0:
            first, last = wanted.groups()
            if first:
                start, end = int(first), min(int(last), size - 1) if last else size - 1
            elif last:  # a suffix: the last N bytes
                start = max(0, size - int(last))
            if start > end or start >= size:
                return Response(status_code=416, headers={"content-range": f"bytes */{size}"})
            status = 206
        length = max(0, end - start + 1)
        _, chunks = await self._outputs.read(task_id, index, start, length, caller)
        headers = {"accept-ranges": "bytes", "content-length": str(length)}
        if status == 206:
            headers["content-range"] = f"bytes {start}-{end}/{size}"
        media = str(sample.get("mime_type") or "application/octet-stream")
        return StreamingResponse(_bytes(chunks), status, headers, media_type=media)

    # ---- providers ----------------------------------------------------------------------------
    async def providers(self, request: Request, caller: Caller) -> Response:
        page = await self._reads.providers(caller)
        return self._page(request, "providers.html", caller=caller, page=page)

    async def breakers(self, request: Request, caller: Caller) -> Response:
        provider = request.query_params.get("provider", "").strip()
        page = await self._reads.breakers(caller, provider)
        return self._page(request, "breakers.html", caller=caller, page=page, provider=provider)

    async def tenants(self, request: Request, caller: Caller) -> Response:
        if self._tenants is None:
            raise Unavailable("tenants")
        page = await self._tenants.page(caller)
        return self._page(request, "tenants.html", caller=caller, page=page)

    async def accounts(self, request: Request, caller: Caller) -> Response:
        """Each account's limits against its use now, under the active accounts document."""
        if self._accounts is None:
            raise Unavailable("accounts")
        usage = await self._accounts.usage(caller)
        active = await self._accounts.get(caller=caller)
        return self._page(request, "accounts.html", caller=caller, usage=usage, active=active)

    async def reconciliation(self, request: Request, caller: Caller) -> Response:
        if self._billing is None:
            raise Unavailable("billing")
        day = request.query_params.get("date", "").strip()
        report = await self._billing.reconciliation_report(day, caller)
        on = report.day.isoformat()
        disputes = await self._billing.disputes("", on, on, caller)
        return self._page(
            request,
            "reconciliation.html",
            caller=caller,
            report=report,
            day=day,
            disputes=disputes,
            moves={k.value: sorted(t.value for t in v) for k, v in DISPUTE_MACHINE.items()},
        )

    async def move_dispute(self, request: Request, caller: Caller) -> Response:
        """An admin's dispute move from the reconciliation page (module doc); back to the day."""
        if self._billing is None:
            raise Unavailable("billing")
        form = await _form(request)
        if not csrf.accepted(request, form):
            return self._error(
                request,
                caller,
                403,
                "This move did not come from a console page; nothing was changed.",
            )
        move = DisputeMoveInput(
            dispute_id=_number(request.path_params["dispute_id"], "dispute_id"),
            target=form.get("target", ""),
            reason=form.get("reason", ""),
            refunded_micros=_number(
                form.get("refunded_micros", "").strip() or "0", "refunded_micros"
            ),
        )
        moved = await self._billing.move_dispute(move, caller)
        query = urlencode({"date": moved.day})
        return RedirectResponse(f"/reconciliation?{query}#dispute-{moved.id}", 303)


async def _sse(events: AsyncIterator[TaskEventRecord]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            data = json.dumps({"kind": event.kind, "state": event.payload.get("state", "")})
            yield f"id: {event.seq}\nevent: task\ndata: {data}\n\n".encode()
    except (OSError, TimeoutError, Unavailable) as exc:
        # Cut short without "end": the browser reconnects after the last id it saw.
        log.warning("console event stream ended early: %r", exc)
        return
    yield b"event: end\ndata: {}\n\n"


async def _bytes(chunks: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield chunk.data
    except (PreconditionFailed, Unavailable) as exc:  # the headers are sent: cut the body short
        log.warning("console output stream ended early: %s", exc)


async def _form(request: Request) -> dict[str, str]:
    """A small urlencoded form (the console's are a token and a CSRF field)."""
    body = await request.body()
    return dict(parse_qsl(body[:4096].decode("utf-8", "replace")))


def _invalid(field: str, description: str) -> InvalidSpec:
    return InvalidSpec([FieldViolation(field, description)])


def _number(raw: str, field: str) -> int:
    """A whole number of at most 18 digits (an id, micros), else a field violation."""
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise _invalid(field, "must be a whole number")
    return int(raw)


def _index(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit() or len(raw) > 6:
        raise _invalid("sample_index", "must be a small decimal number")
    return int(raw)


def _when(raw: str | None, field: str) -> datetime | None:
    """A ``datetime-local`` value (or any ISO 8601); without a zone it is UTC."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise _invalid(field, "must be a date and time, e.g. 2026-01-31T12:00") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _ts(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
