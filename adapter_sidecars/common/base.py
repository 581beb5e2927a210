"""`HttpAdapter`: the provider-neutral skeleton every HTTP provider adapter fills in.

The skeleton owns what must be identical everywhere: account and capability lookup, spec
validation, sending a submit exactly once through the stage classifier, turning a 2xx without
a usable id into UNKNOWN, reading polls and cancels with plain (retry-safe) calls, and the
health probe. A provider subclass supplies the wire details through a few hooks:

* `compile_native(spec, cap)`: `CompiledPlan` for one entry (uses `common.compiling`).
* `submit_headers(...)`, `created_job(...)`, `submit_error(...)`: the create call.
* `job_path(...)`, `job_status(...)`: polling.
* `cancel_job`, `recover_submission`, `list_usage`: provider-specific operations.
* `output_uri_allowed(uri)`: which output URIs FetchOutput may download with credentials;
  `credential_origins()`: where the credentials may go (default: the base URL's origin).
* `submit_url(plan, account)`: where the create call goes (default: the plan's path on the base
  URL; an adapter with per-account hosts returns an absolute URL).

FetchOutput (`fetch_output`) is generic: a GET of an output URI on the provider's own origin
with the account's auth headers, redirects followed by hand so the credentials are only ever
sent to the provider base URL's origin (a hop to another host, e.g. a signed storage URL, goes
without them), the body streamed in 64 KiB parts under a size cap, and failures as values:
OUTPUT_EXPIRED for a refused or gone link (4xx), TRANSIENT_NETWORK for transport errors and
5xx, RATE_LIMITED for 429. Any other URI is refused with `InvalidRequest` before a byte is sent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from adapter_sidecars.common import transport
from adapter_sidecars.common.config import Account, SidecarConfig
from adapter_sidecars.common.transport import HttpReply
from adapter_sidecars.common.types import (
    CompileInput,
    FetchOutputInput,
    InvalidRequest,
    MalformedPlan,
    SubmitInput,
    UnknownAccount,
    UnknownModel,
)
from vidroute_core.adapter import (
    AdapterInfo,
    CompiledPlan,
    JobRef,
    JobSnapshot,
    LoadReport,
    OutputChunk,
    PollResult,
    SubmitKind,
    SubmitOutcome,
)
from vidroute_core.capabilities.loader import (
    Capability,
    expand_for_accounts,
    find,
    load_directory,
)
from vidroute_core.errors import ErrorClass, ProviderError, make_error
from vidroute_core.spec import GenerationSpec
from vidroute_core.validation import ensure_valid
from vidroute_core.wire.tracing import instrument_httpx

ADAPTER_VERSION = "0.1.0"
#: Size of one FetchOutput part.
OUTPUT_CHUNK_BYTES = 64 * 1024
#: FetchOutput's cap when the caller gives none.
DEFAULT_OUTPUT_MAX_BYTES = 2 * 1024**3
#: Redirect hops FetchOutput follows.
MAX_OUTPUT_REDIRECTS = 5


def build_client(config: SidecarConfig) -> httpx.AsyncClient:
    """The one HTTP client of a sidecar, with the configured timeouts."""
    t = config.timeouts
    client = httpx.AsyncClient(
        base_url=config.base_url,
        timeout=httpx.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool),
        limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        follow_redirects=False,
    )
    instrument_httpx(client)  # a child span and traceparent per provider call (when tracing)
    return client


def load_capabilities(config: SidecarConfig, package_dir: Path, provider: str) -> list[Capability]:
    """Entries of `provider` from the configured or packaged directory, per account."""
    directory = config.capabilities_dir or package_dir / "capabilities"
    entries = [e for e in load_directory(directory) if e.provider == provider]
    return expand_for_accounts(entries, [(a.name, a.region) for a in config.accounts])


class HttpAdapter:
    """Base class of the HTTP provider adapters (see the module docstring)."""

    name = "provider"
    provider = "provider"

    def __init__(
        self,
        config: SidecarConfig,
        capabilities: Sequence[Capability],
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.config = config
        self.capabilities = tuple(capabilities)
        self.client = client or build_client(config)
        t = config.timeouts
        self.submit_timeout = httpx.Timeout(
            connect=t.connect, read=t.submit_read, write=t.write, pool=t.pool
        )

    # -- lookups -----------------------------------------------------------------------------
    def account(self, name: str) -> Account:
        """The configured account (empty name: the default one)."""
        account = self.config.account(name)
        if account is None:
            raise UnknownAccount(f"account {name!r} is not configured for {self.name}")
        return account

    def capability(self, account: str, model: str, model_version: str = "") -> Capability:
        """The entry for account + model (+ version)."""
        cap = find(self.capabilities, account=account, model=model, model_version=model_version)
        if cap is None:
            shown = f"{model}@{model_version}" if model_version else model
            raise UnknownModel(f"{self.name} has no model {shown} on account {account!r}")
        return cap

    def entry(self, account: str, model: str) -> Capability | None:
        """The current entry of a model on an account, if any (for TTLs and prices)."""
        return find(self.capabilities, account=account, model=model)

    def describe(self) -> AdapterInfo:
        """Name, version, capability entries and the submit facts the control plane needs."""
        return AdapterInfo(
            self.name,
            ADAPTER_VERSION,
            tuple(self.capabilities),
            submit_budget_s=self.submit_budget_s(),
            honours_idempotency_key=any(
                c.operations.client_idempotency_key for c in self.capabilities
            ),
        )

    def submit_budget_s(self) -> float:
        """The longest one Submit can take here: pool + connect + write + submit_read.

        A subclass that does more inside Submit (fetch assets, retry a not-sent create) adds
        that time: the control plane's Submit deadline is derived from this figure."""
        t = self.config.timeouts
        return t.pool + t.connect + t.write + t.submit_read

    # -- compile -------------------------------------------------------------------------------
    def compile(self, request: CompileInput) -> CompiledPlan:
        """Validate the spec, pick the entry and let the provider map it."""
        ensure_valid(request.spec)
        account = self.account(request.account)
        if request.capability is not None:
            cap = self.routed_capability(account.name, request.model, request.capability)
        else:
            cap = self.capability(account.name, request.model, request.model_version)
        return self.compile_native(request.spec, cap)

    def routed_capability(self, account: str, model: str, routed: Capability) -> Capability:
        """The entry the control plane routed on, with this adapter's wire mapping of the model.

        The catalog in the database is the one source of truth for what a model can do and
        costs, so a version or price published there compiles here without a redeploy; how the
        model is spelled on the wire (``native``) stays the adapter's, taken from its own entry
        of the model (the same version when it has it, else its newest). A model the adapter
        has no entry for is one it cannot map: `UnknownModel`."""
        if (routed.provider, routed.account, routed.model) != (self.provider, account, model):
            raise InvalidRequest(
                f"the routed capability is {routed.provider}/{routed.account}/{routed.model},"
                f" not this request's {self.provider}/{account}/{model}"
            )
        own = find(
            self.capabilities, account=account, model=model, model_version=routed.model_version
        ) or find(self.capabilities, account=account, model=model)
        if own is None:
            raise UnknownModel(f"{self.name} cannot map model {model} on account {account!r}")
        return replace(routed, native=own.native)

    def compile_native(self, spec: GenerationSpec, cap: Capability) -> CompiledPlan:
        """Provider hook: map `spec` to a native request for `cap`."""
        raise NotImplementedError

    # -- submit --------------------------------------------------------------------------------
    def check_plan(self, plan: CompiledPlan) -> Account:
        """Refuse plans this adapter cannot send (wrong provider, not submittable, no body)."""
        if plan.provider != self.provider:
            raise MalformedPlan(f"plan is for provider {plan.provider!r}, not {self.provider!r}")
        if not plan.submittable or plan.native_request is None:
            raise MalformedPlan("plan is not submittable")
        method, _, path = plan.endpoint.partition(" ")
        if method != "POST" or not path.startswith("/"):
            raise MalformedPlan(f"plan endpoint {plan.endpoint!r} is not 'POST /path'")
        return self.account(plan.account)

    async def submit(self, request: SubmitInput) -> SubmitOutcome:
        """Send the create call once and classify the result (design 9.17.3)."""
        account = self.check_plan(request.plan)
        return await self.send_create(request, account)

    async def send_create(self, request: SubmitInput, account: Account) -> SubmitOutcome:
        """One create call: headers from the hook, body = the plan's canonical JSON."""
        plan = request.plan
        headers = {"content-type": "application/json", **self.submit_headers(request, account)}
        http_request = self.client.build_request(
            "POST",
            self.submit_url(plan, account),
            content=self.submit_body(request),
            headers=headers,
            timeout=self.submit_timeout,
        )
        result = await transport.send_submit(self.client, http_request)
        if isinstance(result, SubmitOutcome):
            return result
        if not result.ok:
            return self.submit_error(result)
        created = self.created_job(result, plan)
        if created is None:
            return transport.unknown_response(result, "no job id in the response body")
        job_id, raw_status = created
        job = JobRef(job_id, account=account.name, model=plan.model)
        return SubmitOutcome(
            SubmitKind.ACCEPTED,
            job=job,
            raw_status=raw_status,
            request_started_at=result.started_at,
        )

    def submit_url(self, plan: CompiledPlan, account: Account) -> str:
        """Provider hook: where the create call goes; by default the plan endpoint's path on
        the provider base URL (an adapter with per-account hosts returns an absolute URL)."""
        return plan.endpoint.partition(" ")[2]

    def submit_body(self, request: SubmitInput) -> bytes:
        """Provider hook: the bytes sent; by default exactly the plan's canonical JSON."""
        return request.plan.native_request_json.encode("utf-8")

    def submit_headers(self, request: SubmitInput, account: Account) -> dict[str, str]:
        """Provider hook: headers of the create call (auth, idempotency key...)."""
        return self.auth_headers(account)

    def auth_headers(self, account: Account) -> dict[str, str]:
        """Provider hook: authentication (and versioning) headers of every call."""
        raise NotImplementedError

    def created_job(self, reply: HttpReply, plan: CompiledPlan) -> tuple[str, str] | None:
        """Provider hook: (job id, raw status) from a 2xx create reply; None if unusable."""
        raise NotImplementedError

    def submit_error(self, reply: HttpReply) -> SubmitOutcome:
        """Provider hook: classify a non-2xx create reply under the provider's contract."""
        raise NotImplementedError

    # -- polling -------------------------------------------------------------------------------
    async def call(
        self,
        method: str,
        path: str,
        account: Account,
        *,
        json_body: Any = None,
        params: dict[str, str] | None = None,
    ) -> HttpReply | ProviderError:
        """A retry-safe provider call with the account's auth headers."""
        return await transport.request_json(
            self.client,
            method,
            path,
            headers=self.auth_headers(account),
            json_body=json_body,
            params=params,
        )

    async def get_job(self, job: JobRef) -> PollResult:
        """Poll the job and normalize its status.

        A 404 for a job we hold is never a status: the provider may have lost, expired or
        deleted it, or be answering from a replica that has not seen it yet. It is the
        transient error `job_not_found` (code JOB_NOT_FOUND), and the control plane decides
        (a cancel it asked for is confirmed; otherwise it keeps polling, then gives up)."""
        if not job.provider_job_id:
            raise InvalidRequest("job.provider_job_id is required")
        account = self.account(job.account)
        reply = await self.call("GET", self.job_path(job), account)
        if isinstance(reply, ProviderError):
            return PollResult(error=reply)
        if reply.status == 404:
            return PollResult(error=job_not_found(reply, job))
        return self.job_status(reply, job)

    def job_path(self, job: JobRef) -> str:
        """Provider hook: path that reads one job."""
        raise NotImplementedError

    def job_status(self, reply: HttpReply, job: JobRef) -> PollResult:
        """Provider hook: normalize a poll reply."""
        raise NotImplementedError

    # -- outputs -------------------------------------------------------------------------------
    def output_uri_allowed(self, uri: httpx.URL) -> bool:
        """Provider hook: may FetchOutput download `uri` with the account's credentials?

        By default only URIs on the provider base URL's own origin (scheme, host, port)."""
        return origin(uri) in self.credential_origins()

    def credential_origins(self) -> frozenset[tuple[str, str, int | None]]:
        """Provider hook: the origins the account's credentials may be sent to (FetchOutput);
        by default only the provider base URL's."""
        return frozenset({origin(httpx.URL(self.config.base_url))})

    async def fetch_output(self, request: FetchOutputInput) -> AsyncIterator[OutputChunk]:
        """Stream one output URI with the account's credentials (see the module docstring).

        Raises `InvalidRequest` / `UnknownAccount` before anything is sent."""
        account = self.account(request.job.account)
        try:
            url = httpx.URL(request.uri)
        except (httpx.InvalidURL, TypeError):
            raise InvalidRequest("output uri is not a URL") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise InvalidRequest(f"output uri {redact(url)} is not an http(s) URL")
        if not self.output_uri_allowed(url):
            raise InvalidRequest(
                f"output uri {redact(url)} is not on the provider's host "
                f"{httpx.URL(self.config.base_url).host}; refusing to fetch it"
            )
        limit = request.max_bytes if request.max_bytes > 0 else DEFAULT_OUTPUT_MAX_BYTES
        async for part in self._stream_output(url, account, limit):
            yield part

    async def _stream_output(
        self, url: httpx.URL, account: Account, limit: int
    ) -> AsyncIterator[OutputChunk]:
        home = self.credential_origins()
        target = url
        try:
            for _ in range(MAX_OUTPUT_REDIRECTS + 1):
                # Credentials go to the provider's own origin only, never along a redirect
                # to another host.
                headers = self.auth_headers(account) if origin(target) in home else {}
                response = await self.client.send(
                    self.client.build_request("GET", target, headers=headers), stream=True
                )
                try:
                    if response.is_redirect:
                        target = target.join(response.headers["location"])
                        if target.scheme not in ("http", "https"):
                            yield OutputChunk(error=_unexpected(response, "redirect to non-HTTP"))
                            return
                        continue
                    failure = output_http_error(response)
                    if failure is not None:
                        yield OutputChunk(error=failure)
                        return
                    content_type = response.headers.get("content-type", "")
                    declared = response.headers.get("content-length", "")
                    length = int(declared) if declared.isdigit() else 0
                    if length > limit:
                        yield OutputChunk(
                            content_type=content_type,
                            content_length=length,
                            error=too_large(f"Content-Length {length} exceeds {limit} bytes"),
                        )
                        return
                    first, sent = True, 0
                    async for chunk in response.aiter_bytes(OUTPUT_CHUNK_BYTES):
                        sent += len(chunk)
                        if sent > limit:
                            yield OutputChunk(error=too_large(f"body exceeds {limit} bytes"))
                            return
                        if first:
                            yield OutputChunk(chunk, content_type, length)
                            first = False
                        else:
                            yield OutputChunk(chunk)
                    if first:
                        yield OutputChunk(b"", content_type, length)
                    return
                finally:
                    await response.aclose()
            yield OutputChunk(
                error=make_error(
                    ErrorClass.TRANSIENT_NETWORK,
                    "TOO_MANY_REDIRECTS",
                    f"more than {MAX_OUTPUT_REDIRECTS} redirects from {redact(url)}",
                )
            )
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            yield OutputChunk(
                error=make_error(
                    ErrorClass.TRANSIENT_NETWORK,
                    "TRANSPORT",
                    f"{type(exc).__name__} fetching {redact(target)}",
                )
            )

    # -- health --------------------------------------------------------------------------------
    async def get_load(self) -> LoadReport:
        """GetLoad: nothing by default (a SaaS API exposes no load); never an error."""
        return LoadReport()

    def probe_path(self) -> str:
        """Provider hook: a cheap GET that proves the endpoint and credentials work."""
        raise NotImplementedError

    async def probe(self) -> bool:
        """True when the provider answered the probe with a usable status."""
        try:
            account = self.config.accounts[0]
            reply = await self.call("GET", self.probe_path(), account)
        except Exception:  # a probe must never take the sidecar down
            return False
        if isinstance(reply, ProviderError):
            return False
        return reply.status < 500 and reply.status not in (401, 403)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.client.aclose()


