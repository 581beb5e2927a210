"""Self-hosted GPU model server: our internal job API (provider-apis.md §3.4).

A simulated worker pool runs jobs: in ``advance="time"`` each of ``workers`` tasks takes the
oldest queued job, holds it for ``gpu_seconds * speed`` wall seconds and really renders the MP4;
in ``advance="polls"`` jobs step on each GET but never more than ``workers`` run at once.
``GET /v1/load`` reports each model's queue, warm/cold state, GPU utilisation and VRAM; a job
of a cold model waits for the model to load first (`selfhosted_load`).
Standalone: ``python -m adapter_sidecars.emulators.selfhosted --port 8103``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from adapter_sidecars.emulators.core import Emulator, EmulatorConfig, parse_time
from adapter_sidecars.emulators.faults import FaultRule
from adapter_sidecars.emulators.http import Request, Response
from adapter_sidecars.emulators.jobs import Job, Phase, iso
from adapter_sidecars.emulators.media import MediaSpec, fit_size, render_mp4
from adapter_sidecars.emulators.runner import main as run
from adapter_sidecars.emulators.selfhosted_load import ModelServer

RESOLUTIONS = {"480p": 480, "720p": 720, "1080p": 1080}
ASPECTS = {"16:9": (16, 9), "9:16": (9, 16), "1:1": (1, 1)}
KEYS = {
    "model",
    "prompt",
    "negative_prompt",
    "image_url",
    "duration_s",
    "resolution",
    "aspect_ratio",
    "seed",
    "webhook_url",
}
RETRYABLE = {
    "OOM": False,
    "INVALID_INPUT": False,
    "WORKER_LOST": True,
    "TIMEOUT": True,
    "INTERNAL": True,
}
HTTP_CODES = {
    400: "INVALID_INPUT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "IDEMPOTENCY_CONFLICT",
    429: "RATE_LIMITED",
    500: "INTERNAL",
    502: "BAD_GATEWAY",
    503: "UNAVAILABLE",
    504: "TIMEOUT",
}


@dataclass(frozen=True)
class SelfHostedConfig(EmulatorConfig):
    """Self-hosted emulator settings (plus everything in `EmulatorConfig`).

    api_key: Bearer key ("" = no auth). workers: GPU workers. max_queue: queued jobs before 503.
    gpu_base_s + gpu_s_per_output_s * duration_s = simulated gpu_seconds of a job; speed: wall
    seconds per simulated GPU second (time mode). models: accepted model names (JSON list).
    retry_after_s: Retry-After sent with 503 queue-full. micros_per_gpu_second: the cluster's
    chargeback rate in the usage export's ``cost_micros``. cold_start_s: simulated seconds to
    load a cold model; idle_unload_s: simulated idle seconds before a model is unloaded (0:
    never); preload: every model resident at start; gpu_vram_mb per worker, model_vram_mb per
    resident model, job_vram_mb per running job (`selfhosted_load`).
    """

    api_key: str = ""
    workers: int = 2
    max_queue: int = 16
    speed: float = 0.01
    gpu_base_s: float = 10.0
    gpu_s_per_output_s: float = 8.0
    models: tuple[str, ...] = ("wan2.2-t2v", "wan2.2-i2v", "ltx-video")
    max_duration_s: float = 10.0
    retry_after_s: int = 5
    micros_per_gpu_second: int = 350
    cold_start_s: float = 60.0
    idle_unload_s: float = 0.0
    preload: bool = True
    gpu_vram_mb: int = 81920
    model_vram_mb: int = 30720
    job_vram_mb: int = 16384


def _error(
    http: int, code: str, message: str, headers: list[tuple[str, str]] | None = None
) -> Response:
    body = {
        "error": {"code": code, "message": message, "retryable": http in (429, 500, 502, 503, 504)}
    }
    return Response.json(body, http, headers)


class SelfHostedEmulator(Emulator):
    """Speaks the internal GPU job API at `self.url`."""

    name = "selfhosted"
    config: SelfHostedConfig
    #: Rows carry GPU seconds and their chargeback money, so a conversion can be falsified;
    #: there is no per-output-second price to get wrong.
    USAGE_FAULTS: ClassVar[frozenset[str]] = frozenset(
        {"orphan", "duplicate", "conversion", "charge_failed"}
    )

    def __init__(self, config: SelfHostedConfig | None = None) -> None:
        super().__init__(config or SelfHostedConfig())
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self.model_server = ModelServer(self.config)

    def install_routes(self) -> None:
        r = self.router
        r.add("POST", "/v1/jobs", self._create)
        r.add("GET", "/v1/jobs", self._lookup)
        r.add("GET", "/v1/jobs/{id}", self._get)
        r.add("DELETE", "/v1/jobs/{id}", self._delete)
        r.add("GET", "/v1/health", self._health)
        r.add("GET", "/v1/usage", self._usage)
        r.add("GET", "/v1/load", self._load)

    # -- hooks -----------------------------------------------------------------------------
    def error_response(
        self, code: int, retry_after: float | None, rule: FaultRule | None
    ) -> Response:
        headers = [("retry-after", str(int(retry_after)))] if retry_after is not None else []
        return _error(
            code, HTTP_CODES.get(code, "INTERNAL"), f"Injected or routed HTTP {code}", headers
        )

    def can_start(self, job: Job) -> bool:
        return self._running() < self.config.workers

    def on_job_changed(self, job: Job) -> None:
        self.model_server.touch(job)

    def on_reset(self) -> None:
        self.model_server.reset()

    def callback_payload(self, job: Job) -> Any:
        return self.job_json(job)

    async def _ticker(self) -> None:
        """Time mode: the worker pool replaces the base ticker."""
        await asyncio.gather(*(self._worker(i) for i in range(self.config.workers)))

    # -- shapes ----------------------------------------------------------------------------
    def _running(self) -> int:
        return sum(1 for j in self.jobs.values() if j.phase is Phase.RUNNING)

    def _queue_position(self, job: Job) -> int | None:
        if job.phase is not Phase.QUEUED:
            return None
        queued = [j for j in self.jobs.values() if j.phase is Phase.QUEUED]
        return queued.index(job) + 1

    def _progress(self, job: Job) -> float:
        if job.phase is Phase.RUNNING and self.config.advance == "time" and job.started_at:
            wall = float(job.data["gpu_seconds"]) * self.config.speed
            return round(min(0.99, (time.time() - job.started_at) / max(wall, 1e-9)), 4)
        return job.progress

    def _gpu_seconds(self, job: Job) -> float:
        full = float(job.data["gpu_seconds"])
        share = {Phase.QUEUED: 0.0, Phase.SUCCEEDED: 1.0, Phase.FAILED: 0.5}.get(job.phase)
        return round(full * (self._progress(job) if share is None else share), 3)

    def _spec(self, job: Job) -> MediaSpec:
        w, h = job.data["size"]
        return MediaSpec(job.data["prompt"], job.data["duration"], w, h, self.config.media_fps)

    def job_json(
        self, job: Job, status: str | None = None, expired: bool = False
    ) -> dict[str, Any]:
        outputs = []
        if job.phase is Phase.SUCCEEDED:
            ttl = -3600.0 if expired else self.config.url_ttl_s
            w, h = job.data["size"]
            outputs.append(
                {
                    "url": self.media_url(self._spec(job), expired),
                    "content_type": "video/mp4",
                    "duration_s": job.data["duration"],
                    "width": w,
                    "height": h,
                    "expires_at": iso(time.time() + ttl),
                }
            )
        error = None
        if job.phase is Phase.FAILED and job.failure:
            code, message = job.failure
            error = {"code": code, "message": message, "retryable": RETRYABLE.get(code, True)}
        return {
            "id": job.id,
            "status": status or job.phase.value,
            "model": job.data["model"],
            "progress": self._progress(job),
            "queue_position": self._queue_position(job),
            "created_at": iso(job.created_at),
            "started_at": iso(job.started_at),
            "finished_at": iso(job.finished_at),
            "outputs": outputs,
            "error": error,
            "metrics": {"gpu_seconds": self._gpu_seconds(job)},
        }

    # -- routes ----------------------------------------------------------------------------
    def _auth(self, request: Request) -> Response | None:
        if (
            self.config.api_key
            and request.header("authorization") != f"Bearer {self.config.api_key}"
        ):
            return _error(401, "UNAUTHENTICATED", "Missing or invalid bearer token")
        return None

    def _validate(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return "body must be a JSON object"
        unknown = sorted(set(body) - KEYS)
        if unknown:
            return f"unknown fields: {', '.join(unknown)}"
        if body.get("model") not in self.config.models:
            return f"model must be one of {list(self.config.models)}"
        if not isinstance(body.get("prompt"), str) or not body["prompt"].strip():
            return "prompt is required"
        duration = body.get("duration_s", 5)
        if (
            isinstance(duration, bool)
            or not isinstance(duration, int | float)
            or not (0 < duration <= self.config.max_duration_s)
        ):
            return f"duration_s must be a number in (0, {self.config.max_duration_s}]"
        if body.get("resolution", "720p") not in RESOLUTIONS:
            return f"resolution must be one of {list(RESOLUTIONS)}"
        if body.get("aspect_ratio", "16:9") not in ASPECTS:
            return f"aspect_ratio must be one of {list(ASPECTS)}"
        hook = body.get("webhook_url")
        return None if hook is None or isinstance(hook, str) else "webhook_url must be a string"

    async def _create(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        try:
            body = request.json()
        except ValueError:
            return _error(400, "INVALID_INPUT", "body is not valid JSON")
        key = request.header("idempotency-key")
        existing = next((j for j in self.jobs.values() if key and j.idempotency_key == key), None)
        if existing is not None:
            if _canonical(existing.body) != _canonical(body):
                return _error(
                    409,
                    "IDEMPOTENCY_CONFLICT",
                    "Idempotency-Key was already used with a different request body",
                )
            return Response.json(self._accepted(existing), 200)
        if (problem := self._validate(body)) is not None:
            return _error(400, "INVALID_INPUT", problem)
        if sum(1 for j in self.jobs.values() if j.phase is Phase.QUEUED) >= self.config.max_queue:
            retry = str(self.config.retry_after_s)
            return _error(503, "QUEUE_FULL", "queue is full", [("retry-after", retry)])
        duration = float(body.get("duration_s", 5))
        height = RESOLUTIONS[body.get("resolution", "720p")]
        aw, ah = ASPECTS[body.get("aspect_ratio", "16:9")]
        side = min(self.config.media_max_side, max(height * aw // ah, height * ah // aw))
        data = {
            "model": body["model"],
            "prompt": body["prompt"],
            "duration": duration,
            "size": fit_size(aw, ah, side),
            "gpu_seconds": self.config.gpu_base_s + self.config.gpu_s_per_output_s * duration,
        }
        hooks = [body["webhook_url"]] if body.get("webhook_url") else []
        job = Job(
            f"job_{secrets.token_hex(8)}", "POST /v1/jobs", body, data=data, callback_urls=hooks
        )
        self.new_job(request, job)
        if self.config.advance == "time":
            self._queue.put_nowait(job.id)
        if job.faults.callback_before_response:
            await self.send_callback_now(job)
        return Response.json(self._accepted(job), 202)

    def _accepted(self, job: Job) -> dict[str, Any]:
        return {
            "id": job.id,
            "status": job.phase.value,
            "queue_position": self._queue_position(job),
        }

    async def _lookup(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        key = request.query.get("idempotency_key")
        jobs = [
            self.job_json(j) for j in self.jobs.values() if key is None or j.idempotency_key == key
        ]
        return Response.json({"jobs": jobs})

    async def _get(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        job = self.jobs.get(request.params["id"])
        if job is None:
            return _error(404, "NOT_FOUND", f"job {request.params['id']} not found")
        override = self.observe(request, job)
        status = "queued" if override == "THROTTLED" else override
        expired = job.phase is Phase.SUCCEEDED and self.consume_expiry(job)
        return Response.json(self.job_json(job, status, expired))

    async def _delete(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        job = self.jobs.get(request.params["id"])
        if job is None:
            return _error(404, "NOT_FOUND", f"job {request.params['id']} not found")
        self.lifecycle.cancel(job)
        return Response.json({"id": job.id, "status": job.phase.value}, 202)

    async def _health(self, request: Request) -> Response:
        depth = sum(1 for j in self.jobs.values() if j.phase is Phase.QUEUED)
        busy = self._running()
        status = "BUSY" if busy >= self.config.workers else "READY"
        return Response.json(
            {
                "status": status,
                "queue_depth": depth,
                "workers": {"total": self.config.workers, "busy": busy},
            }
        )

    async def _load(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        return Response.json(self.model_server.document(self.jobs.values()))

    def _running_models(self) -> list[str]:
        return [j.data["model"] for j in self.jobs.values() if j.phase is Phase.RUNNING]

    async def _usage(self, request: Request) -> Response:
        if (denied := self._auth(request)) is not None:
            return denied
        start = parse_time(request.query.get("start"), 0.0)
        end = parse_time(request.query.get("end"), float("inf"))
        rows: list[dict[str, Any]] = []
        for j in self.jobs.values():
            if not (j.phase.terminal and j.finished_at and start <= j.finished_at < end):
                continue
            seconds = self._gpu_seconds(j)
            if j.phase is not Phase.SUCCEEDED and self.usage_fault("charge_failed", j.id):
                seconds = float(j.data["gpu_seconds"])
            if seconds <= 0:
                continue
            rate = self.config.micros_per_gpu_second
            if (fault := self.usage_fault("conversion", j.id)) is not None:
                rate = int(fault["micros_per_unit"])
            row = {
                "job_id": j.id,
                # Our job API (§3.4) names the create call's Idempotency-Key in each row, so a
                # usage row can be tied to exactly one request.
                "idempotency_key": j.idempotency_key,
                "model": j.data["model"],
                "gpu_seconds": seconds,
                # The cluster's chargeback: GPU seconds at its rate, in integer micros.
                "cost_micros": round(seconds * rate),
                "finished_at": iso(j.finished_at),
            }
            rows.extend([row, dict(row)] if self.billed_twice(j.id) else [row])
        rows += [
            {
                "job_id": c.get("ref"),
                "idempotency_key": None,
                "model": c.get("model"),
                "gpu_seconds": float(c.get("seconds", c.get("gpu_seconds", 0))),
                "cost_micros": round(
                    float(c.get("seconds", c.get("gpu_seconds", 0)))
                    * self.config.micros_per_gpu_second
                ),
                "finished_at": iso(c["at"]),
            }
            for c in self.usage_charges
            if start <= c["at"] < end
        ]
        total = round(sum(r["gpu_seconds"] for r in rows), 3)
        return Response.json({"rows": rows, "total_gpu_seconds": total})

    # -- worker pool (time mode) -----------------------------------------------------------
    async def _worker(self, index: int) -> None:
        while True:
            job = self.jobs.get(await self._queue.get())
            if job is None or job.phase is not Phase.QUEUED:
                continue
            await asyncio.sleep(self.config.queue_s)
            if job.phase is not Phase.QUEUED:
                continue
            await self.model_server.ensure_loaded(job.data["model"], self._running_models())
            if job.phase is not Phase.QUEUED:
                continue
            job.data["worker"] = index
            self.lifecycle.start(job)
            render = asyncio.ensure_future(asyncio.to_thread(render_mp4, self._spec(job)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    job.done_event.wait(), job.data["gpu_seconds"] * self.config.speed
                )
            await render
            if not job.phase.terminal:
                self.lifecycle.finish(job)


def _canonical(body: Any) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def main(argv: list[str] | None = None) -> int:
    return run(SelfHostedEmulator, SelfHostedConfig, argv)


if __name__ == "__main__":
    raise SystemExit(main())
