"""The self-hosted adapter over Cog's prediction protocol (provider-apis.md §3.5, design 9.21).

``provider.options.backend: cog`` selects it. What a Cog server offers decides every rule here:

* Submit: ``PUT /predictions/{client request key}`` with ``Prefer: respond-async`` and a
  ``webhook`` pointing at this sidecar (`cog_webhooks`). The PUT is idempotent only while the
  prediction runs: the same PUT after it finished starts a SECOND GPU run. So the adapter
  declares no idempotency key (the submit journal then never re-sends an UNKNOWN key) and
  never PUTs a key twice itself. 202 is ACCEPTED (job id = the key); 409 is every slot busy,
  nothing created (PROVIDER_OVERLOADED, code NO_CAPACITY); a ``failed`` answer before setup
  finished is the same; 422 is INVALID_INPUT; other 5xx may have started it: UNKNOWN.
* GetJob: Cog has no GET by id (405), so the answer comes from the webhook journal. Without a
  terminal webhook the prediction reads as its last webhook said (``starting``: QUEUED,
  ``processing``: RUNNING) while the server could still be running it. Once it cannot (the
  server is idle and has one slot, or ``max_prediction_seconds`` passed since the acceptance,
  or since the journal began for a prediction it never heard of) and no terminal webhook came
  within ``webhook_grace_seconds``, the outcome is lost:
  the poll answers JOB_NOT_FOUND and the control plane's lost-job rule applies (polls on, then
  ABANDONED without a new submit; a terminal webhook that arrives late is still read).
* Cancel: ``POST /predictions/{id}/cancel``; 404 (already finished or unknown) is acknowledged.
* Recovery: only the journal can tell (a webhook for the key proves the prediction exists);
  otherwise INCONCLUSIVE, never NOT_FOUND and never a probing PUT.
* Servers: a Cog server serves one predictor, so each capability model names the server that
  serves it (``servers: {model: URL}``; the rest use ``provider.base_url``). Submit, GetJob's
  idle test and cancel go to the job's model's server.
* Health and load: ``GET /health-check`` READY/BUSY is reachable (the sidecar is ready while
  any of its servers is). GetLoad reads every server's ``/health-check`` once and reports it for
  each model that server serves: READY has a free slot, BUSY has none (coglet says BUSY only
  once every slot runs, and answers 409 then, so the next request waits about one run). A
  server that does not answer is left out of the report: no evidence, not an error.
* Usage: ``metrics.predict_time`` of terminal webhooks, as GPU seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from adapter_sidecars.common import base, transport
from adapter_sidecars.common.base import OUTPUT_CHUNK_BYTES, HttpAdapter, payload_of
from adapter_sidecars.common.compiling import finish, resolve
from adapter_sidecars.common.config import Account, ConfigError, SidecarConfig
from adapter_sidecars.common.transport import utcnow
from adapter_sidecars.common.types import (
    FetchOutputInput,
    InvalidRequest,
    MalformedPlan,
    SubmitInput,
    UsageInput,
)
from adapter_sidecars.selfhosted import cog_mapping as mapping
from adapter_sidecars.selfhosted.cog_journal import PredictionJournal
from adapter_sidecars.selfhosted.cog_webhooks import WebhookReceiver
from vidroute_core.adapter import (
    CancelResult,
    CompiledPlan,
    JobRef,
    JobSnapshot,
    LoadReport,
    ModelLoad,
    OutputChunk,
    PollResult,
    RecoverQuery,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    UsageRecord,
    UsageResult,
)
from vidroute_core.capabilities.loader import Capability
from vidroute_core.errors import ErrorClass, ProviderError, make_error
from vidroute_core.spec import GenerationSpec

ENDPOINT = "PUT /predictions/{id}"
#: The events the sidecar asks for: when it started and how it ended (no per-output copies).
WEBHOOK_EVENTS = ("start", "completed")
RECOVERY_METHOD = "cog_webhook_journal"
#: Where outputs held in the journal are addressed (under the webhook receiver's URL).
OUTPUTS_PATH = "/cog/outputs"


class CogAdapter(HttpAdapter):
    """`ProviderAdapter` for a Cog model server (see the module docstring)."""

    name = "selfhosted"
    provider = "self_hosted"

    def __init__(
        self,
        config: SidecarConfig,
        capabilities: list[Capability],
        *,
        journal: PredictionJournal,
        receiver: WebhookReceiver,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(config, [_as_cog(c) for c in capabilities], client)
        self.journal = journal
        self.receiver = receiver
        options = config.provider_options
        self.servers = _servers(options.get("servers"), {c.model for c in self.capabilities})
        scale = config.time_scale
        self.slots = int(options.get("slots", 1))
        self.webhook_grace_s = float(options.get("webhook_grace_seconds", 30 * scale))
        self.max_prediction_s = float(options.get("max_prediction_seconds", 3600 * scale))
        self.cancel_confirm_s = float(options.get("cancel_confirm_seconds", 5 * scale))
        extra = options.get("extra_input") or {}
        self.extra_input: dict[str, Any] = dict(extra) if isinstance(extra, dict) else {}

    @classmethod
    def from_config(cls, config: SidecarConfig, package_dir: Path) -> CogAdapter:
        """Journal (beside the submit journal when that is a file) and receiver from config."""
        options = config.provider_options
        path = options.get("prediction_journal")
        if not path and config.submit_journal_path is not None:
            path = config.submit_journal_path.with_name(
                config.submit_journal_path.name + ".cog-webhooks"
            )
        journal = PredictionJournal(
            retention_s=config.submit_journal_retention_s, path=Path(path) if path else None
        )
        account = config.accounts[0]
        receiver = WebhookReceiver(
            journal,
            str(options.get("webhook_listen", "127.0.0.1:0")),
            token=lambda: account.credential.resolve().reveal(),
            public_url=str(options.get("webhook_url", "")),
        )
        capabilities = base.load_capabilities(config, package_dir, cls.provider)
        return cls(config, capabilities, journal=journal, receiver=receiver)

    async def start(self) -> None:
        """Serve the webhook receiver (called by the sidecar server before it serves gRPC)."""
        await self.receiver.start()

    async def aclose(self) -> None:
        await self.receiver.stop()
        await super().aclose()

    # -- compile -------------------------------------------------------------------------------
    def compile_native(self, spec: GenerationSpec, cap: Capability) -> CompiledPlan:
        resolved, draft = resolve(spec, cap)
        model_input: dict[str, Any] = {
            "prompt": spec.prompt,
            "duration_s": resolved.duration_seconds,
            "resolution": resolved.resolution,
            "aspect_ratio": resolved.aspect_ratio,
        }
        if resolved.negative_prompt:
            model_input["negative_prompt"] = resolved.negative_prompt
        if spec.first_frame is not None:
            model_input["image"] = spec.first_frame.object_uri
        if resolved.seed is not None:
            model_input["seed"] = resolved.seed
        return finish(draft, resolved, endpoint=ENDPOINT, native_request={"input": model_input})

    def auth_headers(self, account: Account) -> dict[str, str]:
        return {}  # a Cog server has no auth of its own; it sits behind the cluster's network

    def probe_path(self) -> str:
        return "/health-check"

    # -- submit --------------------------------------------------------------------------------
    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        """One PUT, never repeated (see the module docstring)."""
        plan = request.plan
        if plan.provider != self.provider or not plan.submittable or plan.native_request is None:
            return await super().submit(request)  # the base refuses it with MalformedPlan
        if plan.endpoint != ENDPOINT:
            raise MalformedPlan(f"plan endpoint {plan.endpoint!r} is not {ENDPOINT!r}")
        account = self.account(plan.account)
        key = request.client_request_key
        native = dict(plan.native_request)
        body = {
            "input": {**dict(native.get("input") or {}), **self.extra_input},
            "webhook": self.receiver.webhook_url(key),
            "webhook_events_filter": list(WEBHOOK_EVENTS),
        }
        http_request = self.client.build_request(
            "PUT",
            f"{self.server(plan.model)}/predictions/{key}",
            # Plain JSON, not canonical_json: a model's inputs may be floats (the plan's own
            # native request stays canonical; this adds only delivery metadata and extra_input).
            content=json.dumps(body, sort_keys=True, separators=(",", ":")).encode(),
            headers={"content-type": "application/json", "prefer": "respond-async"},
            timeout=self.submit_timeout,
        )
        result = await transport.send_submit(self.client, http_request)
        if isinstance(result, SubmitOutcome):
            return result
        outcome = mapping.submit_reply(result, key)
        if outcome is None:
            return transport.unknown_response(result, "no prediction id in the response body")
        if outcome.kind is SubmitKind.ACCEPTED:
            self.journal.accepted(key, plan.model)
            job = JobRef(key, account=account.name, model=plan.model)
            return replace(outcome, job=job)
        return outcome

    # -- jobs ----------------------------------------------------------------------------------
    async def get_job(self, job: JobRef) -> PollResult:
        """From the webhook journal (Cog has no GET by id)."""
        if not job.provider_job_id:
            raise InvalidRequest("job.provider_job_id is required")
        self.account(job.account)
        record = self.journal.get(job.provider_job_id)
        if record is not None and record.payload is not None and record.terminal:
            return PollResult(snapshot=self._snapshot(job, record.payload))
        health = await self._health(self.server(job.model))
        if isinstance(health, ProviderError):
            return PollResult(error=health)
        now = utcnow()
        # Unknown here (a memory journal restarted, a file lost): silent since the journal began.
        since = (record.accepted_at or record.first_at) if record else self.journal.started_at
        if self._cannot_be_running(health, since, now):
            return PollResult(error=mapping.outcome_lost(job.provider_job_id, health))
        payload = record.payload if record and record.payload else {"status": "starting"}
        return PollResult(snapshot=self._snapshot(job, payload))

    def _cannot_be_running(self, health: str, since: datetime, now: datetime) -> bool:
        age = (now - since).total_seconds()
        if age < self.webhook_grace_s:
            return False  # a terminal webhook may still be on its way (coglet retries it)
        idle = health == "READY" and self.slots == 1
        return idle or age > self.max_prediction_s

    def _snapshot(self, job: JobRef, payload: dict[str, Any]) -> JobSnapshot:
        cap = self.entry(job.account, job.model)
        rate = cap.commercial.micros_per_provider_unit if cap else 0
        public = mapping.public_payload(payload, self.receiver.url + OUTPUTS_PATH)
        ttl = self.journal.retention_s
        return mapping.snapshot(public, micros_per_gpu_second=rate, output_ttl_s=ttl, now=utcnow())

    def server(self, model: str) -> str:
        """The base URL of the Cog server that serves capability `model`."""
        return self.servers.get(model, self.config.base_url).rstrip("/")

    async def _health(self, server: str) -> str | ProviderError:
        """`server`'s ``/health-check`` status (READY, BUSY, STARTING, SETUP_FAILED, ...)."""
        reply = await self.call("GET", f"{server}/health-check", self.config.accounts[0])
        if isinstance(reply, ProviderError):
            return reply
        body = payload_of(reply)
        if not reply.ok or body is None:
            return mapping.http_error(reply)
        return str(body.get("status", ""))

    async def cancel_job(self, job: JobRef) -> CancelResult:
        """POST cancel; a 404 (finished or unknown to the server) is acknowledged."""
        reply = await self.call(
            "POST",
            f"{self.server(job.model)}/predictions/{job.provider_job_id}/cancel",
            self.account(job.account),
        )
        if isinstance(reply, ProviderError):
            return CancelResult(False, error=reply)
        if reply.status == 404:
            return CancelResult(True)
        if not reply.ok:
            return CancelResult(False, error=mapping.http_error(reply))
        # coglet stops the run and reports it by webhook; wait briefly for that word, so a
        # GetJob right after the cancel reads what the server did (canceled, or its real end).
        deadline = time.monotonic() + self.cancel_confirm_s
        while time.monotonic() < deadline:
            record = self.journal.get(job.provider_job_id)
            if record is not None and record.payload is not None and record.terminal:
                return CancelResult(True, snapshot=self._snapshot(job, record.payload))
            await asyncio.sleep(0.02)
        return CancelResult(True)

    async def recover_submission(self, request: RecoverQuery) -> RecoverResult:
        """A webhook for the key proves the prediction; nothing can prove its absence."""
        record = self.journal.get(request.client_request_key)
        if record is not None and (record.webhooks or record.accepted_at):
            account = self.account(request.account)
            job = JobRef(request.client_request_key, account.name, request.model)
            return RecoverResult(RecoveryVerdict.FOUND, method=RECOVERY_METHOD, job=job)
        return RecoverResult(
            RecoveryVerdict.INCONCLUSIVE,
            method=f"{RECOVERY_METHOD}: no webhook; Cog cannot be searched",
        )

    # -- health and load -----------------------------------------------------------------------
    async def probe(self) -> bool:
        """Serving while any server is (a model whose server is down fails on its own)."""
        try:
            statuses = await self._statuses()
        except Exception:  # a probe must never take the sidecar down
            return False
        return any(s in ("READY", "BUSY") for s in statuses.values())

    async def get_load(self) -> LoadReport:
        """Each server's ``/health-check``, read once, as the load of every model it serves."""
        statuses = await self._statuses()
        models: dict[str, ModelLoad] = {}
        for cap in self.capabilities:
            health = statuses.get(self.server(cap.model))
            if isinstance(health, str) and cap.model not in models:
                models[cap.model] = mapping.model_load(cap.model, health, cap)
        return LoadReport(tuple(models.values()), utcnow())

    async def _statuses(self) -> dict[str, str | ProviderError]:
        servers = sorted({self.server(c.model) for c in self.capabilities})
        answers = await asyncio.gather(*(self._health(s) for s in servers))
        return dict(zip(servers, answers, strict=True))

    # -- outputs and usage ---------------------------------------------------------------------
    async def fetch_output(self, request: FetchOutputInput) -> AsyncIterator[OutputChunk]:
        """Stream an output the journal decoded from a webhook (``.../cog/outputs/id/n``).

        Nothing goes over the network, so no credential can leak; any other URI is refused."""
        self.account(request.job.account)
        try:
            url = httpx.URL(request.uri)
        except (httpx.InvalidURL, TypeError):
            raise InvalidRequest("output uri is not a URL") from None
        match = mapping.OUTPUT_PATH.fullmatch(url.path)
        if url.scheme not in ("http", "https") or match is None:
            raise InvalidRequest("output uri is not an output this sidecar's journal holds")
        found = self.journal.output(match.group(1), int(match.group(2)))
        if found is None:
            yield OutputChunk(
                error=make_error(
                    ErrorClass.OUTPUT_EXPIRED, "OUTPUT_EXPIRED", "the journal no longer holds it"
                )
            )
            return
        mime, data = found
        limit = request.max_bytes if request.max_bytes > 0 else base.DEFAULT_OUTPUT_MAX_BYTES
        if len(data) > limit:
            yield OutputChunk(error=base.too_large(f"{len(data)} bytes exceed {limit}"))
            return
        for start in range(0, max(len(data), 1), OUTPUT_CHUNK_BYTES):
            part = data[start : start + OUTPUT_CHUNK_BYTES]
            yield OutputChunk(part, mime, len(data)) if start == 0 else OutputChunk(part)

    async def list_usage(self, request: UsageInput) -> UsageResult:
        """GPU seconds (``predict_time``) of the predictions that ended in the window."""
        account = self.account(request.account)
        rows: list[UsageRecord] = []
        for pid, record in self.journal.finished_between(request.start, request.end):
            payload = record.payload or {}
            seconds = mapping.predict_time(payload)
            cap = self.entry(request.account or account.name, record.model) or next(
                iter(self.capabilities), None
            )
            rate = cap.commercial.micros_per_provider_unit if cap else 0
            rows.append(
                UsageRecord(
                    model=record.model or (cap.model if cap else ""),
                    usage_time=record.received_at or utcnow(),
                    provider_milliunits=round(seconds * 1000),
                    provider_unit="gpu_seconds",
                    cost_micros=round(seconds * rate),
                    currency="USD",
                    raw_json=json.dumps({"id": pid, "metrics": payload.get("metrics")}),
                    provider_job_id=pid,
                    client_request_key=pid,
                )
            )
        return UsageResult(tuple(rows))


def _servers(value: Any, models: set[str]) -> dict[str, str]:
    """``provider.options.servers`` checked: capability model -> its Cog server's http(s) URL."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("provider.options.servers must map capability models to Cog URLs")
    out: dict[str, str] = {}
    for model, url in value.items():
        if model not in models:
            raise ConfigError(f"provider.options.servers names {model!r}, not a capability model")
        parsed = httpx.URL(str(url)) if isinstance(url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigError(f"provider.options.servers.{model} must be an http(s) URL")
        out[str(model)] = str(url).rstrip("/")
    return out


def _as_cog(cap: Capability) -> Capability:
    """What a Cog server really offers the control plane: cancel; no idempotency key (a PUT
    is idempotent only while the prediction runs), no search, no callback to the control
    plane's ingress (the server calls this sidecar back; the control plane polls GetJob), and
    usage from the journal (each completed webhook's `metrics.predict_time`)."""
    ops = replace(
        cap.operations,
        callback=False,
        cancellation=True,
        client_idempotency_key=False,
        task_search=False,
        usage_records=True,
    )
    return replace(cap, operations=ops)