def raw_json(value: Any) -> str:
    """Compact JSON of a provider payload, for ``raw_payload_json`` / ``raw_json``."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def payload_of(reply: HttpReply) -> Mapping[str, Any] | None:
    """The reply body as a JSON object, or None."""
    body = reply.json()
    return body if isinstance(body, dict) else None


def with_raw(status: JobSnapshot, payload: Any) -> JobSnapshot:
    """Attach the raw payload (kept for debugging and audit, design 9.8)."""
    return replace(status, raw_payload_json=raw_json(payload))


def origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL; the default port of the scheme is None."""
    return url.scheme, url.host.lower(), url.port


def redact(url: httpx.URL) -> str:
    """A URL without userinfo, query or fragment (signed links carry secrets there)."""
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{url.host}{port}{url.path}"


def output_http_error(response: httpx.Response) -> ProviderError | None:
    """The error of a non-200 answer to an output download, None for 200.

    401: AUTH. 408/425/5xx: TRANSIENT_NETWORK. 429: RATE_LIMITED. Any other 4xx (403, 404, 410,
    and 400, which is how storage services answer an expired signature): OUTPUT_EXPIRED."""
    status = response.status_code
    if status == 200:
        return None
    where = redact(response.url)
    if status == 429:
        return make_error(
            ErrorClass.RATE_LIMITED,
            "HTTP_429",
            f"HTTP 429 from {where}",
            retry_after_ms=transport.retry_after_ms(response.headers),
            raw_status_code=status,
        )
    if status in (408, 425) or status >= 500:
        return make_error(
            ErrorClass.TRANSIENT_NETWORK,
            f"HTTP_{status}",
            f"HTTP {status} from {where}",
            retry_after_ms=transport.retry_after_ms(response.headers),
            raw_status_code=status,
        )
    if status == 401:
        return make_error(
            ErrorClass.AUTH, "HTTP_401", f"HTTP 401 from {where}", raw_status_code=status
        )
    if 400 <= status < 500:
        return make_error(
            ErrorClass.OUTPUT_EXPIRED,
            "OUTPUT_EXPIRED",
            f"HTTP {status} from {where}: the output link expired or is gone",
            raw_status_code=status,
        )
    return _unexpected(response, f"unexpected HTTP {status}")


