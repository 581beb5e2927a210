"""The Veo adapter, Gemini API surface (``generativelanguage.googleapis.com``, §2.1).

Submit inlines the plan's image references as base64 bytes first (`assets.resolve_body`); an
asset that cannot be fetched or fails its checks is REJECTED before any byte reaches Google.

Veo has no cancel, no idempotency key, no operations listing and no usage API on the Gemini
surface (provider-apis.md §5): against the real API an UNKNOWN submit is INCONCLUSIVE (said so
in the method), ListUsage answers UNSUPPORTED_CAPABILITY, and Describe declares
``task_search: false``. Two sidecar options, off by default, use the emulator's extensions
instead: ``provider.options.operation_list: true`` searches
``GET /v1beta/models/{m}/operations?filter=createTime...`` (each operation's request as sent,
images as bytes) and declares ``task_search``; a listed request matches when its non-image
fields equal the plan's and each image's (SHA-256, mimeType) is what Submit sent for the plan's
reference (`_match`). ``provider.options.billing_export: true`` reads usage from the
emulator's billing export of billed seconds per operation.

Generated files are Google https URIs (``https://generativelanguage.googleapis.com/v1beta/
files/{id}:download?alt=media``). Like ``files.download`` of ``google-genai``, FetchOutput keeps
only the file id and downloads it through the configured base URL, so the API key goes only to
the provider endpoint this sidecar is configured for.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
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
from adapter_sidecars.common.types import FetchOutputInput, SubmitInput, UsageInput
from adapter_sidecars.veo import assets, mapping
from adapter_sidecars.veo import compile as veo_compile
from vidroute_core.adapter import (
    CancelResult,
    CompiledPlan,
    JobRef,
    OutputChunk,
    PollResult,
    RecoverQuery,
    RecoverResult,
    RecoveryVerdict,
    SubmitOutcome,
    UsageRecord,
    UsageResult,
)
from vidroute_core.capabilities.loader import Capability
from vidroute_core.errors import ErrorClass, ProviderError, make_error
from vidroute_core.hashing import canonical_json
from vidroute_core.spec import GenerationSpec

PACKAGE_DIR = Path(__file__).parent
API = "/v1beta"
#: RecoverSubmission's method when nothing can be searched (the real Gemini API).
NO_SEARCH = (
    "operation_search unsupported: the Gemini API has no operations listing "
    "(provider.options.operation_list is off), so an unknown submit cannot be proven either way"
)
NO_USAGE = make_error(
    ErrorClass.UNSUPPORTED_CAPABILITY,
    "USAGE_UNSUPPORTED",
    "the Gemini API has no usage export (provider.options.billing_export is off)",
)
#: The file id of a Gemini file URI, as google-genai's `t_file_name` reads it.
_FILE_ID = re.compile(r"/files/([a-z0-9]+)")


class VeoAdapter(HttpAdapter):
    """`ProviderAdapter` for Veo on the Gemini API."""

    name = "veo"
    provider = "google"

    def __init__(
        self,
        config: SidecarConfig,
        capabilities: Sequence[Capability],
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(config, capabilities, client)
        #: ``provider.options.asset_max_bytes`` / ``asset_fetch_timeout_seconds`` (optional).
        self.asset_limits = assets.AssetLimits.from_options(config.provider_options)

    def submit_budget_s(self) -> float:
        """The create call plus the asset fetch that precedes it inside Submit."""
        return super().submit_budget_s() + self.asset_limits.fetch_timeout_s

    @classmethod
    def from_config(cls, config: SidecarConfig) -> VeoAdapter:
        """Build with the packaged (or configured) capability files; ``operation_list`` on
        declares the task search it enables."""
        caps = base.load_capabilities(config, PACKAGE_DIR, cls.provider)
        if option_flag(config, "operation_list"):
            caps = with_task_search(caps)
        return cls(config, caps)

    # -- hooks ---------------------------------------------------------------------------------
    def compile_native(self, spec: GenerationSpec, cap: Capability) -> CompiledPlan:
        return veo_compile.build_request(spec, cap)

    def auth_headers(self, account: Account) -> dict[str, str]:
        return {"x-goog-api-key": account.credential.resolve().reveal()}

    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        """Inline the image assets, then send the create call once (design 9.17.3).

        Fetching happens before the create request exists, so an unusable asset (unreachable,
        not an image, too large, checksum mismatch) is REJECTED with nothing sent."""
        account = self.check_plan(request.plan)
        plan = request.plan
        native = plan.native_request
        assert native is not None  # check_plan refuses plans without a body
        body = await assets.resolve_body(self.client, native, self.asset_limits)
        if isinstance(body, ProviderError):
            return rejected(body, None)
        if body is not native:
            wire = canonical_json(body).decode("utf-8")
            plan = replace(plan, native_request=body, native_request_json=wire)
            request = replace(request, plan=plan)
        return await self.send_create(request, account)

    def created_job(self, reply: HttpReply, plan: CompiledPlan) -> tuple[str, str] | None:
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

    def job_status(self, reply: HttpReply, job: JobRef) -> PollResult:
        if not reply.ok:
            return PollResult(error=mapping.http_error(reply))
        op = payload_of(reply)
        if op is None:
            return PollResult(error=unreadable(reply))
        status = mapping.operation_status(op, url_ttl_seconds=self._ttl(job), now=utcnow())
        return PollResult(snapshot=with_raw(status, op))

    # -- outputs -------------------------------------------------------------------------------
    async def fetch_output(self, request: FetchOutputInput) -> AsyncIterator[OutputChunk]:
        """Download a Gemini file by its id through the configured base URL (see the module
        docstring); any other URI goes the generic way (provider origin only)."""
        local = self.local_file_uri(request.uri)
        if local is not None:
            request = replace(request, uri=local)
        async for part in super().fetch_output(request):
            yield part

    def local_file_uri(self, uri: str) -> str | None:
        """``{base_url}/v1beta/files/{id}:download?alt=media`` for a Gemini https file URI."""
        if not uri.startswith("https://") or not mapping.is_gemini_file(uri):
            return None
        match = _FILE_ID.search(httpx.URL(uri).path)
        if match is None:
            return None
        return f"{self.config.base_url}{API}/files/{match.group(1)}:download?alt=media"

    # -- cancel --------------------------------------------------------------------------------
    async def cancel_job(self, job: JobRef) -> CancelResult:
        """Veo cannot cancel: acknowledged only when the operation already ended."""
        result = await self.get_job(job)
        if result.snapshot is not None and result.snapshot.state.terminal:
            return CancelResult(True, snapshot=result.snapshot)
        error = result.error or make_error(
            ErrorClass.UNSUPPORTED_CAPABILITY,
            "CANCEL_UNSUPPORTED",
            "Veo operations cannot be cancelled; the job will run to completion",
        )
        return CancelResult(False, snapshot=result.snapshot, error=error)

    # -- recovery ------------------------------------------------------------------------------
    async def recover_submission(self, request: RecoverQuery) -> RecoverResult:
        """Search the model's operations in the window for the plan's exact request."""
        method = "operation_search"
        if not option_flag(self.config, "operation_list"):
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=NO_SEARCH)
        plan = request.plan
        if plan is None or plan.native_request is None:
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=f"{method}: no plan to match")
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
            return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=method, error=reply)
        if reply.status in (404, 405, 501):
            return RecoverResult(
                RecoveryVerdict.INCONCLUSIVE, method=f"{method}: listing unavailable"
            )
        if not reply.ok:
            return RecoverResult(
                RecoveryVerdict.INCONCLUSIVE, method=method, error=mapping.http_error(reply)
            )
        body = payload_of(reply) or {}
        ops = body.get("operations")
        items = [
            {"name": op.get("name"), "request": (op.get("metadata") or {}).get("request")}
            for op in ops or []
            if isinstance(op, dict)
        ]
        complete = isinstance(ops, list) and not body.get("nextPageToken")
        verdict, name = await self._match(
            items,
            plan.native_request,
            complete=complete and settled(request.submitted_before, self.config, now),
        )
        job = JobRef(name, account.name, request.model) if name else None
        return RecoverResult(verdict, method=method, job=job)

    async def _match(
        self, items: Sequence[Mapping[str, Any]], native: Mapping[str, Any], *, complete: bool
    ) -> tuple[RecoveryVerdict, str]:
        """Find the listed operation whose request is what a Submit of `native` sent.

        Without images that is exact equality. With images, the provider recorded bytes where
        the plan has references, so a listed request is a *candidate* when everything but the
        images equals the plan, and a *match* when each image also has the fingerprint Submit
        sent (`assets.expected_fingerprint`). When every expected fingerprint is exact (inline
        bytes, ``data:`` URI, or a checksum Submit enforced) matches decide as usual: one is
        FOUND, none in a complete settled listing is NOT_FOUND. Otherwise (a reference without a
        checksum, re-fetched now or unreachable) the bytes sent are not known for sure: NOT_FOUND
        only when not even a candidate exists, FOUND only when the one candidate matches the
        re-fetched bytes, else INCONCLUSIVE.
        """
        slots = list(assets.image_slots(native))
        if not slots:
            return match_listing(
                items, native, request_key="request", id_key="name", complete=complete
            )
        limits = self.asset_limits
        expected = await asyncio.gather(
            *(
                assets.expected_fingerprint(self.client, path, container[key], limits)
                for path, container, key in slots
            )
        )
        want = _comparable(assets.skeleton(native))
        candidates: list[str] = []
        matches: list[str] = []
        for item in items:
            name, sent = item.get("name"), item.get("request")
            if not isinstance(name, str) or not name or not isinstance(sent, Mapping):
                continue
            if _comparable(assets.skeleton(sent)) != want:
                continue
            candidates.append(name)
            got = [assets.sent_fingerprint(c[k]) for _, c, k in assets.image_slots(sent)]
            if all(e.admits(g) for e, g in zip(expected, got, strict=True)):
                matches.append(name)
        if all(e.trusted for e in expected):
            if len(matches) == 1:
                return RecoveryVerdict.FOUND, matches[0]
            if not matches and complete:
                return RecoveryVerdict.NOT_FOUND, ""
            return RecoveryVerdict.INCONCLUSIVE, ""
        if not candidates and complete:
            return RecoveryVerdict.NOT_FOUND, ""
        known = all(e.sha256 is not None for e in expected)
        if known and len(candidates) == 1 and matches == candidates:
            return RecoveryVerdict.FOUND, matches[0]
        return RecoveryVerdict.INCONCLUSIVE, ""

    # -- usage ---------------------------------------------------------------------------------
    async def list_usage(self, request: UsageInput) -> UsageResult:
        """Billed seconds per operation (the emulator's billing export, when enabled)."""
        account = self.account(request.account)
        if not option_flag(self.config, "billing_export"):
            return UsageResult(error=NO_USAGE)
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


def _comparable(value: Any) -> str:
    """A key for equality of JSON values (any JSON: listings may hold floats)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _record(row: dict[str, Any]) -> UsageRecord:
    return UsageRecord(
        model=str(row.get("model") or ""),
        usage_time=parse_timestamp(row.get("usageTime")) or utcnow(),
        provider_milliunits=scaled_int(row.get("billedSeconds"), 1000),
        provider_unit="billed_seconds",
        cost_micros=scaled_int(row.get("usd"), 1_000_000),
        currency="USD",
        raw_json=json.dumps(row, sort_keys=True, separators=(",", ":")),
        provider_job_id=str(row.get("operation") or ""),
    )
