"""Composition root: configuration -> implementations -> a running control plane.

The only module that reads environment variables, each declared with its type in
`vidroute_core.settings.ControlPlaneEnv` (pydantic-settings): an unknown ``VIDROUTE_*`` name, a bad
value or a file variable naming no file is a `SettingsError` at start, one line naming it.

- ``VIDROUTE_DATABASE_URL``: SQLAlchemy async URL. Default: embedded SQLite under ``./var/``.
  PostgreSQL: ``postgresql+asyncpg://user@127.0.0.1:5432/vidroute``.
- ``VIDROUTE_REDIS_URL``: Redis for quota leases and shared breaker state. Default: none, which
  selects the in-process implementations (one replica only).
- ``VIDROUTE_BROKER_URL``: ``nats://host:port``, wake-ups across replicas (`controlplane.wakeups`).
  Default: none, wake-ups stay in this process; polling is relied on either way.
- ``VIDROUTE_SHARD_COUNT``: dispatcher shards, the same on every replica (PostgreSQL). Default 1.
- ``VIDROUTE_DISPATCH_BATCH_SIZE``: tasks a dispatch round routes, leases and writes in one
  transaction, 1..4096 (`DispatcherConfig.batch_size`, default 256); a round reads at least twice
  as many queue heads. Larger rounds cost less CPU per task (bench/RESULTS.md) and hold each
  round's transaction longer.
- ``VIDROUTE_LISTEN``: gRPC listen address. Default ``127.0.0.1:8051``.
- ``VIDROUTE_ADAPTERS``: ``provider=host:port,...`` adapter sidecars. Without any the control
  plane refuses to start (`controlplane.startup`), unless ``VIDROUTE_API_ONLY`` is ``1``/``true``:
  then it serves the API only, tasks are accepted and stay QUEUED until a scheduling replica runs.
- ``VIDROUTE_OBJECT_STORE``: ``file:///path`` or ``s3://bucket/prefix?endpoint_url=...``.
  Default ``file://<cwd>/var/objects``.
- ``VIDROUTE_OUTPUT_URL_TTL_S``: lifetime of GetOutputUrl's presigned URLs (S3 store) when the
  request asks none: 1..604800 (7 days, SigV4's limit). Default 3600.
- ``VIDROUTE_CALLBACK_LISTEN`` / ``VIDROUTE_CALLBACK_PUBLIC_URL`` / ``VIDROUTE_CALLBACK_SECRETS``
  (``provider=secret,...``): the provider callback ingress (uvicorn); off unless a listen address
  is set. Port 0 binds a free port; the public URL defaults to the bound address.
- ``VIDROUTE_WEBHOOKS_FILE``: YAML of caller webhooks per tenant, ``tenants: {acme: {secret:
  "whsec_<base64>", url: https://..., events: [task.progress]}}`` (`controlplane.webhooks.config`):
  a tenant's signing secret (required for its tasks to name a webhook) and optional default.
  ``VIDROUTE_WEBHOOK_ALLOW_HTTP`` (default off: https only), ``VIDROUTE_WEBHOOK_ALLOW_PRIVATE``
  (default off: loopback, private, link-local and multicast receivers are refused at send time)
  and ``VIDROUTE_WEBHOOK_PRIVATE_ALLOWLIST`` (``10.1.2.0/24,fd00::/8``: private networks allowed).
- ``VIDROUTE_TENANTS_FILE`` / ``VIDROUTE_ACCOUNTS_FILE``: a tenants / accounts document
  (``controlplane/tenants.example.yaml``, ``accounts.example.yaml``) published at start when its
  version is not published yet (so a deployment ships them, e.g. as k8s ConfigMaps); a version
  already published is left as it is. A bad document stops the start with one line.
- ``VIDROUTE_TIME_SCALE``: a factor in (0, 1] that multiplies every duration of the control plane
  together (execution, polling, dispatcher, upkeep, breakers, leases, adapter deadlines), so a
  test or ``make up`` runs faster with every deadline in its production order; the sidecars read
  the same variable. Default 1.0; production never sets it.
- ``VIDROUTE_EXECUTION_TUNING``: JSON object overriding `ExecutionConfig` timings and limits,
  e.g. ``{"submitting_grace_s": 30, "max_total_attempts": 2}``; unknown fields are an error.
  Timings are in production seconds: the time scale applies to them too.
- ``VIDROUTE_SAFETY_POLICY``: path of the platform safety policy YAML (9.9.2), checked at
  CreateTask before anything is written. Default: the shipped ``controlplane/safety_policy.yaml``.
- ``VIDROUTE_MAX_TASK_AGE_S`` / ``VIDROUTE_MAX_QUEUE_DELAY_S``: the platform's task deadline and
  longest wait for a first attempt (`DeadlinePolicy`; 0: no limit). Defaults 86400 / 21600.
- ``VIDROUTE_WORKER_ID``: this replica's name in claims. Default ``<hostname>-<pid>``.
- ``VIDROUTE_AUTH_TOKENS`` / ``VIDROUTE_AUTH_FILE``: API bearer tokens as SHA-256 digests, each
  ``<sha256-hex>=tenant:<tenant_id>`` or ``<sha256-hex>=admin`` (comma- or line-separated; the file
  one per line, ``#`` comments), see `controlplane.api.auth`. ``VIDROUTE_AUTH``: empty (default:
  authentication on when tokens are configured, else off with a WARNING at start), ``required``
  (refuse to start without tokens) or ``off`` (tokens ignored, every caller an admin).
- ``VIDROUTE_LOG_LEVEL``: logging level. Default ``INFO``.
- ``VIDROUTE_BILLING_POLICY``: the default billing policy of tenants (9.23.1): ``prepaid`` (a task
  needs available credit for its reservation), ``postpaid`` (no limit) or ``postpaid:<micros>``
  (an overdraft down to minus that). Default ``postpaid`` (the embedded ``make up`` and tests;
  the ledger still reserves and settles); the shipped Kubernetes config sets ``prepaid``.
  ``VIDROUTE_BILLING_TENANTS`` (``tenant=policy,...``) / ``VIDROUTE_BILLING_FILE`` (one per
  line, ``#`` comments) override it per tenant (`controlplane.domain.money.BillingPolicies`).
- ``OTEL_*`` (the OpenTelemetry standard variables, e.g. ``OTEL_EXPORTER_OTLP_ENDPOINT``):
  traces exported over OTLP, service name ``vidroute-controlplane``; unset, no tracing at all
  (`vidroute_core.tracing`).
- ``VIDROUTE_METRICS_LISTEN``: ``host:port`` of the Prometheus ``/metrics`` endpoint (9.24).
  Default: off (tests); ``make up`` and the Kubernetes manifests set it.
- ``VIDROUTE_CONSOLE_LISTEN``: ``host:port`` of the read-only web console (`controlplane.console`),
  behind the API's tokens. Default: off; ``vidroute up`` serves it on 127.0.0.1:8088.
- ``VIDROUTE_TLS_CERT_FILE`` / ``VIDROUTE_TLS_KEY_FILE`` / ``VIDROUTE_TLS_CA_FILE`` (and
  ``VIDROUTE_TLS``, ``VIDROUTE_TLS_SERVER_NAME``): mTLS to every adapter sidecar, our client
  certificate and the sidecars' CA (`vidroute_core.tls`). Without them the channels are plaintext,
  allowed only to loopback sidecars unless ``VIDROUTE_TLS=off``.
- ``VIDROUTE_ADAPTER_SUBMIT_MARGIN_S``: seconds the Submit deadline adds to the submit budget each
  sidecar declares in Describe. Default 5. ``VIDROUTE_ADAPTER_SUBMIT_TIMEOUT_S`` fixes the
  deadline instead; one shorter than a sidecar's budget is refused (that adapter is never
  published, so the control plane is not ready for it) with an error in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from redis.asyncio import Redis

from controlplane.adapters.connect import adapter_client, one_shot_timing
from controlplane.adapters.grpc_client import GrpcAdapterClient
from controlplane.api.account_servicer import AccountServicer
from controlplane.api.auth import Authenticator, parse_entries
from controlplane.api.billing_servicer import BillingServicer
from controlplane.api.routing_servicer import RoutingServicer
from controlplane.api.servicer import SchedulerServicer
from controlplane.api.tenant_servicer import TenantServicer
from controlplane.capabilities.catalog import CapabilityCatalog, load_catalog
from controlplane.capabilities.publish import (
    AccountConfig,
    PublishError,
    publish_documents,
)
from controlplane.console.app import Console
from controlplane.console.server import CONSOLE_LISTEN_FIX, ConsoleServer
from controlplane.domain.accounts import parse_accounts_document
from controlplane.domain.baselines import HOST_NOISE_FLOOR_S, ONE_SHOT_MIN_DEADLINE_S
from controlplane.domain.breaker import BreakerConfig, BreakerKey, Operation
from controlplane.domain.deadlines import DeadlinePolicy
from controlplane.domain.money import BillingPolicies, BillingPolicy
from controlplane.domain.outbox import Topic
from controlplane.domain.routing.policy_document import PolicyDocument, parse_policy_document
from controlplane.domain.safety import SafetyPolicy
from controlplane.domain.scoring import example_policy
from controlplane.domain.tenants import parse_tenants_document
from controlplane.domain.unit_cost import observed_cost
from controlplane.execution.callback_server import CallbackLimits, CallbackServer
from controlplane.execution.callbacks import CallbackReceiver, CallbackVerifier
from controlplane.execution.config import ExecutionConfig
from controlplane.execution.engine import ExecutionEngine
from controlplane.execution.outcomes import AttemptEndObserver, SubmitObserver
from controlplane.execution.output_step import fetcher_for
from controlplane.leases.base import LeaseStore, LeaseStoreFactory
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.leases.redis_store import RedisClientConfig, RedisLeaseStore, redis_client
from controlplane.metrics import (
    ControlPlaneMetrics,
    StateCollector,
    StateSources,
    attempt_end_observer,
    chain,
    circuit_gauges,
    lease_gauges,
    submit_observer,
    window_gauges,
)
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.records import AccountInfo, AttemptRecord
from controlplane.persistence.statement_tally import count_statements, labelled
from controlplane.persistence.webhooks import WebhookStore
from controlplane.rate_limits import InProcessRateLimiter, RateLimiter, RedisRateLimiter
from controlplane.reconciliation import DiscrepancyCounter, delta_by_provider
from controlplane.scheduling.account_usage import AccountUsage, account_usage
from controlplane.scheduling.canary_gates import CanaryGateConfig
from controlplane.scheduling.dispatcher import DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.load_book import LoadConfig
from controlplane.scheduling.policy_book import SampleCheck
from controlplane.scheduling.quality_book import QualityBook
from controlplane.scheduling.reachability import AdapterReachability, service_name
from controlplane.scheduling.readiness import CatalogReadiness
from controlplane.scheduling.release_check import SampleCompiler
from controlplane.scheduling.relet import lease_source, usage_declared
from controlplane.scheduling.runtime import SchedulingRuntime, build_scheduling
from controlplane.scheduling.upkeep import UpkeepConfig
from controlplane.scheduling.windows import LimitsFor
from controlplane.server import ControlPlaneServer, start_server
from controlplane.service.access import Caller
from controlplane.service.accounts import (
    AccountBook,
    AccountConfigService,
    UsageSource,
    no_usage,
)
from controlplane.service.activator import POLL_S as ACTIVATION_POLL_S
from controlplane.service.activator import DocumentActivator
from controlplane.service.billing import BillingService
from controlplane.service.capability_publish import CapabilityPublishService
from controlplane.service.console_reads import ConsoleReads
from controlplane.service.cost_gauges import CostGaugeRefresher
from controlplane.service.outputs import DEFAULT_URL_TTL_S, OutputService
from controlplane.service.quality import QualityService
from controlplane.service.replay import ReplayService
from controlplane.service.routing_policies import RoutingPolicyService
from controlplane.service.tasks import TaskService
from controlplane.service.tenant_limits import TenantLimitsService, gauge_refresh
from controlplane.service.tenants import TenantAdmission, TenantBook, TenantConfigService
from controlplane.service.webhooks import WebhookSubscriptions
from controlplane.startup import (
    CALLBACK_LISTEN_FIX,
    check_adapters,
    check_listen,
    lock_sqlite,
    migrate,
    refuse,
)
from controlplane.storage import object_store_from_url
from controlplane.wakeups import LocalWakeBus, wake_bus_for
from controlplane.webhooks.config import WebhookPolicy, parse_networks, parse_webhooks_document
from controlplane.webhooks.delivery import DeliveryConfig, WebhookDeliveryWorker
from vidroute_core import logs as vidroute_logs
from vidroute_core import tracing
from vidroute_core.adapter import JobSnapshot, JobState, SubmitKind, SubmitOutcome
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.metrics_http import serve_metrics
from vidroute_core.settings import ControlPlaneEnv, SettingsError, file_of
from vidroute_core.timescale import (
    scale_durations,
    scale_value,
    scaled_defaults,
)
from vidroute_core.tls import TlsSettings
from vidroute_core.wire import tracing as tracing_edge
from vidroute_core.wire.listen import PortInUse

log = logging.getLogger(__name__)

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./var/vidroute.db"
DEFAULT_LISTEN = "127.0.0.1:8051"
SERVICE_NAME = "vidroute-controlplane"  # the traces' service.name
# A Redis that has not answered PING within this (times the time scale) is down for readiness.
READINESS_REDIS_TIMEOUT_S = 2.0
ROUTING_POLICY_VERSION = "router-v1"
COST_GAUGE_INTERVAL_S = 60.0  # the cost gauges are recomputed from the ledgers this often
QUALITY_REFRESH_S = 5.0  # routing re-reads the quality aggregates this often (9.14)
DEFAULT_SAFETY_POLICY = Path(__file__).with_name("safety_policy.yaml")


_TUNABLE = frozenset(
    f.name
    for f in dataclasses.fields(ExecutionConfig)
    if f.name not in ("worker_id", "callback_base_url", "polling")
)


def _tuning(raw: str) -> dict[str, Any]:
    """The JSON of VIDROUTE_EXECUTION_TUNING, restricted to scalar ExecutionConfig fields."""
    if not raw.strip():
        return {}
    values = json.loads(raw)
    if not isinstance(values, dict):
        raise ValueError("VIDROUTE_EXECUTION_TUNING must be a JSON object")
    unknown = set(values) - _TUNABLE
    if unknown:
        raise ValueError(f"VIDROUTE_EXECUTION_TUNING: unknown fields {sorted(unknown)}")
    return values


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the control plane is configured with."""

    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str | None = None
    broker_url: str | None = None  # VIDROUTE_BROKER_URL: nats://... wake-ups (else in-process)
    shard_count: int = 1  # VIDROUTE_SHARD_COUNT: dispatcher shards (PostgreSQL, every replica)
    # VIDROUTE_DISPATCH_BATCH_SIZE: tasks per dispatch round (None: DispatcherConfig's default)
    dispatch_batch_size: int | None = None
    listen: str = DEFAULT_LISTEN
    adapters: Mapping[str, str] = field(default_factory=dict)
    api_only: bool = False  # VIDROUTE_API_ONLY: serve without adapters (else refused at start)
    object_store_url: str = ""
    output_url_ttl_s: int = DEFAULT_URL_TTL_S  # VIDROUTE_OUTPUT_URL_TTL_S: presigned URLs
    callback_listen: str = ""
    callback_public_url: str = ""
    callback_secrets: Mapping[str, str] = field(default_factory=dict)
    time_scale: float = 1.0
    execution_tuning: Mapping[str, Any] = field(default_factory=dict)
    worker_id: str = ""
    log_level: str = "INFO"
    log_format: str = "json"  # VIDROUTE_LOG_FORMAT: json | text
    metrics_listen: str = ""  # off unless set
    console_listen: str = ""  # VIDROUTE_CONSOLE_LISTEN: the web console, off unless set
    migrate_on_start: bool = True
    health_probe_interval_s: float = 5.0
    adapter_submit_margin_s: float = 5.0
    adapter_submit_timeout_s: float = 0.0  # 0: derive from each sidecar's declared budget
    safety_policy_path: str = ""
    deadlines: DeadlinePolicy = field(default_factory=DeadlinePolicy)
    auth_tokens: Mapping[str, Caller] = field(default_factory=dict)  # sha256 hex -> caller
    adapter_tls: TlsSettings = field(default_factory=TlsSettings)  # VIDROUTE_TLS*
    otel_env: Mapping[str, str] = field(default_factory=dict)  # OTEL_*: vidroute_core.tracing
    billing: BillingPolicies = field(  # VIDROUTE_BILLING*
        default_factory=lambda: BillingPolicies(BillingPolicy.parse("postpaid"))
    )
    webhooks: WebhookPolicy = field(default_factory=WebhookPolicy)  # VIDROUTE_WEBHOOK*
    # VIDROUTE_ROUTING_POLICY_FILE: the routing policy used until one is published (else the
    # built-in example); validated at start like a publication (its schema and ranges).
    routing_policy: PolicyDocument | None = None
    # A lookup of each provider account's limits (9.11) that replaces the accounts document's
    # (a test's stack); None: the published accounts document's.
    limits_for: LimitsFor | None = None
    # VIDROUTE_TENANTS_FILE / VIDROUTE_ACCOUNTS_FILE: (path, text) of a document published at
    # start when its version is not published yet (k8s ships them as ConfigMaps); validated at
    # start like a publication, so a bad file stops the start with one line.
    tenants_file: StartDocument | None = None
    accounts_file: StartDocument | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """The settings `env` (``os.environ`` when None) declares (`ControlPlaneEnv`), then
        `overrides` (None: not overridden). `SettingsError`, one line, when the environment
        names an unknown ``VIDROUTE_*`` variable or a value the control plane cannot use."""
        env = os.environ if env is None else env
        declared = ControlPlaneEnv.load(env)
        try:
            values = _values(declared)
        except (ValueError, OSError) as exc:  # what a value means, past its type
            raise SettingsError(str(exc)) from exc
        values["otel_env"] = {k: v for k, v in env.items() if k.startswith("OTEL_")}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]  # values is dict[str, object]; each is checked as it is parsed


