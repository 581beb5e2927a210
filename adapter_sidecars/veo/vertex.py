"""The Veo adapter, Vertex AI surface (``{location}-aiplatform.googleapis.com``, §2.2).

An account chooses this surface in the sidecar config (``options.surface: vertex``, see
`VertexAccount`); its ``credential_ref`` names a service-account key JSON, from which
`oauth.TokenSource` obtains OAuth 2 access tokens (JWT bearer grant, cached, refreshed early).

* Submit: ``POST {host}/v1/projects/{p}/locations/{l}/publishers/google/models/{m}:
  predictLongRunning`` with the plan's body plus ``labels`` carrying the attempt's identity
  (`attempt_labels`), so the Cloud Billing export can attribute each operation's cost. The host
  is the account's ``options.endpoint`` when set, else regional
  (``{l}-aiplatform.googleapis.com``, ``global`` -> ``aiplatform.googleapis.com``) when
  ``provider.base_url`` is a Google host; any other base URL (an emulator, a Private Service
  Connect endpoint) is used as is. https image assets are inlined as bytes first (as on the
  Gemini surface); ``gs://`` images go by reference.
* Poll: ``POST .../models/{m}:fetchPredictOperation`` ``{"operationName"}``. Outputs are
  ``gs://`` objects under the account's ``output_uri``; they need the service account to read,
  so they are flagged ``fetch_through_adapter`` and FetchOutput downloads them through the
  Cloud Storage JSON API (``GET {storage}/storage/v1/b/{bucket}/o/{object}?alt=media``), only
  from the buckets of the job's account.
* Errors are ``google.rpc.Status`` JSON as on the Gemini API (`mapping.http_error`).

What the surface cannot do, and Describe says so (``vertex_capabilities``): no cancel, no
idempotency key, no callbacks, no usage export, and no listing of operations: an operation
name exists only in the create response, so an UNKNOWN submit cannot be searched for. Recovery
answers INCONCLUSIVE from the provider (`NO_SEARCH`); only the sidecar's submit journal (a
sole submitter that never saw the key) can prove absence, as for any provider without listing.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from adapter_sidecars.common import transport
from adapter_sidecars.common.base import (
    job_not_found,
    origin,
    payload_of,
    unreadable,
    with_raw,
)
from adapter_sidecars.common.config import Account, ConfigError, SidecarConfig
from adapter_sidecars.common.transport import HttpReply, rejected, utcnow
from adapter_sidecars.common.types import (
    FetchOutputInput,
    InvalidRequest,
    SubmitInput,
    UsageInput,
)
from adapter_sidecars.veo import mapping, oauth, vertex_compile
from adapter_sidecars.veo.adapter import VeoAdapter
from vidroute_core.adapter import (
    CompiledPlan,
    JobRef,
    OutputChunk,
    PollResult,
    RecoverQuery,
    RecoverResult,
    RecoveryVerdict,
    SubmitOutcome,
    UsageResult,
)
from vidroute_core.capabilities.loader import Capability, expand_for_accounts, load_directory
from vidroute_core.cloud_labels import ACCOUNT_LABEL, ATTEMPT_LABEL, label_value
from vidroute_core.errors import ErrorClass, ProviderError, make_error
from vidroute_core.hashing import canonical_json
from vidroute_core.spec import GenerationSpec

PACKAGE_DIR = Path(__file__).parent
#: Vertex AI's global host (an account in location "global" talks to it).
GOOGLE_BASE_URL = "https://aiplatform.googleapis.com"
GOOGLE_STORAGE_URL = "https://storage.googleapis.com"
SURFACE = "vertex"
NO_SEARCH = (
    "operation_search unsupported: Vertex AI lists no Veo operations and names an operation "
    "only in the create response, so an unknown submit cannot be proven either way"
)
NO_USAGE = make_error(
    ErrorClass.UNSUPPORTED_CAPABILITY,
    "USAGE_UNSUPPORTED",
    "Vertex AI has no per-operation usage API; spend is attributed in the Cloud Billing export "
    "by the request labels vidroute-request-key / vidroute-account",
)
#: Label keys of the attempt identity (shared with reconciliation: `vidroute_core.cloud_labels`).
LABEL_KEY = ATTEMPT_LABEL
LABEL_ACCOUNT = ACCOUNT_LABEL
_GS = re.compile(r"gs://([a-z0-9][a-z0-9._-]{1,221}[a-z0-9])/(.+)")


def attempt_labels(client_request_key: str, account: Account) -> dict[str, str]:
    """The labels of one create call: the attempt's request key and our account name."""
    return {LABEL_KEY: label_value(client_request_key), LABEL_ACCOUNT: label_value(account.name)}


