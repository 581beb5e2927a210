"""The Veo adapter, Gemini API surface (``generativelanguage.googleapis.com``, §2.1).

Veo has no cancel and no idempotency key. An UNKNOWN submit is recovered through the
emulator's operations listing (``GET /v1beta/models/{m}/operations?filter=createTime...``,
which returns each operation's request) by exact request match; without the listing the
verdict is INCONCLUSIVE. Usage comes from the emulator's billing export of billed seconds.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from adapter_sidecars.common import base
from adapter_sidecars.common.base import HttpAdapter, payload_of, unreadable, with_raw
from adapter_sidecars.common.config import Account, SidecarConfig
from adapter_sidecars.common.jobs import iso_z, parse_timestamp
from adapter_sidecars.common.recovery import match_listing, settled
from adapter_sidecars.common.transport import HttpReply, utcnow
from adapter_sidecars.common.types import (
    CancelResult,
    JobRef,
    JobResult,
    Plan,
    RecoverInput,
    RecoverResult,
    RecoveryVerdict,
    SubmitOutcome,
    UsageInput,
    UsageRecord,
    UsageResult,
)
from adapter_sidecars.veo import compile as veo_compile
from adapter_sidecars.veo import mapping
from controlplane.capabilities.loader import Capability
from controlplane.domain.errors import ErrorClass, ProviderError, make_error
from controlplane.domain.spec import GenerationSpec

PACKAGE_DIR = Path(__file__).parent
API = "/v1beta"


class VeoAdapter(HttpAdapter):
    """`ProviderAdapter` for Veo on the Gemini API."""

    name = "veo"
    provider = "google"

    @classmethod
    def from_config(cls, config: SidecarConfig) -> VeoAdapter:
        """Build with the packaged (or configured) capability files."""
        return cls(config, base.load_capabilities(config, PACKAGE_DIR, cls.provider))

    # -- hooks ---------------------------------------------------------------------------------
    def compile_native(self, spec: GenerationSpec, cap: Capability) -> Plan:
        return veo_compile.build_request(spec, cap)

    def auth_headers(self, account: Account) -> dict[str, str]:
        return {"x-goog-api-key": account.credential.resolve().reveal()}

    def created_job(self, reply: HttpReply, plan: Plan) -> tuple[str, str] | None:
        body = payload_of(reply)
        name = body.get("name") if body else None
        if not isinstance(name, str) or "/operations/" not in name:
            return None
        return name, "DONE" if body and body.get("done") else "RUNNING"

    def submit_error(self, reply: HttpReply) -> SubmitOutcome:
        return mapping.submit_error(reply)

    def job_path(self, job: JobRef) -> str:
        return f"{API}/{job.provider_job_id}"

    def probe_path(self) -> str:
        model = self.capabilities[0].model if self.capabilities else "veo"
        return f"{API}/models/{model}/operations/probe"

    def _ttl(self, job: JobRef) -> int:
        model = job.model or job.provider_job_id.split("/")[1]
        cap = self.entry(job.account, model)
        return cap.output_url_ttl_seconds if cap else 0

    def job_status(self, reply: HttpReply, job: JobRef) -> JobResult:
        if not reply.ok:
            return JobResult(error=mapping.http_error(reply))
        op = payload_of(reply)
        if op is None:
            return JobResult(error=unreadable(reply))
        status = mapping.operation_status(op, url_ttl_seconds=self._ttl(job), now=utcnow())
        return JobResult(status=with_raw(status, op))

    # -- cancel --------------------------------------------------------------------------------
    async def cancel_job(self, job: JobRef) -> CancelResult:
        """Veo cannot cancel: acknowledged only when the operation already ended."""
        result = await self.get_job(job)
        if result.status is not None and result.status.state.terminal:
            return CancelResult(True, status=result.status)
        error = result.error or make_error(
            ErrorClass.UNSUPPORTED_CAPABILITY,
            "CANCEL_UNSUPPORTED",
            "Veo operations cannot be cancelled; the job will run to completion",
        )
        return CancelResult(False, status=result.status, error=error)

    # -- recovery ------------------------------------------------------------------------------
    async def recover_submission(self, request: RecoverInput) -> RecoverResult:
        """Search the model's operations in the window for the plan's exact request."""
        method = "operation_search"
        plan = request.plan
        if plan is None or plan.native_request is None:
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, f"{method}: no plan to match")
        account = self.account(request.account)
        now = utcnow()
        after = (request.submitted_after or now - timedelta(days=1)) - timedelta(minutes=1)
        before = (request.submitted_before or now) + timedelta(
            seconds=self.config.timeouts.submit_read + 60
        )
        model = plan.endpoint.rsplit("/", 1)[-1].split(":", 1)[0]
        reply = await self.call(
            "GET",
            f"{API}/models/{model}/operations",
            account,
            params={"filter": f'createTime>="{iso_z(after)}" AND createTime<"{iso_z(before)}"'},
        )
        if isinstance(reply, ProviderError):
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method, error=reply)
        if reply.status in (404, 405, 501):
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, f"{method}: listing unavailable")
        if not reply.ok:
            return RecoverResult(
                RecoveryVerdict.INCONCLUSIVE, method, error=mapping.http_error(reply)
            )
        body = payload_of(reply) or {}
        ops = body.get("operations")
        items = [
            {"name": op.get("name"), "request": (op.get("metadata") or {}).get("request")}
            for op in ops or []
            if isinstance(op, dict)
        ]
        complete = isinstance(ops, list) and not body.get("nextPageToken")
        verdict, name = match_listing(
            items,
            plan.native_request,
            request_key="request",
            id_key="name",
            complete=complete and settled(request.submitted_before, self.config, now),
        )
        job = JobRef(name, account.name, request.model) if name else None
        return RecoverResult(verdict, method, job=job)

    # -- usage ---------------------------------------------------------------------------------
    async def list_usage(self, request: UsageInput) -> UsageResult:
        """Billed seconds per operation (billing export)."""
        account = self.account(request.account)
        reply = await self.call(
            "GET",
            f"{API}/__billing/usage",
            account,
            params={"start": iso_z(request.start), "end": iso_z(request.end)},
        )
        if isinstance(reply, ProviderError):
            return UsageResult(error=reply)
        if not reply.ok:
            return UsageResult(error=mapping.http_error(reply))
        rows = (payload_of(reply) or {}).get("rows") or []
        return UsageResult(tuple(_record(r) for r in rows if isinstance(r, dict)))


def _record(row: dict[str, Any]) -> UsageRecord:
    seconds = float(row.get("billedSeconds") or 0)
    return UsageRecord(
        model=str(row.get("model") or ""),
        usage_time=parse_timestamp(row.get("usageTime")) or utcnow(),
        provider_milliunits=round(seconds * 1000),
        provider_unit="billed_seconds",
        cost_micros=round(float(row.get("usd") or 0) * 1_000_000),
        currency="USD",
        raw_json=json.dumps(row, sort_keys=True, separators=(",", ":")),
        provider_job_id=str(row.get("operation") or ""),
    )
