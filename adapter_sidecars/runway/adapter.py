"""The Runway adapter: tasks API over httpx (provider-apis.md §1, §5).

Runway has no client idempotency key and no task listing (§5), so against the real API an
UNKNOWN submit cannot be searched for: RecoverSubmission answers INCONCLUSIVE and says why, and
Describe declares ``task_search: false``. With ``provider.options.task_listing: true`` (for the
emulator's ``task_listing`` extension, ``GET /v1/tasks?createdAfter=&createdBefore=``, which
returns each task's request body) the adapter declares ``task_search`` and matches the plan's
native request exactly. The verdict is NOT_FOUND only when the listing is complete, the window
has settled (a request still in flight at Runway could yet create a task) and nothing matches.

Inputs from the platform's object store (``provider.options.platform_store``, `runway.inputs`):
Submit uploads each ``s3://`` input through Runway's uploads and sends the ``runway://`` URI. When
Runway refuses the create because it could not fetch an input (400, ASSET_UNAVAILABLE: a 400
proves no task was created) and an input is a presigned URL of that store, Submit signs a fresh
URL and sends the create once more (`may_retry_after_fix`, design 9.9.1): the same attempt, one
provider task at most. A task listing match then compares requests without their image URIs,
since what Runway recorded (``runway://``, the fresh signature) is not the plan's URI.

Usage (``POST /v1/organization/usage``) is daily credit totals per model: its records carry no
provider job id, because a day's total identifies no job.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from adapter_sidecars.common import base
from adapter_sidecars.common.base import HttpAdapter, payload_of, unreadable, with_raw
from adapter_sidecars.common.config import Account, SidecarConfig
from adapter_sidecars.common.jobs import iso_z, parse_timestamp, scaled_int
from adapter_sidecars.common.options import option_flag, with_task_search
from adapter_sidecars.common.recovery import match_listing, settled
from adapter_sidecars.common.transport import HttpReply, rejected, utcnow
from adapter_sidecars.common.types import SubmitInput, UsageInput
from adapter_sidecars.runway import compile as runway_compile
from adapter_sidecars.runway import inputs, mapping
from vidroute_core.adapter import (
    CancelResult,
    CompiledPlan,
    JobRef,
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
from vidroute_core.errors import ProviderError, may_retry_after_fix
from vidroute_core.hashing import canonical_json
from vidroute_core.spec import GenerationSpec

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).parent
DEFAULT_API_VERSION = "2024-11-06"
#: RecoverSubmission's method when nothing can be searched (the real Runway).
NO_SEARCH = (
    "task_search unsupported: Runway has no task listing or request lookup "
    "(provider.options.task_listing is off), so an unknown submit cannot be proven either way"
)


class RunwayAdapter(HttpAdapter):
    """`ProviderAdapter` for ``api.dev.runwayml.com``."""

    name = "runway"
    provider = "runway"

    def __init__(
        self,
        config: SidecarConfig,
        capabilities: Sequence[Capability],
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(config, capabilities, client)
        #: The platform's object store whose inputs Submit uploads or re-signs (None: none).
        self.store = inputs.PlatformStore.from_options(config.provider_options)
        #: Hosts Runway cannot reach whose inputs Submit downloads and uploads.
        self.private = inputs.PrivateHosts.from_options(config.provider_options)

    def submit_budget_s(self) -> float:
        """With a platform store: reading and uploading inputs, and one re-sent create."""
        one = super().submit_budget_s()
        if self.store is None and not self.private.hosts:
            return one
        t = self.config.timeouts
        return 2 * one + 3 * (t.pool + t.connect + t.write + t.read)

    @classmethod
    def from_config(cls, config: SidecarConfig) -> RunwayAdapter:
        """Build with the packaged (or configured) capability files; ``task_listing`` on
        declares the task search it enables."""
        caps = base.load_capabilities(config, PACKAGE_DIR, cls.provider)
        if option_flag(config, "task_listing"):
            caps = with_task_search(caps)
        return cls(config, caps)

    @property
    def task_listing(self) -> bool:
        """Whether the provider offers the emulator's task listing (never the real Runway)."""
        return option_flag(self.config, "task_listing")

    # -- hooks ---------------------------------------------------------------------------------
    def compile_native(self, spec: GenerationSpec, cap: Capability) -> CompiledPlan:
        return runway_compile.build_request(spec, cap, self._stored)

    def _stored(self, uri: str) -> bool:
        return self.store is not None and self.store.key_of_s3(uri) is not None

    def _rewritten(self, uri: str) -> bool:
        """Whether Submit may send another URI than the plan's for this input."""
        resignable = self.store is not None and self.store.key_of_url(uri) is not None
        return self._stored(uri) or resignable or self.private.holds(uri)

    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        """Upload store inputs, send the create; after a fetch refusal, re-sign and send once
        more (module docstring). Without a platform store: the create call, once."""
        account = self.check_plan(request.plan)
        store, native = self.store, request.plan.native_request
        if (store is None and not self.private.hosts) or native is None:
            return await self.send_create(request, account)
        body = await self._uploaded(native, account)
        if isinstance(body, ProviderError):
            return rejected(body, None)  # nothing was sent to create a task
        outcome = await self.send_create(_with_body(request, body), account)
        if outcome.kind is not SubmitKind.REJECTED or outcome.error is None or store is None:
            return outcome
        fixed = await _resigned(store, body)
        if not may_retry_after_fix(outcome.error, repaired=fixed is not body):
            return outcome
        log.info(
            "submit %s: Runway could not fetch an input (%s); re-signed, sending once more",
            request.client_request_key,
            outcome.error.code,
        )
        return await self.send_create(_with_body(request, fixed), account)

    async def _uploaded(
        self, body: Mapping[str, Any], account: Account
    ) -> Mapping[str, Any] | ProviderError:
        """`body` with each input Runway cannot fetch (an ``s3://`` object of the store, a URL
        on a private host) replaced by its upload's URI."""
        uploaded: dict[str, str] = {}
        for item in inputs.image_slots(body):
            uri = item["uri"]
            key = self.store.key_of_s3(uri) if self.store is not None else None
            if uri in uploaded or (key is None and not self.private.holds(uri)):
                continue
            if self.store is not None and key is not None:
                stored = await self.store.read(key)
            else:
                stored = await inputs.download(uri, self.private.max_bytes, self.client.timeout)
            if isinstance(stored, ProviderError):
                return stored
            runway_uri = await inputs.upload(self.client, self.auth_headers(account), stored)
            if isinstance(runway_uri, ProviderError):
                return runway_uri
            uploaded[uri] = runway_uri
        if not uploaded:
            return body
        return inputs.with_uris(body, lambda uri: uploaded.get(uri, uri))

    def auth_headers(self, account: Account) -> dict[str, str]:
        headers = {
            "authorization": f"Bearer {account.credential.resolve().reveal()}",
            "x-runway-version": str(
                self.config.provider_options.get("api_version", DEFAULT_API_VERSION)
            ),
        }
        on_behalf_of = account.options.get("on_behalf_of")
        if on_behalf_of:
            headers["x-runway-on-behalf-of"] = str(on_behalf_of)
        return headers

    def created_job(self, reply: HttpReply, plan: CompiledPlan) -> tuple[str, str] | None:
        body = payload_of(reply)
        job_id = body.get("id") if body else None
        if not isinstance(job_id, str) or not job_id:
            return None
        return job_id, str(body.get("status", "")) if body else ""

    def submit_error(self, reply: HttpReply) -> SubmitOutcome:
        return mapping.submit_error(reply)

    def job_path(self, job: JobRef) -> str:
        return f"/v1/tasks/{job.provider_job_id}"

    def probe_path(self) -> str:
        return "/v1/organization"

    def _ttl(self, account: str, model: str) -> int:
        cap = self.entry(account, model)
        return cap.output_url_ttl_seconds if cap else 86400

    def job_status(self, reply: HttpReply, job: JobRef) -> PollResult:
        # A 404 never reaches this hook: `HttpAdapter.get_job` reports it as JOB_NOT_FOUND
        # (Runway deletes a task on DELETE, but it also answers 404 for a task it lost).
        if not reply.ok:
            return PollResult(error=mapping.http_error(reply))
        task = payload_of(reply)
        if task is None:
            return PollResult(error=unreadable(reply))
        status = mapping.task_status(
            task, url_ttl_seconds=self._ttl(job.account, job.model), now=utcnow()
        )
        cap = self.entry(job.account, job.model)
        if cap is not None:
            status = mapping.with_cost(status, task, cap.commercial)
        return PollResult(snapshot=with_raw(status, task))

    # -- cancel --------------------------------------------------------------------------------
    async def cancel_job(self, job: JobRef) -> CancelResult:
        """DELETE the task unless it already finished; 204 and 404 count as acknowledged.

        Runway's DELETE also deletes a finished task and its outputs, so a cancel racing a
        success would destroy the real outcome (9.18.3): look first, and leave terminal tasks.
        """
        account = self.account(job.account)
        current = await self.get_job(job)
        if current.snapshot is not None and current.snapshot.state.terminal:
            return CancelResult(True, snapshot=current.snapshot)
        reply = await self.call("DELETE", self.job_path(job), account)
        if isinstance(reply, ProviderError):
            return CancelResult(False, error=reply)
        if reply.status in (200, 202, 204, 404):
            return CancelResult(True)
        return CancelResult(False, error=mapping.http_error(reply))

    # -- recovery ------------------------------------------------------------------------------
    async def recover_submission(self, request: RecoverQuery) -> RecoverResult:
        """Search the account's tasks in the submit window for the plan's exact request."""
        method = "task_search"
        if not self.task_listing:
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=NO_SEARCH)
        if request.plan is None or request.plan.native_request is None:
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=f"{method}: no plan to match")
        account = self.account(request.account)
        now = utcnow()
        after = (request.submitted_after or now - timedelta(days=1)) - timedelta(minutes=1)
        before = (request.submitted_before or now) + timedelta(
            seconds=self.config.timeouts.submit_read + 60
        )
        reply = await self.call(
            "GET",
            "/v1/tasks",
            account,
            params={"createdAfter": iso_z(after), "createdBefore": iso_z(before)},
        )
        if isinstance(reply, ProviderError):
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=method, error=reply)
        if reply.status in (404, 405):
            return RecoverResult(
                RecoveryVerdict.INCONCLUSIVE, method=f"{method}: listing unavailable"
            )
        if not reply.ok:
            return RecoverResult(
                RecoveryVerdict.INCONCLUSIVE, method=method, error=mapping.http_error(reply)
            )
        body = payload_of(reply) or {}
        tasks = body.get("data")
        complete = isinstance(tasks, list) and body.get("hasMore") is False
        listed, wanted = tasks if isinstance(tasks, list) else [], request.plan.native_request
        if any(self._rewritten(i["uri"]) for i in inputs.image_slots(wanted)):
            # Runway recorded the upload's URI or a fresh signature, never the plan's URI.
            listed = [_without_images(t) for t in listed]
            wanted = inputs.with_uris(wanted, lambda _: "<input>")
        verdict, task_id = match_listing(
            listed,
            wanted,
            request_key="request",
            id_key="id",
            complete=complete and settled(request.submitted_before, self.config, now),
        )
        job = JobRef(task_id, account=account.name, model=request.model) if task_id else None
        return RecoverResult(verdict, method=method, job=job)

    # -- usage ---------------------------------------------------------------------------------
    async def list_usage(self, request: UsageInput) -> UsageResult:
        """Daily credit usage per model; credits -> milliunits and micros."""
        account = self.account(request.account)
        before = request.end.date() + (timedelta(days=1) if _has_time(request.end) else timedelta())
        reply = await self.call(
            "POST",
            "/v1/organization/usage",
            account,
            json_body={
                "startDate": request.start.date().isoformat(),
                "beforeDate": before.isoformat(),
            },
        )
        if isinstance(reply, ProviderError):
            return UsageResult(error=reply)
        if not reply.ok:
            return UsageResult(error=mapping.http_error(reply))
        body = payload_of(reply) or {}
        records: list[UsageRecord] = []
        for day in body.get("results") or []:
            when = (
                parse_timestamp(f"{day.get('date')}T00:00:00Z") if isinstance(day, dict) else None
            )
            if when is None:
                continue
            for used in day.get("usedCredits") or []:
                records.append(self._usage_record(account.name, when, used))
        return UsageResult(tuple(records))

    def _usage_record(self, account: str, when: datetime, used: dict[str, Any]) -> UsageRecord:
        """One model's credits on one day: an aggregate, so no provider job id (it names no
        job, and recovery must never adopt it as one)."""
        model = str(used.get("model", ""))
        milli = scaled_int(used.get("amount", 0), 1000)
        cap = self.entry(account, model)
        micros_per_credit = cap.commercial.micros_per_provider_unit if cap else 10_000
        currency = cap.commercial.currency if cap else "USD"
        return UsageRecord(
            provider_job_id="",  # a daily aggregate names no job
            model=model,
            usage_time=when,
            provider_milliunits=milli,
            provider_unit="credits",
            # credits x micros per credit, in integers (half-even on a fraction of a credit)
            cost_micros=scaled_int(f"{milli}e-3", micros_per_credit),
            currency=currency,
            raw_json=json.dumps(used, sort_keys=True, separators=(",", ":")),
        )


def _with_body(request: SubmitInput, body: Mapping[str, Any]) -> SubmitInput:
    if body is request.plan.native_request:
        return request
    wire = canonical_json(body).decode("utf-8")
    return replace(
        request, plan=replace(request.plan, native_request=body, native_request_json=wire)
    )


async def _resigned(store: inputs.PlatformStore, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """`body` with a fresh signature on every URL of the store (`body` itself if none).

    Signing is local, but boto3 may first resolve credentials (a metadata service): a thread."""
    fresh: dict[str, str] = {}
    for item in inputs.image_slots(body):
        key = store.key_of_url(item["uri"])
        if key is not None and item["uri"] not in fresh:
            fresh[item["uri"]] = await asyncio.to_thread(store.presign, key)
    return inputs.with_uris(body, lambda uri: fresh.get(uri, uri)) if fresh else body


def _without_images(task: Any) -> Any:
    """A listed task whose recorded request has its image URIs masked."""
    if not isinstance(task, dict) or not isinstance(task.get("request"), dict):
        return task
    return {**task, "request": inputs.with_uris(task["request"], lambda _: "<input>")}


def _has_time(when: datetime) -> bool:
    return (when.hour, when.minute, when.second, when.microsecond) != (0, 0, 0, 0)