def _values(env: ControlPlaneEnv) -> dict[str, object]:
    """`Settings` fields from the declared variables."""
    default_deadlines = DeadlinePolicy()
    return {
        "database_url": env.database_url or DEFAULT_DATABASE_URL,
        "redis_url": env.redis_url or None,
        "broker_url": env.broker_url or None,
        "shard_count": env.shard_count,
        "dispatch_batch_size": env.dispatch_batch_size,
        "listen": env.listen or DEFAULT_LISTEN,
        "adapters": env.adapters,
        "api_only": env.api_only,
        "object_store_url": env.object_store,
        "output_url_ttl_s": env.output_url_ttl_s,
        "callback_listen": env.callback_listen,
        "callback_public_url": env.callback_public_url,
        "callback_secrets": env.callback_secrets,
        "time_scale": env.time_scale,
        "execution_tuning": _tuning(env.execution_tuning),
        "worker_id": env.worker_id,
        "log_level": env.log_level,
        "log_format": env.log_format or "json",
        "metrics_listen": env.metrics_listen,
        "console_listen": env.console_listen,
        "safety_policy_path": file_of(env.safety_policy),
        "deadlines": DeadlinePolicy(
            max_task_age_s=_or(env.max_task_age_s, default_deadlines.max_task_age_s),
            max_queue_delay_s=_or(env.max_queue_delay_s, default_deadlines.max_queue_delay_s),
        ),
        "auth_tokens": _auth(env),
        "adapter_tls": TlsSettings.build(
            mode=env.tls,
            cert_file=env.tls_cert_file,
            key_file=env.tls_key_file,
            ca_file=env.tls_ca_file,
            server_name=env.tls_server_name,
        ),
        "billing": _billing(env),
        "webhooks": _webhooks(env),
        "routing_policy": _routing_policy(env),
        "tenants_file": _start_document(
            "VIDROUTE_TENANTS_FILE", env.tenants_file, parse_tenants_document
        ),
        "accounts_file": _start_document(
            "VIDROUTE_ACCOUNTS_FILE", env.accounts_file, parse_accounts_document
        ),
        "adapter_submit_margin_s": env.adapter_submit_margin_s,
        "adapter_submit_timeout_s": env.adapter_submit_timeout_s,
    }


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _lines(path: Path | None) -> list[str]:
    return [] if path is None else path.read_text(encoding="utf-8").splitlines()


