"""Runway API emulator (provider-apis.md §1, §5): tasks, uploads, organization, usage, outputs.

Tasks carry the cost fields the official SDK requires (§5): ``estimatedCost`` on create and on
PENDING/THROTTLED/RUNNING, ``cost`` on SUCCEEDED/FAILED/CANCELLED (0 when not billed).
``POST /v1/uploads`` hands out a presigned-POST slot served by this emulator
(``/upload-bucket/{token}``) and a ``runway://`` URI usable as ``promptImage``.

Input assets (§1.7, §1.10): Runway fetches every https ``promptImage`` / ``videoUri`` itself at
create time and refuses the create with 400 when it cannot (not https, an IP host, a non-2xx such
as an expired presigned URL, the wrong type, over the URL size cap), so no task exists. With
``fetch_assets`` on, this emulator does the same fetch (`assets.check_remote`); it is off by
default only because suites use placeholder hosts (``assets.example.com``) that resolve nowhere.

Emulator extension (not in Runway's public API), off unless named in
``RunwayConfig.extensions``: ``task_listing`` serves ``GET /v1/tasks?createdAfter=&createdBefore=``,
tasks with their request bodies, so an adapter can search for an unknown submit.
Run standalone: ``python -m adapter_sidecars.emulators.runway --port 8101``.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Literal

from adapter_sidecars.emulators import assets
from adapter_sidecars.emulators import runway_schema as schema
from adapter_sidecars.emulators.core import Emulator, EmulatorConfig, parse_time
from adapter_sidecars.emulators.faults import FaultRule
from adapter_sidecars.emulators.http import Request, Response
from adapter_sidecars.emulators.jobs import Job, Phase, iso
from adapter_sidecars.emulators.media import MediaSpec, fit_size
from adapter_sidecars.emulators.runner import main as run
from adapter_sidecars.emulators.uploads import (
    SLOT_TTL_S,
    UPLOAD_PREFIX,
    Uploads,
    validate_upload_request,
)

DOC_URL = "https://docs.dev.runwayml.com/api"
DEFAULT_PRICES = {
    "gen4_turbo": 5.0,
    "gen4.5": 12.0,
    "gen4_aleph": 15.0,
    "aleph2": 15.0,
    "veo3": 40.0,
    "veo3.1": 40.0,
    "veo3.1/no_audio": 20.0,
    "veo3.1_fast": 15.0,
    "veo3.1_fast/no_audio": 10.0,
    "gen3a_turbo": 5.0,
}
ERRORS = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    429: "You have exceeded the rate limit for this model.",
    500: "Internal server error",
    502: "Bad gateway",
    503: "Service temporarily unavailable",
    504: "Gateway timeout",
}
PHASE_STATUS = {
    Phase.QUEUED: "PENDING",
    Phase.RUNNING: "RUNNING",
    Phase.SUCCEEDED: "SUCCEEDED",
    Phase.FAILED: "FAILED",
    Phase.CANCELLED: "CANCELLED",
}


@dataclass(frozen=True)
class RunwayConfig(EmulatorConfig):
    """Runway emulator settings (plus everything in `EmulatorConfig`).

    api_key: required Bearer key ("" accepts any non-empty key). api_version: required
    X-Runway-Version. max_concurrent / max_daily: per-model tier limits (THROTTLED / 429),
    overridable per model in tier_overrides {"gen4.5": [concurrent, daily]}. credits_per_second:
    price table ("<model>/no_audio" when audio is false). delete_mode: "cancel" keeps a
    CANCELLED task, "delete" makes later GETs 404. extensions: {"task_listing"} serves the
    emulator-only GET /v1/tasks (off by default: the real API has no listing).
    upload_max_bytes: size cap of one ephemeral upload; upload_ttl_s: how long a slot takes
    its file and its runway:// URI stays usable (a create naming it later is 400).
    fetch_assets: fetch https input URLs at create like Runway (see the module docstring);
    asset_ca_file: extra CA bundle trusted for those fetches (a test's private object store),
    "" for the system store.
    """

    api_key: str = ""
    api_version: str = "2024-11-06"
    max_concurrent: int = 2
    max_daily: int = 200
    tier_overrides: Mapping[str, list[int]] = field(default_factory=dict)
    credit_balance: int = 5000
    credits_per_second: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    delete_mode: Literal["cancel", "delete"] = "cancel"
    require_on_behalf_of: bool = False
    upload_max_bytes: int = 200 * 1024 * 1024
    upload_ttl_s: float = SLOT_TTL_S
    fetch_assets: bool = False
    asset_ca_file: str = ""


class RunwayEmulator(Emulator):
    """Speaks `api.dev.runwayml.com` at `self.url`."""

    name = "runway"
    config: RunwayConfig
    EXTENSIONS: ClassVar[Mapping[str, str]] = {
        "task_listing": "GET /v1/tasks?createdAfter=&createdBefore= (with bodies)"
    }
    #: Runway's export is credits per model-day only: a credits -> money conversion error can
    #: only be ours, so there is no "conversion" fault to show in it.
    USAGE_FAULTS: ClassVar[frozenset[str]] = frozenset(
        {"orphan", "duplicate", "price", "charge_failed"}
    )

    def __init__(self, config: RunwayConfig | None = None) -> None:
        super().__init__(config or RunwayConfig())
        self.uploads = Uploads(
            self.config.media_secret, self.config.upload_max_bytes, self.config.upload_ttl_s
        )

    def install_routes(self) -> None:
        for endpoint in (schema.T2V, schema.I2V, schema.V2V):
            self.router.add("POST", f"/v1/{endpoint}", self._create)
        self.router.add("GET", "/v1/tasks/{id}", self._get_task)
        self.router.add("DELETE", "/v1/tasks/{id}", self._delete_task)
        if self.extension("task_listing"):
            self.router.add("GET", "/v1/tasks", self._list_tasks)
        self.router.add("POST", "/v1/uploads", self._create_upload)
        self.router.add("POST", f"{UPLOAD_PREFIX}{{token}}", self._receive_upload)
        self.router.add("GET", "/v1/organization", self._organization)
        self.router.add("POST", "/v1/organization/usage", self._usage)

    # -- hooks -----------------------------------------------------------------------------
    def raw_status(self, job: Job) -> str:
        if job.phase is Phase.QUEUED and job.held:
            return "THROTTLED"
        return PHASE_STATUS[job.phase]

    def error_response(
        self, code: int, retry_after: float | None, rule: FaultRule | None
    ) -> Response:
        headers = [("retry-after", str(int(retry_after)))] if retry_after is not None else []
        return Response.json({"error": ERRORS.get(code, "Error")}, code, headers)

    def can_start(self, job: Job) -> bool:
        model = job.data["model"]
        running = sum(
            1
            for j in self.jobs.values()
            if j.phase is Phase.RUNNING and j.data["model"] == model and not j.deleted
        )
        return running < self._limits(model)[0]

    def on_job_changed(self, job: Job) -> None:
        if job.phase is Phase.SUCCEEDED:
            job.data["credits"] = job.data["estimated_credits"]

    def on_reset(self) -> None:
        self.uploads.clear()

    # -- helpers ---------------------------------------------------------------------------
    def _limits(self, model: str) -> tuple[int, int]:
        override = self.config.tier_overrides.get(model)
        if override:
            return int(override[0]), int(override[1])
        return self.config.max_concurrent, self.config.max_daily

    def _auth(self, request: Request) -> Response | None:
        auth = request.header("authorization") or ""
        key = auth[7:] if auth.startswith("Bearer ") else ""
        if not key or (self.config.api_key and key != self.config.api_key):
            return Response.json({"error": "Invalid API key"}, 401)
        if request.header("x-runway-version") != self.config.api_version:
            version = request.header("x-runway-version")
            message = (
                "Missing X-Runway-Version header"
                if version is None
                else (f"Invalid X-Runway-Version header: {version!r}")
            )
            return Response.json({"error": message}, 400)
        return None

    def _price(self, body: dict[str, Any], seconds: float) -> int:
        """Credits of a task: Runway bills whole credits (the SDK types `cost.credits` as int)."""
        model = body["model"]
        key = f"{model}/no_audio" if body.get("audio") is False else model
        per_second = self.config.credits_per_second.get(
            key, self.config.credits_per_second.get(model, 0)
        )
        surcharge = schema.format_surcharge(body.get("outputFormat"))
        return round((per_second + surcharge) * seconds)

    def _spent(self) -> float:
        spent = sum(float(j.data.get("credits", 0)) for j in self.jobs.values())
        return spent + sum(float(c.get("credits", c.get("amount", 0))) for c in self.usage_charges)

    def _daily(self, model: str) -> int:
        since = time.time() - 86400
        return sum(
            1 for j in self.jobs.values() if j.data["model"] == model and j.created_at >= since
        )

    def task_json(
        self, job: Job, status: str | None = None, expired: bool = False
    ) -> dict[str, Any]:
        status = status or self.raw_status(job)
        task: dict[str, Any] = {"id": job.id, "createdAt": iso(job.created_at), "status": status}
        if status in ("PENDING", "THROTTLED", "RUNNING"):
            task["estimatedCost"] = {"credits": job.data["estimated_credits"]}
        elif status in ("SUCCEEDED", "FAILED", "CANCELLED"):
            # Failed and cancelled tasks are refunded (§1.5, §1.6): their final cost is 0.
            task["cost"] = {"credits": int(job.data.get("credits", 0))}
        if status == "RUNNING":
            task["progress"] = job.progress
        elif status == "SUCCEEDED":
            width, height = job.data["size"]
            spec = MediaSpec(
                job.data["prompt"],
                job.data["duration"],
                width,
                height,
                fps=self.config.media_fps,
            )
            task["output"] = [self.media_url(spec, expired)]
        elif status == "FAILED":
            code, message = job.failure or ("INTERNAL", "An unexpected error occurred.")
            task["failure"], task["failureCode"] = message, code
        return task

    # -- routes ----------------------------------------------------------------------------
    async def _create(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        endpoint = request.path.rsplit("/", 1)[1]
        try:
            body = request.json()
        except ValueError:
            return Response.json({"error": "Invalid JSON body"}, 400)
        issues = schema.validate(endpoint, body)
        if issues:
            return Response.json(
                {"error": "Validation of body failed", "issues": issues, "docUrl": DOC_URL}, 400
            )
        if self.config.require_on_behalf_of and not request.header("x-runway-on-behalf-of"):
            return Response.json({"error": "Missing X-Runway-On-Behalf-Of header"}, 400)
        model = body["model"]
        if self._daily(model) >= self._limits(model)[1]:
            return Response.json(
                {"error": f"You have exceeded the daily generation limit for {model}."}, 429
            )
        duration = schema.duration_of(endpoint, body)
        estimate = self._price(body, duration)
        if (bad_upload := self._unknown_upload(body)) is not None:
            return bad_upload
        if self.config.fetch_assets:
            for uri in schema.media_uris(body):
                if uri.startswith(("http://", "https://")):
                    refusal = await assets.check_remote(uri, ca_file=self.config.asset_ca_file)
                    if refusal is not None:
                        return Response.json({"error": refusal}, 400)
        if self.config.credit_balance - self._spent() < estimate:
            return Response.json({"error": "You do not have enough credits to run this task."}, 400)
        ratio = schema.output_ratio(endpoint, body)
        data = {
            "model": model,
            "endpoint": endpoint,
            "duration": float(duration),
            "prompt": body.get("promptText") or body.get("videoUri") or "",
            "size": fit_size(*ratio, self.config.media_max_side),
            "ratio": ratio,
            "estimated_credits": estimate,
        }
        job = self.new_job(request, Job(str(uuid.uuid4()), f"POST {request.path}", body, data=data))
        if self.config.advance == "time":
            self.lifecycle.tick(job, job.created_at)
        return Response.json({"id": job.id, "estimatedCost": {"credits": estimate}})

    def _unknown_upload(self, body: dict[str, Any]) -> Response | None:
        """400 for a ``runway://`` URI this emulator never handed out (or not yet uploaded)."""
        for uri in schema.media_uris(body):
            if uri.startswith("runway://") and not self.uploads.complete(uri):
                return Response.json({"error": f"Invalid upload URI: {uri}"}, 400)
        return None

    def _find(self, request: Request) -> Job | None:
        job = self.jobs.get(request.params["id"])
        return None if job is None or job.deleted else job

    async def _get_task(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        job = self._find(request)
        if job is None:
            return Response.json({"error": "Could not find Task"}, 404)
        override = self.observe(request, job)
        expired = self.raw_status(job) == "SUCCEEDED" and self.consume_expiry(job)
        return Response.json(self.task_json(job, override, expired))

    async def _delete_task(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        job = self._find(request)
        if job is None:
            return Response.json({"error": "Could not find Task"}, 404)
        self.lifecycle.cancel(job)
        if self.config.delete_mode == "delete":
            job.deleted = True
        return Response.empty(204)

    async def _list_tasks(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        after = parse_time(request.query.get("createdAfter"), 0.0)
        before = parse_time(request.query.get("createdBefore"), float("inf"))
        tasks = [
            {**self.task_json(job), "request": job.body}
            for job in self.jobs.values()
            if not job.deleted and after <= job.created_at < before
        ]
        return Response.json({"data": tasks, "hasMore": False})

    async def _create_upload(self, request: Request) -> Response:
        """``POST /v1/uploads {"filename", "type": "ephemeral"}`` -> a presigned POST slot."""
        if (denied := self._auth(request)) is not None:
            return denied
        try:
            body = request.json()
        except ValueError:
            return Response.json({"error": "Invalid JSON body"}, 400)
        issues = validate_upload_request(body)
        if issues:
            return Response.json(
                {"error": "Validation of body failed", "issues": issues, "docUrl": DOC_URL}, 400
            )
        slot = self.uploads.create(str(body["filename"]))
        return Response.json(
            {
                "uploadUrl": f"{self.url}{UPLOAD_PREFIX}{slot.token}",
                "fields": slot.fields,
                "runwayUri": slot.runway_uri,
            }
        )

    async def _receive_upload(self, request: Request) -> Response:
        """The storage side of an upload: a multipart POST of the slot's fields plus ``file``."""
        return self.uploads.receive(request)

    async def _organization(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        models = sorted({k.split("/")[0] for k in self.config.credits_per_second})
        tier = {
            m: {
                "maxConcurrentGenerations": self._limits(m)[0],
                "maxDailyGenerations": self._limits(m)[1],
            }
            for m in models
        }
        usage = {m: {"dailyGenerations": self._daily(m)} for m in models}
        return Response.json(
            {
                "creditBalance": round(self.config.credit_balance - self._spent()),
                "tier": {"maxMonthlyCreditSpend": 10000, "models": tier},
                "usage": {"models": usage},
            }
        )

    def _billed_credits(self, job: Job) -> float:
        """What the usage export bills for `job`: its credits if it succeeded (failed and
        cancelled tasks are refunded), falsified by the usage faults aimed at it."""
        billed = job.phase is Phase.SUCCEEDED or (
            job.phase.terminal and self.usage_fault("charge_failed", job.id) is not None
        )
        if not billed:
            return 0.0
        credits = float(job.data.get("credits") or job.data["estimated_credits"])
        if (price := self.usage_fault("price", job.id)) is not None:
            credits = float(round(float(price["unit_price"]) * job.data["duration"]))
        return credits * (2 if self.billed_twice(job.id) else 1)

    async def _usage(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        try:
            body = request.json() or {}
        except ValueError:
            return Response.json({"error": "Invalid JSON body"}, 400)
        today = datetime.now(UTC).date()
        start = body.get("startDate") or (today - timedelta(days=30)).isoformat()
        before = body.get("beforeDate") or (today + timedelta(days=1)).isoformat()
        totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for job in self.jobs.values():
            credits = self._billed_credits(job)
            if credits and job.finished_at is not None:
                day = datetime.fromtimestamp(job.finished_at, UTC).date().isoformat()
                totals[day][job.data["model"]] += credits
        for charge in self.usage_charges:
            day = datetime.fromtimestamp(charge["at"], UTC).date().isoformat()
            amount = float(charge.get("credits", charge.get("amount", 0)))
            totals[day][str(charge.get("model", "unknown"))] += amount
        days = sorted(d for d in totals if start <= d < before)
        results: list[dict[str, Any]] = [
            {
                "date": d,
                "usedCredits": [
                    {"model": m, "amount": round(a)} for m, a in sorted(totals[d].items())
                ],
            }
            for d in days
        ]
        models = sorted({u["model"] for r in results for u in r["usedCredits"]})
        return Response.json({"models": models, "results": results})


def main(argv: list[str] | None = None) -> int:
    return run(RunwayEmulator, RunwayConfig, argv)


if __name__ == "__main__":
    raise SystemExit(main())