def _unexpected(response: httpx.Response, why: str) -> ProviderError:
    return make_error(
        ErrorClass.INTERNAL_RETRYABLE,
        "UNEXPECTED_RESPONSE",
        f"{why} from {redact(response.url)}",
        raw_status_code=response.status_code,
    )


def too_large(message: str) -> ProviderError:
    """An output over the caller's size cap (code OUTPUT_TOO_LARGE)."""
    return make_error(ErrorClass.INTERNAL_PERMANENT, "OUTPUT_TOO_LARGE", message)


#: Error code of a poll answered 404 for a job we hold (see `HttpAdapter.get_job`).
JOB_NOT_FOUND = "JOB_NOT_FOUND"


def job_not_found(reply: HttpReply, job: JobRef) -> ProviderError:
    """The provider does not know a job we hold: worth polling again, never "cancelled"."""
    return make_error(
        ErrorClass.INTERNAL_RETRYABLE,
        JOB_NOT_FOUND,
        f"the provider answered HTTP 404 for job {job.provider_job_id}",
        raw_status_code=reply.status,
    )


def unreadable(reply: HttpReply) -> ProviderError:
    """A non-create reply whose body we cannot read: worth another poll."""
    return make_error(
        ErrorClass.INTERNAL_RETRYABLE,
        "UNREADABLE_RESPONSE",
        f"HTTP {reply.status} with a body that is not a JSON object",
        raw_status_code=reply.status,
    )