def _billing(env: ControlPlaneEnv) -> BillingPolicies:
    """The VIDROUTE_BILLING* variables; a malformed policy is an error at start."""
    lines = [env.billing_tenants, *_lines(env.billing_file)]
    return BillingPolicies.parse(env.billing_policy, lines)


@dataclass(frozen=True, slots=True)
class StartDocument:
    """A document file named by a setting: where it is and its text."""

    path: str
    text: str


def _usage_source(runtime: SchedulingRuntime, leases: LeaseStore, book: AccountBook) -> UsageSource:
    """Each account's limits against its use now, over the dispatcher's catalog."""
    dc = runtime.dispatcher.config.default_concurrency

    async def usage() -> list[AccountUsage]:
        await book.current()
        catalog = await runtime.dispatcher.catalog()
        return await account_usage(leases, catalog.candidates, dc, book.limits_for)

    return usage


def _start_document(
    name: str, path: Path | None, parse: Callable[[str], object]
) -> StartDocument | None:
    """The file's path and text, its document checked now (ValueError naming the variable)."""
    if path is None:
        return None
    text = path.read_text(encoding="utf-8")
    try:
        parse(text)
    except InvalidSpec as exc:
        problems = "; ".join(f"{v.field}: {v.description}" for v in exc.violations)
        raise ValueError(f"{name} {path}: {problems}") from exc
    return StartDocument(str(path), text)


