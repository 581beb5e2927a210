"""The self-hosted GPU adapter: our internal job API (provider-apis.md §3.4, design 9.21).

``provider.options.backend: cog`` serves a Cog model server instead (`cog_adapter`).

The job API honours ``Idempotency-Key`` (the attempt's client request key), which makes two
things safe that are unsafe elsewhere:

* a submit REJECTED by the transport (DNS/connect/TLS: no byte sent) is retried once, with the
  same key, before the outcome is returned;
* recovery is a lookup by key (``GET /v1/jobs?idempotency_key=``): conclusive either way.

A callback URL, when given, is added to the body as ``webhook_url`` at submit time; it is
delivery metadata, not part of the compiled request (nor of its hash).

GetLoad reads ``GET /v1/load`` (the job API's load document: per served model its queue
length, warm/loading/cold state, cold-start seconds, GPU utilisation, VRAM, free slots and
ready replicas; see ``adapter_sidecars.emulators.selfhosted_load``) with the first account's
key and reports it under the capability model ids that serve each native model. A server
that cannot be read answers an empty report: load is a routing hint, never an error.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from adapter_sidecars.common import base
from adapter_sidecars.common.base import HttpAdapter, payload_of, unreadable, with_raw
from adapter_sidecars.common.config import Account, ConfigError, SidecarConfig
from adapter_sidecars.common.jobs import iso_z, parse_timestamp, scaled_int
from adapter_sidecars.common.recovery import settled
from adapter_sidecars.common.transport import HttpReply, utcnow
from adapter_sidecars.common.types import SubmitInput, UsageInput
from adapter_sidecars.selfhosted import compile as selfhosted_compile
from adapter_sidecars.selfhosted import mapping
from adapter_sidecars.selfhosted.cog_adapter import CogAdapter
from vidroute_core.adapter import (
    CancelResult,
    CompiledPlan,
    JobRef,
    LoadReport,
    ModelLoad,
    PollResult,
    RecoverQuery,
    RecoverResult,
    RecoveryVerdict,
    SubmitKind,
    SubmitOutcome,
    TransportStage,
    UsageRecord,
    UsageResult,
)
from vidroute_core.capabilities.loader import Capability
from vidroute_core.errors import ProviderError
from vidroute_core.hashing import canonical_json
from vidroute_core.spec import GenerationSpec

PACKAGE_DIR = Path(__file__).parent
log = logging.getLogger(__name__)
_NOT_SENT = frozenset({TransportStage.DNS, TransportStage.CONNECT, TransportStage.TLS})


class SelfHostedAdapter(HttpAdapter):
    """`ProviderAdapter` for the internal GPU job API."""

    name = "selfhosted"
    provider = "self_hosted"

    @classmethod
    def from_config(cls, config: SidecarConfig) -> SelfHostedAdapter:
        """Build with the packaged (or configured) capability files (backend ``jobs``)."""
        backend = config.provider_options.get("backend", "jobs")
        if backend != "jobs":
            raise ConfigError(f"backend {backend!r} is not the job API: use build_adapter")
        return cls(config, base.load_capabilities(config, PACKAGE_DIR, cls.provider))

    # -- hooks ---------------------------------------------------------------------------------
    def compile_native(self, spec: GenerationSpec, cap: Capability) -> CompiledPlan:
        return selfhosted_compile.build_request(spec, cap)

    def auth_headers(self, account: Account) -> dict[str, str]:
        return {"authorization": f"Bearer {account.credential.resolve().reveal()}"}

    def submit_headers(self, request: SubmitInput, account: Account) -> dict[str, str]:
        return {**self.auth_headers(account), "idempotency-key": request.client_request_key}

    def submit_body(self, request: SubmitInput) -> bytes:
        native = request.plan.native_request
        if not request.callback_url or native is None:
            return super().submit_body(request)
        return canonical_json({**native, "webhook_url": request.callback_url})

    def created_job(self, reply: HttpReply, plan: CompiledPlan) -> tuple[str, str] | None:
        body = payload_of(reply)
        job_id = body.get("id") if body else None
        if not isinstance(job_id, str) or not job_id or body is None:
            return None
        return job_id, str(body.get("status", ""))

    def submit_error(self, reply: HttpReply) -> SubmitOutcome:
        return mapping.submit_error(reply)

    def job_path(self, job: JobRef) -> str:
        return f"/v1/jobs/{job.provider_job_id}"

    def probe_path(self) -> str:
        return "/v1/health"

    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        """Send once; a transport failure before any byte left is retried once, same key."""
        account = self.check_plan(request.plan)
        outcome = await self.send_create(request, account)
        if outcome.kind is SubmitKind.REJECTED and outcome.transport_stage in _NOT_SENT:
            outcome = await self.send_create(request, account)
        return outcome

    def submit_budget_s(self) -> float:
        """The full create call plus the not-sent first try (pool + connect) it may retry."""
        t = self.config.timeouts
        return super().submit_budget_s() + t.pool + t.connect

    def _gpu_rate(self, account: str, model: str) -> tuple[int, int]:
        cap = self.entry(account, model)
        if cap is None:
            return 0, 0
        return cap.output_url_ttl_seconds, cap.commercial.micros_per_provider_unit

    def job_status(self, reply: HttpReply, job: JobRef) -> PollResult:
        if not reply.ok:
            return PollResult(error=mapping.http_error(reply))
        payload = payload_of(reply)
        if payload is None:
            return PollResult(error=unreadable(reply))
        ttl, rate = self._gpu_rate(job.account, job.model or str(payload.get("model", "")))
        status = mapping.job_status(
            payload, url_ttl_seconds=ttl, now=utcnow(), micros_per_gpu_second=rate
        )
        return PollResult(snapshot=with_raw(status, payload))

    # -- cancel --------------------------------------------------------------------------------
    async def cancel_job(self, job: JobRef) -> CancelResult:
        """DELETE the job; acknowledged when accepted, already terminal, or gone (404)."""
        reply = await self.call("DELETE", self.job_path(job), self.account(job.account))
        if isinstance(reply, ProviderError):
            return CancelResult(False, error=reply)
        if reply.status == 404:
            return CancelResult(True)
        if not reply.ok:
            return CancelResult(False, error=mapping.http_error(reply))
        return CancelResult(True)

    # -- recovery ------------------------------------------------------------------------------
    async def recover_submission(self, request: RecoverQuery) -> RecoverResult:
        """Look the attempt's key up: the job API stores every key it accepted."""
        method = "idempotency_key"
        account = self.account(request.account)
        reply = await self.call(
            "GET", "/v1/jobs", account, params={"idempotency_key": request.client_request_key}
        )
        if isinstance(reply, ProviderError):
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=method, error=reply)
        if not reply.ok:
            return RecoverResult(
                RecoveryVerdict.INCONCLUSIVE, method=method, error=mapping.http_error(reply)
            )
        body = payload_of(reply) or {}
        jobs = [j for j in body.get("jobs") or [] if isinstance(j, dict) and j.get("id")]
        if len(jobs) == 1:
            job = JobRef(str(jobs[0]["id"]), account.name, request.model)
            return RecoverResult(RecoveryVerdict.FOUND, method=method, job=job)
        if jobs:  # one key, several jobs: the server broke its own contract
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=f"{method}: {len(jobs)} jobs")
        if not settled(request.submitted_before, self.config, utcnow()):
            # A request still in flight (or queued in the server's accept backlog) may create
            # the job after this lookup: NOT_FOUND now would license a fail-over (9.17.5).
            return RecoverResult(
                RecoveryVerdict.INCONCLUSIVE, method=f"{method}: window not settled"
            )
        return RecoverResult(RecoveryVerdict.NOT_FOUND, method=method)

    # -- load ----------------------------------------------------------------------------------
    async def get_load(self) -> LoadReport:
        """The model server's ``GET /v1/load``, per capability model; empty when unreadable."""
        account = self.config.accounts[0]
        reply = await self.call("GET", "/v1/load", account)
        body = None if isinstance(reply, ProviderError) or not reply.ok else payload_of(reply)
        if body is None:
            why = reply.message if isinstance(reply, ProviderError) else f"HTTP {reply.status}"
            log.info("model server load not readable: %s", why)
            return LoadReport()
        served: dict[str, list[str]] = {}
        for cap in self.capabilities:
            served.setdefault(str(cap.native.get("model", cap.model)), []).append(cap.model)
        models: list[ModelLoad] = []
        for row in body.get("models") or []:
            if not isinstance(row, dict):
                continue
            for model in dict.fromkeys(served.get(str(row.get("model")), [])):
                models.append(mapping.model_load(model, row))
        return LoadReport(tuple(models), parse_timestamp(body.get("observed_at")))

    # -- usage ---------------------------------------------------------------------------------
    async def list_usage(self, request: UsageInput) -> UsageResult:
        """GPU seconds per finished job in the window."""
        account = self.account(request.account)
        reply = await self.call(
            "GET",
            "/v1/usage",
            account,
            params={"start": iso_z(request.start), "end": iso_z(request.end)},
        )
        if isinstance(reply, ProviderError):
            return UsageResult(error=reply)
        if not reply.ok:
            return UsageResult(error=mapping.http_error(reply))
        rows = (payload_of(reply) or {}).get("rows") or []
        return UsageResult(
            tuple(self._record(account.name, r) for r in rows if isinstance(r, dict))
        )

    def _record(self, account: str, row: dict[str, Any]) -> UsageRecord:
        model = str(row.get("model") or "")
        milli = scaled_int(row.get("gpu_seconds"), 1000)
        _, rate = self._gpu_rate(account, model)
        # The cluster's chargeback money when the row carries it, else GPU seconds x our rate.
        cost = (
            scaled_int(row["cost_micros"], 1)
            if row.get("cost_micros") is not None
            else scaled_int(f"{milli}e-3", rate)
        )
        return UsageRecord(
            model=model,
            usage_time=parse_timestamp(row.get("finished_at")) or utcnow(),
            provider_milliunits=milli,
            provider_unit="gpu_seconds",
            cost_micros=cost,
            currency="USD",
            raw_json=json.dumps(row, sort_keys=True, separators=(",", ":")),
            provider_job_id=str(row.get("job_id") or ""),
            client_request_key=str(row.get("idempotency_key") or ""),
        )


def build_adapter(config: SidecarConfig) -> SelfHostedAdapter | CogAdapter:
    """The configured backend (``provider.options.backend``): ``jobs`` (the job API above, the
    default) or ``cog`` (a Cog model server, `adapter_sidecars.selfhosted.cog_adapter`)."""
    backend = config.provider_options.get("backend", "jobs")
    if backend == "cog":
        return CogAdapter.from_config(config, PACKAGE_DIR)
    if backend != "jobs":
        raise ConfigError(f"provider.options.backend must be cog or jobs, not {backend!r}")
    return SelfHostedAdapter.from_config(config)