@dataclass(frozen=True, slots=True)
class VertexAccount:
    """The Vertex facts of one account (its ``options``).

    ``surface: vertex``; ``project`` (id); ``location`` (default: the account's ``region``);
    ``output_uri``: the ``gs://bucket/prefix`` Veo writes outputs to (``storageUri``);
    ``endpoint`` (optional): the API host, overriding the regional one."""

    project: str
    location: str
    output_uri: str
    endpoint: str = ""

    @property
    def bucket(self) -> str:
        match = _GS.fullmatch(self.output_uri.rstrip("/") + "/x")
        return match.group(1) if match else ""

    @classmethod
    def of(cls, account: Account) -> VertexAccount:
        options = account.options
        project = str(options.get("project") or "")
        location = str(options.get("location") or account.region or "")
        output_uri = str(options.get("output_uri") or "")
        where = f"accounts[{account.name}].options"
        if options.get("surface") != SURFACE:
            raise ConfigError(f"{where}.surface must be {SURFACE!r} for the Vertex adapter")
        if not project or not location:
            raise ConfigError(f"{where}: project and location (or region) are required")
        if _GS.fullmatch(output_uri.rstrip("/") + "/x") is None:
            raise ConfigError(f"{where}.output_uri must be gs://bucket[/prefix]")
        endpoint = str(options.get("endpoint") or "").rstrip("/")
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.endpoint must be an http(s) URL")
        return cls(project, location, output_uri.rstrip("/"), endpoint)