async def publish_start_documents(
    settings: Settings, tenants: TenantConfigService, accounts: AccountConfigService
) -> None:
    """Publish the VIDROUTE_TENANTS_FILE / VIDROUTE_ACCOUNTS_FILE documents whose version is
    not published yet; a published version is left as it is (active or rolled back: an
    operator's rollback survives a restart). Every replica may try: a publication is
    idempotent per version and serialised by its lock."""
    for name, file, service in (
        ("VIDROUTE_TENANTS_FILE", settings.tenants_file, tenants),
        ("VIDROUTE_ACCOUNTS_FILE", settings.accounts_file, accounts),
    ):
        if file is None:
            continue
        caller = Caller.admin(name)
        try:
            row = await service.publish(file.text, source=file.path, caller=caller)
        except InvalidSpec as exc:  # the same version published with another text
            problems = "; ".join(f"{v.field}: {v.description}" for v in exc.violations)
            refuse(f"{name} {file.path}: {problems}")
        log.info("%s %s: version %s published", name, file.path, row.version)


def _routing_policy(env: ControlPlaneEnv) -> PolicyDocument | None:
    path = env.routing_policy_file
    if path is None:
        return None
    try:
        return parse_policy_document(path.read_text(encoding="utf-8"))
    except InvalidSpec as exc:
        problems = "; ".join(f"{v.field}: {v.description}" for v in exc.violations)
        raise ValueError(f"VIDROUTE_ROUTING_POLICY_FILE {path}: {problems}") from exc


def _webhooks(env: ControlPlaneEnv) -> WebhookPolicy:
    """Caller webhooks: the tenants' file and what receivers may be (see the module docstring)."""
    path = env.webhooks_file
    try:
        text = path.read_text(encoding="utf-8") if path else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"VIDROUTE_WEBHOOKS_FILE {path}: cannot be read ({exc})") from exc
    return parse_webhooks_document(
        text,
        allow_http=env.webhook_allow_http,
        allow_private=env.webhook_allow_private,
        private_allowlist=parse_networks(env.webhook_private_allowlist),
    )


def _webhook_worker(
    settings: Settings, db: Database, cleanup: list[Callable[[], Awaitable[Any]]]
) -> WebhookDeliveryWorker | None:
    """The caller-webhook delivery worker, when any tenant can have webhooks; every replica
    runs one (claims are SKIP LOCKED). Its HTTP client is its own: it never follows redirects
    and talks only to the addresses it checked."""
    if not settings.webhooks.tenants:
        return None
    config = scale_durations(DeliveryConfig(), settings.time_scale)
    http = httpx.AsyncClient(follow_redirects=False)
    tracing_edge.instrument_httpx(http)
    cleanup.append(http.aclose)
    worker = WebhookDeliveryWorker(WebhookStore(db), settings.webhooks, http, config=config)
    worker.start()
    return worker


def _cached_catalog(db: Database, refresh_s: float) -> Callable[[], Awaitable[CapabilityCatalog]]:
    """An API-only replica's catalog for CreateTask's estimates, re-read when `refresh_s` old."""
    queries = CatalogQueries(db)
    held: list[tuple[float, CapabilityCatalog]] = []

    async def current() -> CapabilityCatalog:
        now = time.monotonic()
        if not held or now - held[0][0] > refresh_s:
            held[:] = [(now, await load_catalog(queries, _utcnow()))]
        return held[0][1]

    return current


