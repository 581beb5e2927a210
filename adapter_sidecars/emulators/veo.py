"""Google Veo emulator: the Gemini API surface (§2.1) and the Vertex AI surface (§2.2).

Requests are read the way Google's front end reads them: field names in lowerCamelCase or
snake_case alike (``google-genai`` sends ``webhookConfig: {"uris", "user_metadata"}``, §5).
Generated files are named by https URIs of Google's shape
(``https://generativelanguage.googleapis.com/v1beta/files/{id}:download?alt=media``): a client
downloads them through its own base URL, as ``files.download`` of ``google-genai`` does (it
takes only the id from an https URI), so the loopback http emulator serves them at
``/v1beta/files/{id}:download``.

Emulator extensions (constructed, not Google APIs), off unless named in
``VeoConfig.extensions`` (see README.md): ``operation_list`` serves
``GET /v1beta/models/{m}/operations?filter=`` (operations with their request bodies), and
``billing_export`` serves ``GET /v1beta/__billing/usage?start=&end=`` (billed seconds per
operation). Google has no public Veo usage API; the export models one cost line per operation
as a Cloud Billing export (BigQuery) would show it once labelled by operation: seconds and USD,
no request id or client key, so reconciliation can tie a line to a job only by its operation
name, or by account + model + time window + amount. Standalone:
``python -m adapter_sidecars.emulators.veo``.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote

from google.auth import exceptions as auth_exceptions
from google.auth import jwt

from adapter_sidecars.emulators import veo_schema as vs
from adapter_sidecars.emulators.core import Emulator, EmulatorConfig, parse_time
from adapter_sidecars.emulators.faults import FaultRule
from adapter_sidecars.emulators.http import Request, Response
from adapter_sidecars.emulators.jobs import Job, Phase, iso
from adapter_sidecars.emulators.media import MediaSpec, fit_size, render_mp4
from adapter_sidecars.emulators.runner import main as run

GEMINI_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.PredictLongRunningResponse"
VERTEX_TYPE = "type.googleapis.com/cloud.ai.large_models.vision.GenerateVideoResponse"
TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
VERTEX_BASE = "/{version}/projects/{project}/locations/{location}/publishers/google/models/{model}"
DEFAULT_PRICES = {
    "veo-3.1-generate-preview": 0.40,
    "veo-3.1-generate-001": 0.40,
    "veo-3.0-generate-001": 0.40,
    "veo-3.1-fast-generate-preview": 0.15,
    "veo-3.1-fast-generate-001": 0.15,
    "veo-3.0-fast-generate-001": 0.15,
    "veo-2.0-generate-001": 0.35,
}


@dataclass(frozen=True)
class VeoConfig(EmulatorConfig):
    """Veo emulator settings (plus everything in `EmulatorConfig`).

    api_key: required x-goog-api-key ("" accepts any non-empty key). vertex_token: Bearer token
    for the Vertex surface ("" accepts any). models: the model matrix (see veo_schema).
    usd_per_second: billing export prices. retention_s: how long generated files download.
    rpm_limit / rpd_limit: per-model requests per minute / per day (0 = unlimited).
    files_origin: scheme and host put into generated file URIs (Google's by default).
    service_accounts: client_email -> public key PEM of the service-account keys whose signed
    assertions ``POST /token`` (the OAuth 2 token endpoint) exchanges for access tokens valid
    ``token_ttl_s``. With service accounts or a vertex_token, Vertex and Cloud Storage calls need
    one of those tokens; with neither, any non-empty bearer token passes.
    extensions: {"operation_list", "billing_export"} serve the emulator-only listing and billing
    export (off by default: the real Gemini API has neither).
    """

    api_key: str = ""
    vertex_token: str = ""
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: dict(vs.DEFAULT_MODELS))
    usd_per_second: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    retention_s: float = 2 * 86400.0
    rpm_limit: int = 0
    rpd_limit: int = 0
    files_origin: str = "https://generativelanguage.googleapis.com"
    service_accounts: Mapping[str, str] = field(default_factory=dict)
    token_ttl_s: float = 3600.0


class VeoEmulator(Emulator):
    """Speaks the Gemini (`generativelanguage`) and Vertex (`aiplatform`) Veo APIs at `self.url`."""

    name = "veo"
    config: VeoConfig
    EXTENSIONS: ClassVar[Mapping[str, str]] = {
        "operation_list": "GET /v1beta/models/{m}/operations?filter= (with request bodies)",
        "billing_export": "GET /v1beta/__billing/usage?start=&end= (billed seconds per operation)",
    }

    #: The billing export is USD per operation: no unit conversion to falsify.
    USAGE_FAULTS: ClassVar[frozenset[str]] = frozenset(
        {"orphan", "duplicate", "price", "charge_failed"}
    )

    def __init__(self, config: VeoConfig | None = None) -> None:
        super().__init__(config or VeoConfig())
        self._submits: dict[str, list[float]] = defaultdict(list)
        self._files: dict[str, tuple[Job, float]] = {}
        #: Cloud Storage objects Vertex wrote: (bucket, object) -> (job, sample); None: deleted.
        self._objects: dict[tuple[str, str], tuple[Job, int] | None] = {}
        #: Access tokens the token endpoint issued -> (client_email, expiry).
        self._tokens: dict[str, tuple[str, float]] = {}

    def install_routes(self) -> None:
        r = self.router
        r.add("POST", "/v1beta/models/{model}:predictLongRunning", self._gemini_submit)
        r.add("GET", "/v1beta/models/{model}/operations/{op}", self._gemini_poll)
        if self.extension("operation_list"):
            r.add("GET", "/v1beta/models/{model}/operations", self._gemini_list)
        r.add("GET", "/v1beta/files/{file}:download", self._download)
        if self.extension("billing_export"):
            r.add("GET", "/v1beta/__billing/usage", self._billing)
        for version in ("v1", "v1beta1"):
            base = VERTEX_BASE.replace("{version}", version)
            r.add("POST", base + ":predictLongRunning", self._vertex_submit)
            r.add("POST", base + ":fetchPredictOperation", self._vertex_poll)
            r.add("GET", f"/{version}/publishers/google/models/{{model}}", self._vertex_model)
        # Other Google hosts this emulator stands in for (oauth2 / storage.googleapis.com).
        r.add("POST", "/token", self._token)
        r.add("GET", "/storage/v1/b/{bucket}/o/{object}", self._gcs_object)

    # -- hooks -----------------------------------------------------------------------------
    def raw_status(self, job: Job) -> str:
        if job.phase is Phase.FAILED and job.failure and _is_rai(job.failure[0]):
            return "FILTERED"
        return {Phase.QUEUED: "PENDING", Phase.RUNNING: "RUNNING"}.get(job.phase, job.phase.name)

    def error_response(
        self, code: int, retry_after: float | None, rule: FaultRule | None
    ) -> Response:
        headers = [("retry-after", str(int(retry_after)))] if retry_after is not None else []
        if code == 429:
            per = str(rule.params.get("quota", "minute")) if rule else "minute"
            retry = (
                retry_after
                if retry_after is not None
                else (30.0 if per == "minute" else 8 * 3600.0)
            )
            if rule is not None and "/projects/" in rule.route:
                return vs.vertex_quota_error("veo", per).response(headers)
            return vs.quota_error("veo", per, 10, retry).response(headers)
        message = {
            404: "Requested entity was not found.",
            503: "The service is currently unavailable.",
        }
        return vs.GoogleError(code, message.get(code, vs.CANONICAL.get(code, "Error"))).response(
            headers
        )

    def callback_payload(self, job: Job) -> Any:
        op = self.operation_json(job)
        if job.data.get("user_metadata") is not None:
            op["userMetadata"] = job.data["user_metadata"]
        return op

    def on_job_changed(self, job: Job) -> None:
        if job.phase is Phase.SUCCEEDED and job.data.get("storage_uri"):
            for sample, uri in enumerate(self._gcs_uris(job)):
                bucket, _, obj = uri.removeprefix("gs://").partition("/")
                self._objects[(bucket, obj)] = (job, sample)
        if job.phase is Phase.SUCCEEDED:
            for file_id in job.data["files"]:
                self._files[file_id] = (
                    job,
                    (job.finished_at or time.time()) + self.config.retention_s,
                )

    def on_reset(self) -> None:
        self._submits.clear()
        self._files.clear()
        self._objects.clear()

    # -- shapes ----------------------------------------------------------------------------
    def operation_json(self, job: Job, expire: bool = False) -> dict[str, Any]:
        op: dict[str, Any] = {"name": job.id, "done": job.phase.terminal}
        if not job.phase.terminal:
            return op
        if job.phase is Phase.CANCELLED:
            op["error"] = {"code": 1, "message": "Operation was cancelled."}
        elif job.phase is Phase.FAILED and job.failure:
            code, message = job.failure
            if _is_rai(code):
                op["response"] = self._response(
                    job, {"raiMediaFilteredCount": 1, "raiMediaFilteredReasons": [message]}
                )
            else:
                numeric = int(code) if code.isdigit() else vs.RPC_CODES.get(code, 13)
                op["error"] = {"code": numeric, "message": message}
        elif job.data["surface"] == "gemini":
            if expire:
                for file_id in job.data["files"]:
                    self._files[file_id] = (job, time.time() - 1)
            origin = self.config.files_origin.rstrip("/")
            samples = [
                {"video": {"uri": f"{origin}/v1beta/files/{f}:download?alt=media"}}
                for f in job.data["files"]
            ]
            op["response"] = self._response(job, {"generatedSamples": samples})
        else:
            op["response"] = self._response(
                job, {"raiMediaFilteredCount": 0, "videos": self._videos(job)}
            )
        return op

    def _response(self, job: Job, payload: dict[str, Any]) -> dict[str, Any]:
        if job.data["surface"] == "gemini":
            return {"@type": GEMINI_TYPE, "generateVideoResponse": payload}
        return {"@type": VERTEX_TYPE, **payload}

    def _gcs_uris(self, job: Job) -> list[str]:
        """Where Vertex writes the samples of a job with a storageUri."""
        storage = str(job.data["storage_uri"]).rstrip("/")
        op_id = job.id.rsplit("/", 1)[1]
        return [f"{storage}/{op_id}/sample_{i}.mp4" for i in range(len(job.data["files"]))]

    def _videos(self, job: Job) -> list[dict[str, Any]]:
        if job.data.get("storage_uri"):
            return [{"gcsUri": uri, "mimeType": "video/mp4"} for uri in self._gcs_uris(job)]
        return [
            {
                "bytesBase64Encoded": base64.b64encode(render_mp4(self._spec(job, i))).decode(),
                "mimeType": "video/mp4",
            }
            for i in range(len(job.data["files"]))
        ]

    def _spec(self, job: Job, sample: int = 0) -> MediaSpec:
        """The clip of one sample: with sampleCount > 1 each is a different video, as Veo
        renders each sample with its own seed (the first is the prompt's own clip)."""
        w, h = job.data["size"]
        prompt = job.data["prompt"] if sample == 0 else f"{job.data['prompt']} #sample{sample}"
        return MediaSpec(prompt, job.data["duration"], w, h, 24)

    # -- submit ----------------------------------------------------------------------------
    def _rate_limit(self, model: str, gemini: bool) -> vs.GoogleError | None:
        now, stamps = time.time(), self._submits[model]
        stamps[:] = [t for t in stamps if now - t < 86400]
        if self.config.rpd_limit and len(stamps) >= self.config.rpd_limit:
            if not gemini:
                return vs.vertex_quota_error(model, "day")
            return vs.quota_error(model, "day", self.config.rpd_limit, stamps[0] + 86400 - now)
        minute = [t for t in stamps if now - t < 60]
        if self.config.rpm_limit and len(minute) >= self.config.rpm_limit:
            if not gemini:
                return vs.vertex_quota_error(model)
            return vs.quota_error(model, "minute", self.config.rpm_limit, minute[0] + 60 - now)
        return None

    async def _submit(self, request: Request, name_prefix: str, gemini: bool) -> Response:
        model = request.params["model"]
        try:
            body = request.json()
        except ValueError:
            return vs.GoogleError(400, "Invalid JSON payload received.").response()
        try:
            models = dict(self.config.models)
            parsed = vs.validate(model, models, vs.camel_keys(body), gemini=gemini)
            limited = self._rate_limit(model, gemini)
            if limited:
                raise limited
        except vs.GoogleError as exc:
            return exc.response()
        self._submits[model].append(time.time())
        ratio = (16, 9) if parsed.aspect_ratio == "16:9" else (9, 16)
        data = {
            "model": model,
            "surface": "gemini" if gemini else "vertex",
            "prompt": parsed.prompt,
            "duration": float(parsed.duration_s),
            "size": fit_size(*ratio, self.config.media_max_side),
            "files": [secrets.token_hex(8) for _ in range(parsed.samples)],
            "storage_uri": parsed.storage_uri,
            "user_metadata": parsed.user_metadata,
            "labels": parsed.labels,
        }
        op_id = secrets.token_hex(6) if gemini else secrets.token_hex(16)
        job = Job(
            f"{name_prefix}/operations/{op_id}",
            f"POST {request.path}",
            body,
            data=data,
            callback_urls=parsed.webhook_uris,
        )
        self.new_job(request, job)
        if job.faults.callback_before_response:
            self.lifecycle.start(job)
            await self.send_callback_now(job)
        return Response.json({"name": job.id})

    async def _gemini_submit(self, request: Request) -> Response:
        if (denied := self._gemini_auth(request)) is not None:
            return denied
        return await self._submit(request, f"models/{request.params['model']}", gemini=True)

    async def _vertex_submit(self, request: Request) -> Response:
        if (denied := self._vertex_auth(request)) is not None:
            return denied
        p = request.params
        prefix = (
            f"projects/{p['project']}/locations/{p['location']}"
            f"/publishers/google/models/{p['model']}"
        )
        return await self._submit(request, prefix, gemini=False)

    # -- poll ------------------------------------------------------------------------------
    async def _poll(self, request: Request, name: str) -> Response:
        job = self.jobs.get(name)
        if job is None:
            return vs.GoogleError(404, f"Operation {name} not found.").response()
        override = self.observe(request, job)
        if override is not None and not job.phase.terminal:
            return Response.json({"name": job.id, "done": False, "metadata": {"state": override}})
        expire = job.phase is Phase.SUCCEEDED and self.consume_expiry(job)
        if expire and job.data.get("storage_uri"):
            # A bucket lifecycle rule (or someone) deleted the outputs.
            for key, entry in list(self._objects.items()):
                if entry is not None and entry[0] is job:
                    self._objects[key] = None
        if job.phase is Phase.SUCCEEDED and job.data["surface"] == "vertex":
            await asyncio.to_thread(render_mp4, self._spec(job))  # warm the cache off the loop
        return Response.json(self.operation_json(job, expire))

    async def _gemini_poll(self, request: Request) -> Response:
        if (denied := self._gemini_auth(request)) is not None:
            return denied
        return await self._poll(
            request, f"models/{request.params['model']}/operations/{request.params['op']}"
        )

    async def _vertex_poll(self, request: Request) -> Response:
        if (denied := self._vertex_auth(request)) is not None:
            return denied
        try:
            name = str((request.json() or {})["operationName"])
        except (ValueError, KeyError, TypeError):
            return vs.GoogleError(400, "operationName is required.").response()
        return await self._poll(request, name)

    async def _gemini_list(self, request: Request) -> Response:
        if (denied := self._gemini_auth(request)) is not None:
            return denied
        prefix = f"models/{request.params['model']}/operations/"
        keep = _parse_filter(request.query.get("filter", ""))
        ops = []
        for job in self.jobs.values():
            if job.id.startswith(prefix) and keep(job):
                op = self.operation_json(job)
                op["metadata"] = {"createTime": iso(job.created_at), "request": job.body}
                ops.append(op)
        return Response.json({"operations": ops, "nextPageToken": ""})

    # -- files and billing -----------------------------------------------------------------
    async def _download(self, request: Request) -> Response:
        if (denied := self._gemini_auth(request)) is not None:
            return denied
        entry = self._files.get(request.params["file"])
        if entry is None or entry[1] < time.time():
            return vs.GoogleError(404, "File not found or no longer available.").response()
        job = entry[0]
        sample = job.data["files"].index(request.params["file"])
        url = self.media_url(self._spec(job, sample))
        return Response.empty(302, [("location", url)])

    async def _billing(self, request: Request) -> Response:
        if (denied := self._gemini_auth(request)) is not None:
            return denied
        start = parse_time(request.query.get("start"), 0.0)
        end = parse_time(request.query.get("end"), float("inf"))
        rows = []
        for job in self.jobs.values():
            billed = job.phase is Phase.SUCCEEDED or (
                job.phase.terminal and self.usage_fault("charge_failed", job.id) is not None
            )
            if billed and job.finished_at and start <= job.finished_at < end:
                seconds = job.data["duration"] * len(job.data["files"])
                price = self.config.usd_per_second.get(job.data["model"], 0.0)
                if (fault := self.usage_fault("price", job.id)) is not None:
                    price = float(fault["unit_price"])
                row = {
                    "operation": job.id,
                    "model": job.data["model"],
                    "billedSeconds": seconds,
                    "usd": round(seconds * price, 4),
                    "usageTime": iso(job.finished_at),
                }
                rows.extend([row, dict(row)] if self.billed_twice(job.id) else [row])
        for c in self.usage_charges:
            if start <= c["at"] < end:
                seconds = float(c.get("seconds", 0))
                usd = c.get(
                    "usd", seconds * self.config.usd_per_second.get(str(c.get("model")), 0.0)
                )
                rows.append(
                    {
                        "operation": c.get("ref"),
                        "model": c.get("model"),
                        "billedSeconds": seconds,
                        "usd": round(float(usd), 4),
                        "usageTime": iso(c["at"]),
                    }
                )
        return Response.json({"rows": rows})

    async def _vertex_model(self, request: Request) -> Response:
        """The publisher model (what a health probe reads)."""
        if (denied := self._vertex_auth(request)) is not None:
            return denied
        model = request.params["model"]
        if model not in self.config.models:
            return vs.GoogleError(404, f"Publisher Model `{model}` not found.").response()
        return Response.json({"name": f"publishers/google/models/{model}"})

    # -- OAuth 2 token endpoint and Cloud Storage -------------------------------------------
    async def _token(self, request: Request) -> Response:
        """RFC 7523 JWT bearer grant: verify the assertion's RS256 signature against the
        service account's public key, its audience (Google's token endpoint URL, whatever
        host serves it, as google-auth signs it), lifetime and scope."""
        form = dict(parse_qsl(request.body.decode("utf-8", "replace")))
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return _oauth_error("unsupported_grant_type", "Invalid grant_type: ")
        assertion = form.get("assertion", "")
        try:
            claims = jwt.decode(assertion, verify=False)  # type: ignore[no-untyped-call]  # unannotated
        except (ValueError, auth_exceptions.GoogleAuthError):
            return _oauth_error("invalid_grant", "Invalid JWT: malformed.")
        email = str(claims.get("iss") or "")
        public = self.config.service_accounts.get(email)
        if public is None:
            return _oauth_error("invalid_grant", "Invalid grant: account not found", 400)
        try:
            jwt.decode(assertion, certs=public, audience=TOKEN_AUDIENCE)  # type: ignore[no-untyped-call]  # unannotated
        except (ValueError, auth_exceptions.GoogleAuthError) as exc:
            text = str(exc)
            why = (
                "Invalid JWT Signature." if "signature" in text.lower() else f"Invalid JWT: {text}"
            )
            return _oauth_error("invalid_grant", why)
        lifetime = int(claims.get("exp", 0)) - int(claims.get("iat", 0))
        if lifetime > 3600 or lifetime <= 0:
            return _oauth_error(
                "invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes)"
            )
        if "https://www.googleapis.com/auth/cloud-platform" not in str(claims.get("scope", "")):
            return _oauth_error("invalid_scope", "Invalid OAuth scope or ID token audience.")
        token = "ya29.emu-" + secrets.token_urlsafe(24)
        self._tokens[token] = (email, time.time() + self.config.token_ttl_s)
        ttl = max(1, int(self.config.token_ttl_s) - 1)
        return Response.json({"access_token": token, "expires_in": ttl, "token_type": "Bearer"})

    async def _gcs_object(self, request: Request) -> Response:
        """Cloud Storage JSON API: object metadata, or its bytes with ``alt=media``."""
        if (denied := self._vertex_auth(request, gcs=True)) is not None:
            return denied
        bucket, obj = request.params["bucket"], unquote(request.params["object"])
        entry = self._objects.get((bucket, obj))
        if entry is None:
            return _gcs_error(404, f"No such object: {bucket}/{obj}", "notFound")
        job, sample = entry
        spec = self._spec(job, sample)
        if request.query.get("alt") != "media":
            return Response.json(
                {
                    "kind": "storage#object",
                    "bucket": bucket,
                    "name": obj,
                    "contentType": "video/mp4",
                    "size": str(len(await asyncio.to_thread(render_mp4, spec))),
                }
            )
        data = await asyncio.to_thread(render_mp4, spec)
        return Response(200, data, [("content-type", "video/mp4")])

    # -- auth ------------------------------------------------------------------------------
    def _gemini_auth(self, request: Request) -> Response | None:
        key = request.header("x-goog-api-key") or request.query.get("key")
        if not key:
            return vs.GoogleError(
                403,
                "Method doesn't allow unregistered callers (callers without "
                "established identity). Please use API Key.",
            ).response()
        if self.config.api_key and key != self.config.api_key:
            info = {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
            return vs.GoogleError(
                400, "API key not valid. Please pass a valid API key.", [info]
            ).response()
        return None

    def _vertex_auth(self, request: Request, gcs: bool = False) -> Response | None:
        auth = request.header("authorization") or ""
        token = auth[7:] if auth.startswith("Bearer ") else ""
        if not self._token_ok(token):
            if gcs:
                return _gcs_error(401, "Invalid Credentials", "authError")
            return vs.GoogleError(
                401,
                "Request had invalid authentication credentials. Expected OAuth 2 access token.",
            ).response()
        return None

    def _token_ok(self, token: str) -> bool:
        if not token:
            return False
        if self.config.vertex_token and token == self.config.vertex_token:
            return True
        issued = self._tokens.get(token)
        if issued is not None:
            return issued[1] > time.time()
        return not self.config.vertex_token and not self.config.service_accounts


def _oauth_error(error: str, description: str, status: int = 400) -> Response:
    """The token endpoint's error shape (RFC 6749 §5.2), as Google's answers it."""
    return Response.json({"error": error, "error_description": description}, status)


def _gcs_error(code: int, message: str, reason: str) -> Response:
    """Cloud Storage JSON API errors: the legacy ``errors[]`` list beside code/message."""
    errors = [{"message": message, "domain": "global", "reason": reason}]
    return Response.json({"error": {"code": code, "message": message, "errors": errors}}, code)


def _is_rai(code: str) -> bool:
    return code.upper() in ("RAI", "RAI_FILTERED", "FILTERED")


_CLAUSE = re.compile(r"^\s*(createTime|done)\s*(>=|<=|>|<|=)\s*\"?([^\"]*)\"?\s*$")


def _parse_filter(text: str) -> Any:
    """Tiny AIP-160 subset: clauses on createTime (>,>=,<,<=) and done (=), joined by AND."""
    checks = []
    for clause in filter(None, re.split(r"\s+AND\s+", text.strip())):
        match = _CLAUSE.match(clause)
        if match is None:
            continue
        field_name, op, value = match.groups()
        checks.append((field_name, op, value))

    def keep(job: Job) -> bool:
        for field_name, op, value in checks:
            if field_name == "done":
                if job.phase.terminal != (value.lower() == "true"):
                    return False
                continue
            t, bound = job.created_at, parse_time(value, 0.0)
            ok = {
                ">": t > bound,
                ">=": t >= bound,
                "<": t < bound,
                "<=": t <= bound,
                "=": t == bound,
            }[op]
            if not ok:
                return False
        return True

    return keep


def main(argv: list[str] | None = None) -> int:
    return run(VeoEmulator, VeoConfig, argv)


if __name__ == "__main__":
    raise SystemExit(main())
