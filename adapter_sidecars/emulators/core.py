"""The `Emulator` base: fault application, truth/admin endpoints, media links, callbacks.

Provider emulators subclass `Emulator`, register their routes in `install_routes`, and map
jobs to wire shapes through a few hooks (`raw_status`, `callback_payload`, `error_response`).
Admin endpoints live under ``/__emulator/`` and are never subject to faults.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal, Self

from adapter_sidecars.emulators.callbacks import CallbackSender
from adapter_sidecars.emulators.faults import FaultBook, FaultRule, FaultRuleError
from adapter_sidecars.emulators.http import Abort, BodyReader, HttpServer, Request, Response, Router
from adapter_sidecars.emulators.jobs import Job, Lifecycle, Pace
from adapter_sidecars.emulators.media import MediaLinks, MediaSpec, render_mp4

log = logging.getLogger(__name__)
#: Admin, media and upload-storage routes: never faulted or counted (they stand for other hosts
#: than the provider API: CDN links and presigned storage).
UNFAULTED_PREFIXES = ("/__emulator/", "/media/", "/upload-bucket/")


@dataclass(frozen=True)
class EmulatorConfig:
    """Settings every emulator shares.

    advance: "polls" (each GET of a job moves it one step; deterministic) or "time".
    queued_polls / running_polls: polls spent queued / running before the terminal state.
    queue_s / run_s: seconds queued / running in time mode; tick_s: time-mode ticker period.
    url_ttl_s: lifetime of signed output links. media_max_side / media_fps: rendered clip size.
    callback_secret: HMAC secret for webhooks. public_url: base URL put into links ("" = own).
    extensions: emulator-only routes to serve, by name (see each emulator's `EXTENSIONS`).
      Empty by default, so an emulator answers like the real provider: a route the provider
      lacks is 404 until a test (or ``--extensions task_listing``) asks for it by name.
    """

    advance: Literal["polls", "time"] = "polls"
    queued_polls: int = 1
    running_polls: int = 2
    queue_s: float = 0.5
    run_s: float = 2.0
    tick_s: float = 0.05
    url_ttl_s: float = 86400.0
    media_max_side: int = 320
    media_fps: int = 24
    callback_secret: str = "vidroute-emulator-secret"
    media_secret: str = "vidroute-media-secret"
    public_url: str = ""
    extensions: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # The CLI and JSON callers hand in lists; keep the field hashable and order-free.
        object.__setattr__(self, "extensions", frozenset(self.extensions))

    def pace(self) -> Pace:
        return Pace(self.advance, self.queued_polls, self.running_polls, self.queue_s, self.run_s)


def parse_time(value: str | float | int | None, default: float) -> float:
    """Accept unix seconds, ISO-8601 (with Z) or a YYYY-MM-DD date; None -> default."""
    if value is None or value == "":
        return default
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(value)
    except ValueError:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class Emulator:
    """Base class; see the module docstring."""

    name = "emulator"
    #: Usage-export faults this emulator applies (`add_usage_fault`); "orphan" is `add_usage`.
    USAGE_FAULTS: ClassVar[frozenset[str]] = frozenset({"orphan"})
    #: Emulator-only routes this emulator can serve: name -> what it adds. Off unless named in
    #: `EmulatorConfig.extensions`.
    EXTENSIONS: ClassVar[Mapping[str, str]] = {}

    def __init__(self, config: EmulatorConfig) -> None:
        unknown = sorted(config.extensions - set(self.EXTENSIONS))
        if unknown:
            raise ValueError(
                f"{self.name} emulator has no extension {unknown}; known: {sorted(self.EXTENSIONS)}"
            )
        self.config = config
        self.router = Router()
        self.fault_book = FaultBook()
        self.jobs: dict[str, Job] = {}
        self.usage_charges: list[dict[str, Any]] = []
        self.usage_faults: list[dict[str, Any]] = []
        self._reopen: asyncio.Task[None] | None = None
        self.counters: Counter[str] = Counter()
        self.media = MediaLinks(config.media_secret)
        self.callbacks = CallbackSender(config.callback_secret)
        self.lifecycle = Lifecycle(config.pace(), self.can_start, self._changed)
        self._server = HttpServer(self._handle)
        self._background: set[asyncio.Task[None]] = set()
        self._install_admin_routes()
        self.install_routes()

    def extension(self, name: str) -> bool:
        """Whether the emulator-only route `name` is switched on."""
        assert name in self.EXTENSIONS, name
        return name in self.config.extensions

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.config.public_url or self._server.url

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        await self.callbacks.start()
        await self._server.start(host, port)
        if self.config.advance == "time":
            self.spawn(self._ticker())
        return self.url

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._server.stop()
        await self.callbacks.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- Python admin API (same operations as /__emulator/*) -------------------------------
    def add_faults(self, rules: Any) -> list[dict[str, Any]]:
        """Append fault rules (a dict or a list); raises `FaultRuleError` when malformed."""
        added = self.fault_book.add(rules)
        for rule in added:
            if rule.kind == "immediate":
                rule.fired = rule.seen = 1
                self.refuse_connections(float(rule.params["duration_ms"]))
        return [rule.to_json() for rule in added]

    def faults(self) -> list[dict[str, Any]]:
        return self.fault_book.snapshot()

    def clear_faults(self) -> None:
        self.fault_book.clear()

    def truth(self) -> list[dict[str, Any]]:
        """Every job this emulator really created, oldest first."""
        return [job.truth(self.raw_status(job)) for job in self.jobs.values()]

    def add_usage(self, charge: dict[str, Any]) -> dict[str, Any]:
        """Record a billed charge that has no job (the usage export will show it)."""
        row = {**charge, "at": parse_time(charge.get("at"), time.time()), "job_id": None}
        self.usage_charges.append(row)
        return row

    def add_usage_fault(self, fault: dict[str, Any]) -> dict[str, Any]:
        """Falsify the usage export the way real bills go wrong (admin/test only).

        ``{"kind": "duplicate", "job_id"}``: the job is billed twice. ``{"kind": "price",
        "job_id", "unit_price"}``: the job is billed at another unit price (Runway credits per
        second, Veo USD per second). ``{"kind": "conversion", "job_id", "micros_per_unit"}``:
        the job's units are turned into money at another rate (exports that carry money for
        converted units). ``{"kind": "charge_failed", "job_id"}``: a failed or cancelled job is
        billed as if it had succeeded. ``{"kind": "orphan", ...}``: `add_usage`, a charge
        with no job. Raises ValueError for a kind this emulator's export cannot show.
        """
        kind = str(fault.get("kind", ""))
        if kind not in self.USAGE_FAULTS:
            raise ValueError(
                f"{self.name} usage export has no fault {kind!r}; "
                f"known: {sorted(self.USAGE_FAULTS)}"
            )
        if kind == "orphan":
            return self.add_usage({k: v for k, v in fault.items() if k != "kind"})
        if not isinstance(fault.get("job_id"), str) or fault["job_id"] not in self.jobs:
            raise ValueError(f"usage fault {kind!r} needs the job_id of a job of this emulator")
        row = dict(fault)
        self.usage_faults.append(row)
        return row

    def usage_fault(self, kind: str, job_id: str) -> dict[str, Any] | None:
        """The first usage fault of `kind` aimed at `job_id`, if any."""
        return next(
            (f for f in self.usage_faults if f["kind"] == kind and f["job_id"] == job_id), None
        )

    def billed_twice(self, job_id: str) -> bool:
        return self.usage_fault("duplicate", job_id) is not None

    def reset(self) -> None:
        self.jobs.clear()
        self.fault_book.clear()
        self.usage_charges.clear()
        self.usage_faults.clear()
        self.counters.clear()
        self.callbacks.reset()
        self.on_reset()

    def refuse_connections(self, duration_ms: float) -> None:
        """Stop listening for `duration_ms` (new connects get ECONNREFUSED), then reopen.

        A second call while refusing restarts the window from now (one reopen timer), so a
        harness can refuse until it has seen a client hit the refusal and then hold it for a
        fixed time after that."""

        self._server.close_listener()  # in force before the rule is acknowledged
        if self._reopen is not None:
            self._reopen.cancel()

        async def reopen() -> None:
            try:
                await asyncio.sleep(duration_ms / 1000)
            except asyncio.CancelledError:
                return  # a later call owns the window now
            await self._server.resume_listening()

        self._reopen = asyncio.get_running_loop().create_task(reopen())
        self._background.add(self._reopen)
        self._reopen.add_done_callback(self._background.discard)

    # -- hooks for provider emulators ------------------------------------------------------
    def install_routes(self) -> None:
        raise NotImplementedError

    def raw_status(self, job: Job) -> str:
        return job.phase.value

    def callback_payload(self, job: Job) -> Any:
        return None

    def error_response(
        self, code: int, retry_after: float | None, rule: FaultRule | None
    ) -> Response:
        headers = [("retry-after", str(int(retry_after)))] if retry_after is not None else []
        return Response.json({"error": f"HTTP {code}"}, code, headers)

    def can_start(self, job: Job) -> bool:
        return True

    def on_job_changed(self, job: Job) -> None:
        """Called after every phase change (billing, etc.)."""

    def on_reset(self) -> None:
        """Clear provider-specific counters."""

    # -- helpers for provider emulators ----------------------------------------------------
    def new_job(self, request: Request, job: Job) -> Job:
        """Store a created job, attaching job faults matched by its create request."""
        job.idempotency_key = request.header("idempotency-key")
        job.client_key = request.header("x-client-request-key")
        for rule in request.context.get("job_faults", []):
            job.faults.attach(rule)
        self.jobs[job.id] = job
        return job

    def observe(self, request: Request, job: Job) -> str | None:
        """Count a poll of `job`; return a THROTTLED / unknown status override set by a fault.

        A job that has ended (cancelled while throttled) reads as what it is: a provider
        reports THROTTLED only for a job still waiting in its queue."""
        for rule in request.context.get("job_faults", []):
            job.faults.attach(rule)
        self.lifecycle.on_poll(job)
        if job.faults.throttle_polls > 0 and not job.phase.terminal:
            job.faults.throttle_polls -= 1
            return "THROTTLED"
        if job.faults.unknown_polls > 0:
            job.faults.unknown_polls -= 1
            return job.faults.unknown_status
        return None

    def consume_expiry(self, job: Job) -> bool:
        """True when this observation of outputs must show already-expired links."""
        if job.faults.expire_polls > 0:
            job.faults.expire_polls -= 1
            return True
        return False

    def media_url(self, spec: MediaSpec, expired: bool = False) -> str:
        token = self.media.register(spec)
        ttl = -3600.0 if expired else self.config.url_ttl_s
        return self.media.url(self.url, token, ttl)

    async def send_callback_now(self, job: Job) -> None:
        payload = self.callback_payload(job)
        if payload is not None and job.callback_urls:
            await self.callbacks.deliver_now(job.id, job.callback_urls, payload)

    # -- internals -------------------------------------------------------------------------
    def _changed(self, job: Job) -> None:
        self.on_job_changed(job)
        payload = self.callback_payload(job)
        if payload is None or not job.callback_urls:
            return
        f = job.faults
        self.callbacks.enqueue(
            job.id,
            job.callback_urls,
            payload,
            terminal=job.phase.terminal,
            twice=f.callback_twice,
            out_of_order=f.callback_out_of_order,
        )

    async def _ticker(self) -> None:
        while True:
            now = time.time()
            for job in list(self.jobs.values()):
                if not job.phase.terminal:
                    self.lifecycle.tick(job, now)
            await asyncio.sleep(self.config.tick_s)

    async def _handle(self, request: Request, read_body: BodyReader) -> Response | Abort:
        if request.path.startswith(UNFAULTED_PREFIXES):
            request.body = await read_body(None)
            return await self._dispatch(request)
        self.counters[f"{request.method} {request.path}"] += 1
        matched = self.fault_book.match(request.method, request.path)
        request.context["job_faults"] = matched.job
        rule = matched.transport
        action = rule.action if rule else None
        if rule is not None and action == "delay_accept":
            await asyncio.sleep(float(rule.params["ms"]) / 1000)
        if action == "drop_after_partial_body":
            await read_body(request.content_length // 2)
            return Abort()
        request.body = await read_body(None)
        if rule is not None and action == "status":
            return self._fault_status(rule)
        response = await self._dispatch(request)
        if rule is None or action == "delay_accept":
            return response
        if action == "drop_after_body":
            return Abort()
        if action == "stall_response":
            await asyncio.sleep(float(rule.params["seconds"]))
            return response
        status = response.status if 200 <= response.status < 300 else 200
        if action == "corrupt_json":
            cut = response.body[: max(1, len(response.body) // 2)]
            return Response(status, cut + b"\x00<html>", [("content-type", "application/json")])
        body = response.json_body()
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if k not in ("id", "name")}
        return Response.json(body, status)

    def _fault_status(self, rule: FaultRule) -> Response:
        code = int(rule.params["code"])
        retry_after = rule.params.get("retry_after")
        if "body" in rule.params:
            headers = [("retry-after", str(retry_after))] if retry_after is not None else []
            return Response.json(rule.params["body"], code, headers)
        return self.error_response(code, None if retry_after is None else float(retry_after), rule)

    async def _dispatch(self, request: Request) -> Response:
        handler, params, path_known = self.router.resolve(request.method, request.path)
        if handler is None:
            return self.error_response(405 if path_known else 404, None, None)
        request.params = params
        try:
            return await handler(request)
        except Exception:
            log.exception("%s emulator failed on %s %s", self.name, request.method, request.path)
            return self.error_response(500, None, None)

    def _install_admin_routes(self) -> None:
        r = self.router
        r.add("GET", "/__emulator/faults", self._admin_get_faults)
        r.add("POST", "/__emulator/faults", self._admin_add_faults)
        r.add("DELETE", "/__emulator/faults", self._admin_clear_faults)
        r.add("GET", "/__emulator/jobs", self._admin_jobs)
        r.add("POST", "/__emulator/reset", self._admin_reset)
        r.add("POST", "/__emulator/usage", self._admin_usage)
        r.add("GET", "/__emulator/usage/faults", self._admin_usage_faults)
        r.add("POST", "/__emulator/usage/faults", self._admin_add_usage_faults)
        r.add("GET", "/__emulator/callbacks", self._admin_callbacks)
        r.add("GET", "/__emulator/stats", self._admin_stats)
        r.add("GET", "/media/{token}.mp4", self._media)

    async def _admin_get_faults(self, request: Request) -> Response:
        return Response.json({"faults": self.faults()})

    async def _admin_add_faults(self, request: Request) -> Response:
        try:
            return Response.json({"faults": self.add_faults(request.json())})
        except (FaultRuleError, ValueError) as exc:
            return Response.json({"error": str(exc)}, 400)

    async def _admin_clear_faults(self, request: Request) -> Response:
        self.clear_faults()
        return Response.empty(204)

    async def _admin_jobs(self, request: Request) -> Response:
        return Response.json({"jobs": self.truth()})

    async def _admin_reset(self, request: Request) -> Response:
        self.reset()
        return Response.empty(204)

    async def _admin_usage(self, request: Request) -> Response:
        try:
            charge = request.json()
        except ValueError as exc:
            return Response.json({"error": str(exc)}, 400)
        if not isinstance(charge, dict):
            return Response.json({"error": "expected a JSON object"}, 400)
        return Response.json(self.add_usage(charge), 201)

    async def _admin_usage_faults(self, request: Request) -> Response:
        return Response.json({"faults": self.usage_faults})

    async def _admin_add_usage_faults(self, request: Request) -> Response:
        try:
            body = request.json()
            faults = body if isinstance(body, list) else [body]
            if not all(isinstance(f, dict) for f in faults):
                raise ValueError("expected a JSON object or a list of objects")
            return Response.json({"faults": [self.add_usage_fault(f) for f in faults]}, 201)
        except ValueError as exc:
            return Response.json({"error": str(exc)}, 400)

    async def _admin_callbacks(self, request: Request) -> Response:
        return Response.json({"deliveries": [d.to_json() for d in self.callbacks.deliveries]})

    async def _admin_stats(self, request: Request) -> Response:
        return Response.json({"requests": dict(self.counters)})

    async def _media(self, request: Request) -> Response:
        q = request.query
        spec = self.media.check(request.params["token"], q.get("_jwt", ""), q.get("exp", ""))
        if spec is None:
            return Response(
                403, b"Forbidden: link expired or invalid", [("content-type", "text/plain")]
            )
        data = await asyncio.to_thread(render_mp4, spec)
        return Response(200, data, [("content-type", "video/mp4")])