def _auth(env: ControlPlaneEnv) -> dict[str, Caller]:
    """The callers of the VIDROUTE_AUTH* variables; malformed entries are an error."""
    tokens = {} if env.auth == "off" else parse_entries([env.auth_tokens, *_lines(env.auth_file)])
    if env.auth == "required" and not tokens:
        raise ValueError("VIDROUTE_AUTH=required but no VIDROUTE_AUTH_TOKENS / VIDROUTE_AUTH_FILE")
    return tokens


def load_safety_policy(path: str = "") -> SafetyPolicy:
    """The safety policy at `path` (the shipped default when empty); malformed is an error."""
    source = Path(path) if path else DEFAULT_SAFETY_POLICY
    doc = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    return SafetyPolicy.from_mapping(doc)


def configure_logging(level: str, fmt: str = "json") -> None:
    """The control plane's logging: redacted, with the id chain (`vidroute_core.logs`)."""
    vidroute_logs.configure_logging(level, fmt)


async def publish_from_adapters(
    runtime: SchedulingRuntime,
    adapters: Mapping[str, GrpcAdapterClient],
    addresses: Mapping[str, str],
) -> int:
    """Publish every adapter's Describe entries (the capability matrix's live source).

    Accounts come from the entries themselves; their credentials stay in the sidecars, so the
    stored reference only names where they live.
    """
    documents: list[dict[str, Any]] = []
    accounts: dict[tuple[str, str, str], AccountConfig] = {}
    described: dict[str, list[tuple[str, str, str]]] = {}
    for provider, client in adapters.items():
        for entry in (await client.describe()).capability_documents:
            name, account, region = entry["provider"], entry["account"], entry.get("region", "")
            described.setdefault(provider, []).append((name, account, entry["model"]))
            documents.append(dict(entry))
            key = (name, account, region)
            accounts[key] = AccountConfig(
                provider=name,
                account_name=account,
                region=region,
                credential_ref=f"sidecar:{provider}",
                adapter_address=addresses[provider],
            )
    counts = await publish_documents(
        runtime.db, documents, accounts.values(), now=_utcnow(), source="describe"
    )
    # The upsert above wrote each described account ACTIVE with the sidecar's reference: the
    # active accounts document's settings of them go back on top.
    await AccountConfigService(runtime.db, AccountBook(runtime.db)).reapply(_utcnow())
    for provider in adapters:  # what readiness waits for (an adapter may describe nothing)
        runtime.dispatcher.readiness.described(provider, described.get(provider, []))
    await runtime.dispatcher.catalog(refresh=True)
    log.info("published capabilities from %d adapters: %s", len(adapters), counts)
    return len(documents)


def _utcnow() -> datetime:
    return datetime.now(UTC)


# Which execution step consumes which outbox topic: a wake-up of the topic runs it now.
WORKER_TOPICS = {Topic.SUBMIT: "submit", Topic.CANCEL: "cancel", Topic.OUTPUT_FETCH: "output"}


async def _wakeups(
    settings: Settings, cleanup: list[Callable[[], Awaitable[Any]]]
) -> tuple[Database, LocalWakeBus]:
    """The database and the wake-up bus (`controlplane.wakeups`) it hands each committed outbox
    topic to: the topic wakes its consumers here and, with ``VIDROUTE_BROKER_URL``, in every
    replica; polling stays what is relied on."""
    bus = wake_bus_for(settings.broker_url, settings.database_url)
    db = Database.from_url(settings.database_url, after_commit=bus.notify)
    await bus.start()
    cleanup.append(bus.close)
    return db, bus


def _subscribe(bus: LocalWakeBus, runtime: SchedulingRuntime, execution: ExecutionEngine) -> None:
    """The dispatchers on the queue topics; the execution steps on theirs, where the engine
    takes wake-ups."""
    runtime.subscribe(bus)
    wake = getattr(execution, "wake", None)
    if wake is None:  # an engine without the seam: its steps poll
        return
    for topic, step in WORKER_TOPICS.items():
        bus.subscribe(topic, functools.partial(wake, step))


async def _publish_until_done(
    runtime: SchedulingRuntime,
    adapters: Mapping[str, GrpcAdapterClient],
    addresses: Mapping[str, str],
    stop: asyncio.Event,
    time_scale: float = 1.0,
) -> None:
    """Retry publication until every adapter answered (sidecars may start after us)."""
    delay, longest = 0.5 * time_scale, 10.0 * time_scale
    while not stop.is_set():
        try:
            await publish_from_adapters(runtime, adapters, addresses)
            runtime.wake()
            return
        except PublishError:
            log.exception("an adapter described capabilities that fail validation")
            return
        except Exception as exc:  # an adapter not up yet: try again
            log.info("capability publication waiting for adapters: %r", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, longest)


def _breaker_feed(runtime: SchedulingRuntime) -> SubmitObserver:
    """Submit outcomes -> the SUBMIT breaker and health windows of that candidate."""

    async def observe(
        account: AccountInfo, attempt: AttemptRecord, result: SubmitOutcome, took_s: float
    ) -> None:
        key = BreakerKey(
            account.provider,
            account.account_name,
            account.region,
            attempt.provider_model,
            Operation.SUBMIT,
        )
        failure = None if result.error is None else result.error.error_class.value
        if result.kind is SubmitKind.ACCEPTED:
            failure = None
        await runtime.monitor.record_outcome(
            key, failure, took_s, holder=attempt.client_request_key
        )

    return observe


def health_feed(monitor: HealthMonitor) -> AttemptEndObserver:
    """Finished provider jobs -> the routing health windows of their candidate (9.13.3), at
    the attempt's settled cost (`money.actual_cost`: the provider's figure, or its billing
    rule's, e.g. nothing for a failed Veo job), its estimate where neither says: what the
    rebuild from PostgreSQL reads for the same job (`HealthMonitor`)."""

    async def observe(account: AccountInfo, attempt: AttemptRecord, snapshot: JobSnapshot) -> None:
        key = BreakerKey(
            account.provider,
            account.account_name,
            account.region,
            attempt.provider_model,
            Operation.SUBMIT,
        )
        started = attempt.request_started_at or attempt.created_at
        monitor.observe_generation(
            key,
            succeeded=snapshot.state is JobState.SUCCEEDED,
            duration_s=max(0.0, (attempt.updated_at - started).total_seconds()),
            cost_micros=observed_cost(attempt.actual_cost_micros, attempt.estimated_cost_micros),
        )

    return observe