class VertexAdapter(VeoAdapter):
    """`ProviderAdapter` for Veo on Vertex AI (see the module docstring)."""

    name = "veo-vertex"
    provider = "google"

    def __init__(
        self,
        config: SidecarConfig,
        capabilities: Sequence[Capability],
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(config, capabilities, client)
        self.vertex = {a.name: VertexAccount.of(a) for a in config.accounts}
        self.tokens = oauth.TokenSource(self.client, time_scale=config.time_scale)
        storage = str(config.provider_options.get("storage_base_url") or GOOGLE_STORAGE_URL)
        if not storage.startswith(("http://", "https://")):
            raise ConfigError("provider.options.storage_base_url must be an http(s) URL")
        self.storage_url = storage.rstrip("/")

    def submit_budget_s(self) -> float:
        """Gemini's budget (create call + asset fetch) plus the token exchange Submit may make
        first (a plain call: pool + connect + write + read)."""
        t = self.config.timeouts
        return super().submit_budget_s() + t.pool + t.connect + t.write + t.read

    @classmethod
    def from_config(cls, config: SidecarConfig) -> VertexAdapter:
        """Build with the packaged (or configured) Vertex capability entries."""
        directory = config.capabilities_dir or PACKAGE_DIR / "vertex_capabilities"
        entries = [e for e in load_directory(directory) if e.provider == cls.provider]
        caps = expand_for_accounts(entries, [(a.name, a.region) for a in config.accounts])
        return cls(config, caps)

    # -- where things are ----------------------------------------------------------------------
    def host(self, account: Account) -> str:
        """The account's endpoint: its ``options.endpoint`` when set; on Google (a
        ``*.googleapis.com`` base URL, which a sidecar also serving Gemini accounts has) the
        regional host; else (an emulator, a private endpoint) the configured base URL."""
        if self.vertex[account.name].endpoint:
            return self.vertex[account.name].endpoint
        if not httpx.URL(self.config.base_url).host.endswith(".googleapis.com"):
            return self.config.base_url
        location = self.vertex[account.name].location
        return (
            GOOGLE_BASE_URL
            if location == "global"
            else f"https://{location}-aiplatform.googleapis.com"
        )

    def _model_url(self, account: Account, model: str) -> str:
        v = self.vertex[account.name]
        return self.host(account) + vertex_compile.model_path(v.project, v.location, model)

    def submit_url(self, plan: CompiledPlan, account: Account) -> str:
        return self.host(account) + plan.endpoint.partition(" ")[2]

    # -- hooks ---------------------------------------------------------------------------------
    def compile_native(self, spec: GenerationSpec, cap: Capability) -> CompiledPlan:
        v = self.vertex[self.account(cap.account).name]
        return vertex_compile.build_request(
            spec, cap, project=v.project, location=v.location, output_uri=v.output_uri
        )

    def auth_headers(self, account: Account) -> dict[str, str]:
        """The cached bearer token (callers obtain one first: `call`, `submit`)."""
        token = self.tokens.cached(account)
        return {"authorization": f"Bearer {token}"} if token else {}

    def submit_body(self, request: SubmitInput) -> bytes:
        """The plan's body plus the attempt's labels (Cloud Billing attribution)."""
        body = json.loads(request.plan.native_request_json)
        body["labels"] = attempt_labels(
            request.client_request_key, self.account(request.plan.account)
        )
        return canonical_json(body)

    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        """Obtain a token (failing that, REJECTED: nothing reached Vertex), then submit once."""
        account = self.check_plan(request.plan)
        token = await self.tokens.token(account)
        if isinstance(token, ProviderError):
            return rejected(token, None)
        outcome = await super().submit(request)
        if outcome.error is not None and outcome.error.raw_status_code == 401:
            self.tokens.forget(account)
        return outcome

    async def call(
        self,
        method: str,
        path: str,
        account: Account,
        *,
        json_body: Any = None,
        params: dict[str, str] | None = None,
    ) -> HttpReply | ProviderError:
        """A retry-safe call with a fresh bearer token; a 401 drops the cached token."""
        token = await self.tokens.token(account)
        if isinstance(token, ProviderError):
            return token
        reply = await transport.request_json(
            self.client,
            method,
            path,
            headers={"authorization": f"Bearer {token}"},
            json_body=json_body,
            params=params,
        )
        if isinstance(reply, HttpReply) and reply.status == 401:
            self.tokens.forget(account)
        return reply

    def created_job(self, reply: HttpReply, plan: CompiledPlan) -> tuple[str, str] | None:
        body = payload_of(reply)
        name = body.get("name") if body else None
        if (
            not isinstance(name, str)
            or not name.startswith("projects/")
            or "/operations/" not in name
        ):
            return None
        return name, "DONE" if body and body.get("done") else "RUNNING"

    # -- polling -------------------------------------------------------------------------------
    async def get_job(self, job: JobRef) -> PollResult:
        """``fetchPredictOperation`` on the model the operation name belongs to."""
        if not job.provider_job_id or "/operations/" not in job.provider_job_id:
            raise InvalidRequest("job.provider_job_id must be a Vertex operation name")
        account = self.account(job.account)
        model_name = job.provider_job_id.split("/operations/", 1)[0]
        url = (
            self.host(account) + f"/{vertex_compile.API_VERSION}/{model_name}:fetchPredictOperation"
        )
        reply = await self.call(
            "POST", url, account, json_body={"operationName": job.provider_job_id}
        )
        if isinstance(reply, ProviderError):
            return PollResult(error=reply)
        if reply.status == 404:
            return PollResult(error=job_not_found(reply, job))
        return self.job_status(reply, job)

    def job_path(self, job: JobRef) -> str:
        return job.provider_job_id

    def probe_path(self) -> str:
        """The publisher model (``GET /v1/publishers/google/models/{m}``) with a real token."""
        account = self.config.accounts[0]
        model = self.capabilities[0].model if self.capabilities else "veo-3.1-generate-001"
        return f"{self.host(account)}/{vertex_compile.API_VERSION}/publishers/google/models/{model}"

    def job_status(self, reply: HttpReply, job: JobRef) -> PollResult:
        if not reply.ok:
            return PollResult(error=mapping.http_error(reply))
        op = payload_of(reply)
        if op is None:
            return PollResult(error=unreadable(reply))
        status = mapping.operation_status(op, url_ttl_seconds=0, now=utcnow())
        outputs = tuple(
            replace(o, fetch_through_adapter=True) if o.uri.startswith("gs://") else o
            for o in status.outputs
        )
        return PollResult(snapshot=with_raw(replace(status, outputs=outputs), op))

    # -- outputs -------------------------------------------------------------------------------
    def credential_origins(self) -> frozenset[tuple[str, str, int | None]]:
        return frozenset({origin(httpx.URL(self.storage_url))})

    def storage_media_url(self, uri: str, account: Account) -> str:
        """The Cloud Storage JSON API media URL of a ``gs://`` output of `account`'s bucket;
        `InvalidRequest` for anything else (no other bucket, host or scheme is fetched)."""
        match = _GS.fullmatch(uri)
        bucket = self.vertex[account.name].bucket
        if match is None or match.group(1) != bucket:
            raise InvalidRequest(
                f"output uri is not an object of the account's bucket gs://{bucket}; refusing"
            )
        obj = quote(match.group(2), safe="")
        return f"{self.storage_url}/storage/v1/b/{bucket}/o/{obj}?alt=media"

    async def fetch_output(self, request: FetchOutputInput) -> AsyncIterator[OutputChunk]:
        """Stream a ``gs://`` output from Cloud Storage with the account's token."""
        account = self.account(request.job.account)
        url = httpx.URL(self.storage_media_url(request.uri, account))
        token = await self.tokens.token(account)
        if isinstance(token, ProviderError):
            yield OutputChunk(error=token)
            return
        limit = request.max_bytes if request.max_bytes > 0 else 2 * 1024**3
        async for part in self._stream_output(url, account, limit):
            yield part

    # -- recovery and usage ----------------------------------------------------------------------
    async def recover_submission(self, request: RecoverQuery) -> RecoverResult:
        """Nothing to search on Vertex (see the module docstring): INCONCLUSIVE, said why."""
        return RecoverResult(RecoveryVerdict.INCONCLUSIVE, method=NO_SEARCH)

    async def list_usage(self, request: UsageInput) -> UsageResult:
        self.account(request.account)
        return UsageResult(error=NO_USAGE)