def dispatcher_config(settings: Settings) -> DispatcherConfig:
    """The shipped dispatcher configuration for `settings`, before the time scale: its shard
    count and batch size, and a round's queue-head read of at least two batches."""
    default = DispatcherConfig()
    batch = settings.dispatch_batch_size or default.batch_size
    return DispatcherConfig(
        shard_count=settings.shard_count,
        batch_size=batch,
        scan_limit=max(default.scan_limit, 2 * batch),
    )


def _metrics(
    settings: Settings, cleanup: list[Callable[[], Awaitable[Any]]]
) -> ControlPlaneMetrics:
    """This process's metrics, served on ``VIDROUTE_METRICS_LISTEN`` when set; and its tracing,
    configured here because it must be before any server or client is built (they are
    instrumented only if tracing is on)."""
    tracing.configure_tracing(SERVICE_NAME, settings.otel_env)
    metrics = ControlPlaneMetrics()
    if settings.metrics_listen:
        cleanup.append(serve_metrics(metrics.registry, settings.metrics_listen).stop)
    return metrics


def _http_client(scale: float) -> httpx.AsyncClient:
    """The control plane's HTTP client (output downloads), traced when tracing is on. Its
    timeouts scale with the rest but never fall under the host's own noise
    (`HOST_NOISE_FLOOR_S`): at scale 0.02 a 5 s connect would be 0.1 s, which a loaded machine
    misses even on loopback."""
    read = max(30.0 * scale, HOST_NOISE_FLOOR_S)
    connect = max(5.0 * scale, HOST_NOISE_FLOOR_S)
    http = httpx.AsyncClient(timeout=httpx.Timeout(read, connect=connect))
    tracing_edge.instrument_httpx(http)
    return http


def _cost_gauges(
    settings: Settings, db: Database, metrics: ControlPlaneMetrics, tenants: TenantLimitsService
) -> list[Callable[[], Awaitable[Any]]]:
    """9.24's cost families, recomputed from the ledgers once per period while /metrics is on,
    and on the same period the tenants' limits and use; returns the background stops (the
    refresher's) that shutdown runs before the cleanup."""
    if not settings.metrics_listen:
        return []
    costs = CostGaugeRefresher(
        db,
        metrics,
        interval_s=scale_value(COST_GAUGE_INTERVAL_S, settings.time_scale),
        deltas=lambda: delta_by_provider(db),
        also=[gauge_refresh(tenants, metrics.tenant_limits)],
        discrepancies=DiscrepancyCounter(db),
    )
    costs.start()
    return [costs.stop]


def _state_sources(
    runtime: SchedulingRuntime, leases: LeaseStore, usage: UsageSource
) -> StateSources:
    """What the metrics read at scrape time on a scheduling replica: its lease store, windows,
    breakers and accounts (the breaker and drift events are the runtime's, given at its
    construction). The runtime takes the metrics, so the collector over these is registered
    once the runtime is built (`_start`), whole."""
    return StateSources(
        loop=asyncio.get_running_loop(),
        leases=lambda: lease_gauges(leases),
        windows=lambda: window_gauges(leases),
        circuits=lambda: circuit_gauges(runtime.monitor.statuses()),
        accounts=usage,
    )


async def _lease_store(
    settings: Settings, cleanup: list[Callable[[], Awaitable[Any]]]
) -> tuple[LeaseStoreFactory, Redis | None]:
    """The lease store's factory (the scheduling runtime builds it with its hooks) and the
    Redis client it uses, if any."""
    scale = settings.time_scale
    if not settings.redis_url:
        return functools.partial(MemoryLeaseStore, **scaled_defaults(MemoryLeaseStore, scale)), None
    client = redis_client(settings.redis_url, scale_durations(RedisClientConfig(), scale))
    cleanup.append(client.aclose)
    store = functools.partial(RedisLeaseStore, client, **scaled_defaults(RedisLeaseStore, scale))
    return store, client


def _rate_limiter(
    settings: Settings, client: Redis | None, cleanup: list[Callable[[], Awaitable[Any]]]
) -> RateLimiter:
    """CreateTask's per-tenant rate limits: shared through the Redis of the leases (a client of
    their own on an API-only replica), else this process's buckets."""
    if not settings.redis_url:
        return InProcessRateLimiter()
    if client is None:
        scale = settings.time_scale
        client = redis_client(settings.redis_url, scale_durations(RedisClientConfig(), scale))
        cleanup.append(client.aclose)
    return RedisRateLimiter(client)


def _bind_callback_ingress(settings: Settings, scale: float) -> CallbackServer | None:
    """The callback ingress, bound now: the callback URL sent to providers names its port."""
    if not settings.callback_listen:
        return None
    host, _, port = settings.callback_listen.rpartition(":")
    ingress = CallbackServer(host.strip("[]"), int(port), scale_durations(CallbackLimits(), scale))
    ingress.bind()
    return ingress


async def _start_console(
    listen: str, console: Console, scale: float
) -> Callable[[], Awaitable[None]]:
    """The web console on `listen` (checked free at start); returns its stop."""
    server = ConsoleServer(listen, shutdown_grace_s=5.0 * scale)
    await server.start(console.app)
    return server.stop


def _catalog_refresher(runtime: SchedulingRuntime) -> Callable[[], Awaitable[None]]:
    """After PublishCapabilities: this replica routes on the new catalog now (others within
    their refresh period), and queued tasks get a dispatch round."""

    async def refresh() -> None:
        await runtime.dispatcher.catalog(refresh=True)
        runtime.wake()

    return refresh


def _catalog_ready() -> str | None:
    return None


@dataclass
class _Readiness:
    """The readiness probe: PostgreSQL and Redis answer, and the catalog is ready (a raise, like
    False, is NOT_SERVING; liveness is unaffected). Built whole once the scheduling runtime
    exists; an API-only replica has no `redis` and the default `not_ready`."""

    db: Database
    redis_timeout_s: float
    redis: Redis | None = None
    not_ready: Callable[[], str | None] = _catalog_ready
    # Per-provider readiness (issue 20): the sidecars' Describe, and what routing saw.
    reachability: AdapterReachability | None = None
    adapters: Mapping[str, GrpcAdapterClient] = field(default_factory=dict)
    adapter_timeout_s: float = 10.0

    async def probe(self) -> bool:
        await self.db.ping()
        if self.redis is not None:
            await asyncio.wait_for(self.redis.ping(), self.redis_timeout_s)
        return self.not_ready() is None

    async def adapters_probe(self) -> dict[str, bool]:
        """Each adapter's health service name -> whether its sidecar answers now."""
        if self.reachability is None:
            return {}
        await self.reachability.probe(self.adapters, self.adapter_timeout_s)
        return {service_name(p): why is None for p, why in self.reachability.statuses().items()}


def check_ports(settings: Settings, *, engine: bool | None = None) -> None:
    """Refuse (one line, exit 78) when a port this configuration listens on is taken: gRPC,
    the callback ingress (it runs with the engine: when there are adapters, unless `engine`
    says), the console. Holds nothing."""
    check_listen(settings.listen)
    if settings.callback_listen and (bool(settings.adapters) if engine is None else engine):
        check_listen(settings.callback_listen, CALLBACK_LISTEN_FIX)
    if settings.console_listen:
        check_listen(settings.console_listen, CONSOLE_LISTEN_FIX)


async def start_control_plane(settings: Settings) -> ControlPlaneServer:
    """Refuse a configuration that cannot work (one line, exit status 78: `controlplane.startup`:
    no adapters outside an API-only replica, an SQLite file another control plane holds, a busy
    port), then migrate (if asked), wire the services and start serving."""
    check_adapters(settings.adapters, settings.api_only)
    check_ports(settings)  # before any worker starts; the binds check again
    lock = lock_sqlite(settings.database_url)
    try:
        return await _start(settings, [] if lock is None else [lock.release])
    except BaseException:
        if lock is not None:
            await lock.release()
        raise


async def _start(  # noqa: PLR0915 - the composition root, one line per part
    settings: Settings, release: list[Callable[[], Awaitable[Any]]]
) -> ControlPlaneServer:
    if settings.migrate_on_start:
        await migrate(settings.database_url)  # a database that does not answer: refused
    cleanup: list[Callable[[], Awaitable[Any]]] = []
    db, wakeups = await _wakeups(settings, cleanup)
    metrics = _metrics(settings, cleanup)
    if settings.metrics_listen:
        count_statements(db.engine, lambda stage, kind: metrics.db_work.labels(stage, kind).inc())
    tenant_book = TenantBook(db)  # the published tenants document: CreateTask and dispatch
    tenant_limits = TenantLimitsService(db, tenant_book)
    # Stopped first, before the cleanup.
    background = _cost_gauges(settings, db, metrics, tenant_limits)

    redis: Redis | None = None  # the leases' (and the rate limits'), when configured
    probe_parts: dict[str, Any] = {}  # the scheduling runtime's part of the readiness probe

    # Also on an API-only replica: GetOutput and GetOutputUrl read the store.
    object_store = object_store_from_url(
        settings.object_store_url or (Path.cwd() / "var" / "objects").as_uri()
    )
    canceller = None
    admin = None
    monitor: HealthMonitor | None = None  # the console's health and breaker views
    lease_store: LeaseStore | None = None
    # Scheduled activations of published documents, applied on time by whichever replica
    # gets there first (every replica runs one; `service.activator`); kicked by a schedule here.
    scheduled = asyncio.Event()
    # API only: no catalog here to compile against, so a file with samples or canaries is refused.
    routing_policies = RoutingPolicyService(db, require_check=True, on_schedule=scheduled.set)
    account_book = AccountBook(db)  # the published accounts document: dispatch and leases
    usage: UsageSource = no_usage
    state = StateSources()  # an API-only replica's scrape-time gauges: the families, no rows
    catalog: Callable[[], Awaitable[CapabilityCatalog]] | None = None
    published: Callable[[], Awaitable[None]] | None = None  # PublishCapabilities' hook
    samples: SampleCompiler | None = None  # a release's sample compile on the live sidecars
    scale = settings.time_scale
    log.info("time scale %g: every duration of the control plane multiplied by it", scale)
    if settings.adapters:
        lease_factory, redis = await _lease_store(settings, cleanup)
        worker = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        adapter_timing = scaled_defaults(GrpcAdapterClient, scale)
        adapter_timing["submit_margin_s"] = settings.adapter_submit_margin_s * scale
        adapter_timing["submit_timeout_s"] = settings.adapter_submit_timeout_s * scale or None
        adapters = {
            name: adapter_client(settings.adapter_tls, addr, adapter_timing)
            for name, addr in settings.adapters.items()
        }
        cleanup.extend(client.close for client in adapters.values())
        runtime = build_scheduling(
            db=db,
            database_url=settings.database_url,
            leases=lease_factory,
            adapters=adapters,
            policy=scale_durations(example_policy(ROUTING_POLICY_VERSION), scale),
            redis_client=redis,
            worker_id=worker,
            breaker_config=scale_durations(BreakerConfig(), scale),
            config=scale_durations(dispatcher_config(settings), scale),
            upkeep_config=scale_durations(
                UpkeepConfig(default_concurrency=DispatcherConfig().default_concurrency), scale
            ),
            load_config=scale_durations(LoadConfig(), scale),
            quality=QualityBook(
                db, refresh_s=QUALITY_REFRESH_S * scale, sink=metrics.quality_ratios
            ),
            policy_file=settings.routing_policy,
            policy_transform=lambda p: scale_durations(p, scale),
            canary_config=scale_durations(CanaryGateConfig(time_scale=scale), scale),
            tenants=tenant_book,
            time_scale=scale,
            limits_for=settings.limits_for,
            accounts=account_book,
            readiness=CatalogReadiness(frozenset(settings.adapters)),
            metrics=metrics,
        )
        leases = runtime.leases
        usage = _usage_source(runtime, leases, account_book)
        state = _state_sources(runtime, leases, usage)
        routing_policies = RoutingPolicyService(
            db,
            sample_check=SampleCheck(runtime.dispatcher),
            on_published=runtime.wake_canaries,
            on_schedule=scheduled.set,
        )
        admin = runtime.admin
        monitor, lease_store = runtime.monitor, leases
        probe_parts = {
            "not_ready": runtime.dispatcher.not_ready,
            "reachability": runtime.reachability,
            "adapters": adapters,
            # The sidecar client's own RPC deadline: a probe must not call a loaded sidecar gone.
            "adapter_timeout_s": adapter_timing["timeout_s"],
        }
        catalog = runtime.dispatcher.catalog
        # An operator's release check may wait longer than a dispatch round (3x its deadline),
        # and never less than a one-shot action's floor, per call and for the whole check: at
        # time factor 0.02 both were 0.6 s, which a sidecar on a loaded machine missed for a
        # release's samples. Its own clients, so the dispatcher's deadlines stay as they are.
        check_adapters = {
            name: adapter_client(settings.adapter_tls, addr, one_shot_timing(adapter_timing))
            for name, addr in settings.adapters.items()
        }
        cleanup.extend(client.close for client in check_adapters.values())
        samples = SampleCompiler(
            check_adapters,
            timeout_s=max(3 * runtime.dispatcher.config.compile_timeout_s, ONE_SHOT_MIN_DEADLINE_S),
        )
        published = _catalog_refresher(runtime)
        http = _http_client(scale)
        cleanup.append(http.aclose)
        ingress = _bind_callback_ingress(settings, scale)
        if ingress is not None:
            background.append(ingress.stop)
        execution = ExecutionEngine(
            db,
            adapters,
            config=scale_durations(
                ExecutionConfig(
                    **settings.execution_tuning,
                    worker_id=worker,
                    callback_base_url=settings.callback_public_url
                    or (ingress.url if ingress else ""),
                ),
                scale,
            ),
            leases=leases,
            fetch=fetcher_for(http, object_store),
            on_submit=chain(_breaker_feed(runtime), submit_observer(metrics)),
            breakers=runtime.monitor,
            durations=runtime.monitor,
            on_attempt_end=chain(health_feed(runtime.monitor), attempt_end_observer(metrics)),
            lease_source=lease_source(runtime.dispatcher),
            usage_declared=usage_declared(runtime.dispatcher),
        )
        canceller = execution.cancel_service
        _subscribe(wakeups, runtime, execution)
        stop_publishing = asyncio.Event()
        publisher = asyncio.create_task(
            _publish_until_done(runtime, adapters, settings.adapters, stop_publishing, scale),
            name="publish-capabilities",
        )

        async def stop_publisher() -> None:
            stop_publishing.set()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher

        if ingress is not None:
            with labelled("callback"):
                await ingress.start(
                    CallbackReceiver(
                        verifier=CallbackVerifier(
                            settings.callback_secrets,
                            clock=_utcnow,
                            **scaled_defaults(CallbackVerifier, scale),
                        ),
                        deps=execution.deps,
                        normalizer=execution.normalizer,
                    )
                )
        with labelled("dispatch"):  # the dispatcher's and upkeep's tasks inherit the label
            runtime.start()
        await execution.start()
        # Stopped first, in order: stop taking new work, finish in-flight steps, then I/O.
        background[:0] = [stop_publisher, runtime.stop, execution.stop]

    metrics.registry.register(StateCollector(state))  # the runtime's parts exist by now
    readiness = _Readiness(
        db, READINESS_REDIS_TIMEOUT_S * settings.time_scale, redis=redis, **probe_parts
    )
    webhook_worker = _webhook_worker(settings, db, cleanup)
    if webhook_worker is not None:
        background.append(webhook_worker.stop)
        wakeups.subscribe(Topic.WEBHOOK, webhook_worker.wake)
    safety = load_safety_policy(settings.safety_policy_path)
    log.info("safety policy %s loaded", safety.version)
    tasks = TaskService(
        db,
        canceller=canceller,
        safety=safety,
        deadlines=scale_durations(settings.deadlines, scale),
        billing=settings.billing,
        catalog=catalog or _cached_catalog(db, DispatcherConfig().catalog_refresh_s * scale),
        webhooks=WebhookSubscriptions(settings.webhooks),
        tenants=TenantAdmission(db, tenant_book, limiter=_rate_limiter(settings, redis, cleanup)),
    )
    outputs = OutputService(tasks, object_store, url_ttl_s=settings.output_url_ttl_s)
    capability_admin = CapabilityPublishService(db, on_published=published, samples=samples)
    servicer = SchedulerServicer(tasks, admin, capabilities=capability_admin, outputs=outputs)
    tenant_configs = TenantConfigService(db, tenant_book, safety=safety, on_schedule=scheduled.set)
    account_service = AccountConfigService(db, account_book, usage=usage, on_schedule=scheduled.set)
    if settings.console_listen:
        console = Console(
            Authenticator(settings.auth_tokens),
            ConsoleReads(tasks, db, providers=admin, monitor=monitor, leases=lease_store),
            outputs=outputs,
            billing=BillingService(db),
            tenants=tenant_limits,
            accounts=account_service,
        )
        background.append(await _start_console(settings.console_listen, console, scale))
    activator = DocumentActivator(
        [tenant_configs.documents, account_service.documents, routing_policies.documents],
        poll_s=ACTIVATION_POLL_S * scale,
        kicked=scheduled,
    )
    activator.start()
    background.append(activator.stop)
    stops = [*background, *cleanup, db.dispose, *release]
    try:
        await publish_start_documents(settings, tenant_configs, account_service)
        with labelled("api"):  # the server's handler tasks inherit the label
            return await _serve(
                settings,
                servicer,
                readiness=readiness,
                stops=stops,
                metrics=metrics,
                db=db,
                routing_policies=routing_policies,
                tenants=tenant_configs,
                accounts=account_service,
            )
    except PortInUse as exc:
        for close in stops:
            with contextlib.suppress(Exception):
                await close()
        refuse(str(exc))


async def _serve(
    settings: Settings,
    servicer: SchedulerServicer,
    *,
    readiness: _Readiness,
    stops: list[Callable[[], Awaitable[Any]]],
    metrics: ControlPlaneMetrics,
    db: Database,
    routing_policies: RoutingPolicyService | None = None,
    tenants: TenantConfigService | None = None,
    accounts: AccountConfigService | None = None,
) -> ControlPlaneServer:
    scale = settings.time_scale
    policies = routing_policies or RoutingPolicyService(db)
    return await start_server(
        servicer,
        listen=settings.listen,
        probe=readiness.probe,
        adapter_probe=readiness.adapters_probe,
        cleanup=stops,
        probe_interval=scale_value(settings.health_probe_interval_s, scale),
        auth=Authenticator(settings.auth_tokens),
        interceptors=[*tracing_edge.server_interceptors(), metrics.interceptor()],
        billing=BillingServicer(BillingService(db)),
        routing=RoutingServicer(
            quality=QualityService(db),
            policies=policies,
            # A replayed policy file is validated as a published one (its samples compiled).
            replay=ReplayService(db, validate=policies.validate),
        ),
        tenants=TenantServicer(tenants or TenantConfigService(db, TenantBook(db))),
        accounts=AccountServicer(accounts or AccountConfigService(db, AccountBook(db))),
    )
