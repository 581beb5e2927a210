"""Every ``VIDROUTE_*`` environment variable, declared once with its type and meaning.

One environment often holds the variables of several programs: ``vidroute up`` passes its own to
the sidecars it starts, a shell holds the CLI's beside the server's, ``make test`` sets the test
suite's. So the names are declared here, in the kernel every deployable installs, per program:

* `ControlPlaneEnv`: ``vidroute serve`` / ``up`` / ``migrate`` (read in `controlplane.bootstrap`);
* `SidecarEnv`: each adapter sidecar (read in `adapter_sidecars.common.cli`);
* `ClientEnv`: the ``vidroute`` client commands and the SDK (`clients.cli_config`);
* `OTHER_PROGRAMS`: names that only the test suite, the benchmarks or a credential reference read.

A program validates its own class (`load`) and refuses any set ``VIDROUTE_*`` name that no
class or `OTHER_PROGRAMS` declares (`check_names`): a typo such as ``VIDROUTE_DATABSE_URL``
would otherwise be ignored and the default served. Both raise `SettingsError`, whose text is one
line naming the variable. An empty value is the same as unset. The values are parsed by
pydantic-settings; what a value means beyond its type (``VIDROUTE_AUTH_TOKENS`` entries, the
billing policies, the webhooks file) is parsed by the program's composition root.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BeforeValidator, Field, FilePath, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

PREFIX = "VIDROUTE_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Variables whose value an error message never repeats.
SECRET_VALUES = frozenset({"VIDROUTE_CALLBACK_SECRETS", "VIDROUTE_AUTH_TOKENS", "VIDROUTE_TOKEN"})
MAX_PRESIGN_S = 7 * 24 * 3600  # SigV4's limit on a presigned URL (controlplane.storage.base)


class SettingsError(ValueError):
    """The environment does not configure this program; ``str()`` is one line naming why."""


def _upper(value: object) -> object:
    return value.strip().upper() if isinstance(value, str) else value


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


def _pairs(value: object) -> object:
    """``a=x,b=y`` -> ``{"a": "x", "b": "y"}``."""
    if not isinstance(value, str):
        return value
    out: dict[str, str] = {}
    for n, item in enumerate(filter(None, (part.strip() for part in value.split(","))), 1):
        key, sep, val = item.partition("=")
        if not sep or not key.strip() or not val.strip():  # the item is not echoed: a secret?
            raise ValueError(f"expected name=value,... but item {n} is not name=value")
        out[key.strip()] = val.strip()
    return out


LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(_upper)
]
Pairs = Annotated[dict[str, str], NoDecode, BeforeValidator(_pairs)]
Seconds = Annotated[float, Field(ge=0)]
Timeout = Annotated[float | None, Field(gt=0)]


class _MappingEnv(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._environ.items() if v != ""}


class _Env(BaseSettings):
    """The variables of one program; build it with `load`, which validates every value."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, extra="forbid", frozen=True, env_ignore_empty=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # `load` reads the environment it is given (the composition root's); nothing else.
        return (init_settings,)

    @classmethod
    def load(cls, environ: Mapping[str, str], *, check: bool = True) -> Self:
        """This program's variables from `environ`, after `check_names` (unless `check` is
        false: the caller checks later); `SettingsError` names unknown names or bad values."""
        if check:
            check_names(environ, prefer=cls.variables())
        try:
            return cls(**_MappingEnv(cls, environ)())
        except ValidationError as exc:
            raise SettingsError(_one_line(exc)) from None

    @classmethod
    def variables(cls) -> dict[str, FieldInfo]:
        """Variable name -> its declaration."""
        return {PREFIX + name.upper(): info for name, info in cls.model_fields.items()}


def _one_line(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        name = PREFIX + str(error["loc"][0]).upper() if error["loc"] else "environment"
        shown = "" if name in SECRET_VALUES else f"={error.get('input')!r}"
        problems.append(f"{name}{shown}: {error['msg']}")
    return "; ".join(problems)


class _Common(_Env):
    """What the control plane and the sidecars both read."""

    log_level: LogLevel = Field("INFO", description="logging level: " + ", ".join(LOG_LEVELS))
    log_format: Annotated[Literal["json", "text"] | None, BeforeValidator(_lower)] = Field(
        None, description="json (default; text for vidroute up) or text"
    )
    metrics_listen: str = Field("", description="host:port of the Prometheus /metrics endpoint")
    time_scale: float = Field(
        1.0, gt=0, le=1, description="tests and make up: multiplies every duration, in (0, 1]"
    )
    tls: Annotated[Literal["", "on", "off"], BeforeValidator(_lower)] = Field(
        "", description="mTLS to/from the sidecars: '' (when the files are set), on, off"
    )
    tls_cert_file: str = Field("", description="PEM certificate (chain) of this process")
    tls_key_file: str = Field("", description="its PEM private key")
    tls_ca_file: str = Field("", description="PEM CA bundle the peer must chain to")


class ControlPlaneEnv(_Common):
    """``vidroute serve`` / ``up`` / ``migrate`` (`controlplane.bootstrap` documents each)."""

    # '' for these two: the composition root's defaults (embedded SQLite under ./var, loopback).
    database_url: str = Field("", description="SQLAlchemy async URL")
    redis_url: str = Field("", description="Redis for leases and shared breakers; '': in-process")
    broker_url: str = Field("", description="nats://host:port wake-ups across replicas")
    shard_count: int = Field(
        1, ge=1, le=1024, description="dispatcher shards, same on every replica"
    )
    dispatch_batch_size: int | None = Field(
        None, ge=1, le=4096, description="tasks one dispatch round routes and writes at once"
    )
    listen: str = Field("", description="gRPC listen address")
    adapters: Pairs = Field(default_factory=dict, description="provider=host:port,... sidecars")
    api_only: bool = Field(False, description="serve the API without adapters")
    object_store: str = Field("", description="file:///path or s3://bucket/prefix?...")
    output_url_ttl_s: int = Field(3600, ge=1, le=MAX_PRESIGN_S, description="presigned URL life")
    callback_listen: str = Field("", description="host:port of the provider callback ingress")
    callback_public_url: str = Field("", description="the callback URL sent to providers")
    callback_secrets: Pairs = Field(default_factory=dict, description="provider=secret,...")
    webhooks_file: FilePath | None = Field(None, description="YAML of caller webhooks per tenant")
    webhook_allow_http: bool = Field(False, description="caller webhooks may be plain http")
    webhook_allow_private: bool = Field(False, description="caller webhooks may reach private nets")
    webhook_private_allowlist: str = Field("", description="private networks webhooks may reach")
    execution_tuning: str = Field("", description="JSON object overriding ExecutionConfig")
    safety_policy: FilePath | None = Field(None, description="platform safety policy YAML")
    routing_policy_file: FilePath | None = Field(None, description="routing policy until published")
    tenants_file: FilePath | None = Field(
        None, description="tenants document, published at start when its version is new"
    )
    accounts_file: FilePath | None = Field(
        None, description="accounts document, published at start when its version is new"
    )
    max_task_age_s: Seconds | None = Field(None, description="task deadline; 0: none")
    max_queue_delay_s: Seconds | None = Field(None, description="longest wait for a first attempt")
    worker_id: str = Field("", description="this replica's name in claims")
    auth: Annotated[Literal["", "required", "off"], BeforeValidator(_lower)] = Field(
        "", description="'' (on when tokens are set), required or off"
    )
    auth_tokens: str = Field("", description="<sha256-hex>=tenant:<id> | admin, comma-separated")
    auth_file: FilePath | None = Field(None, description="the same, one per line")
    billing_policy: str = Field("postpaid", description="prepaid, postpaid or postpaid:<micros>")
    billing_tenants: str = Field("", description="tenant=policy,...")
    billing_file: FilePath | None = Field(None, description="tenant=policy, one per line")
    console_listen: str = Field("", description="host:port of the read-only web console")
    tls_server_name: str = Field("", description="name checked on sidecar certificates")
    adapter_submit_margin_s: Seconds = Field(5.0, description="added to a sidecar's submit budget")
    adapter_submit_timeout_s: Seconds = Field(0.0, description="fixed Submit deadline; 0: derived")


class SidecarEnv(_Common):
    """An adapter sidecar (`adapter_sidecars.common.config` documents the overrides)."""

    adapter_listen: str = Field("", description="gRPC listen address (beats the file's)")
    adapter_base_url: str = Field("", description="the provider API's base URL")
    adapter_connect_timeout: Timeout = Field(None, description="HTTP connect timeout, seconds")
    adapter_write_timeout: Timeout = Field(None, description="HTTP write timeout, seconds")
    adapter_read_timeout: Timeout = Field(None, description="HTTP read timeout, seconds")
    adapter_submit_read_timeout: Timeout = Field(None, description="the create call's read timeout")
    adapter_pool_timeout: Timeout = Field(None, description="HTTP pool timeout, seconds")
    adapter_submit_journal: str = Field("", description="file of the submit journal")
    adapter_capabilities_dir: str = Field("", description="directory of capability YAML files")
    health_listen: str = Field("", description="plaintext host:port serving grpc.health.v1 only")

    def overrides(self) -> dict[str, str]:
        """The set ``VIDROUTE_ADAPTER_*`` overrides by name, as the sidecar config applies them."""
        out: dict[str, str] = {}
        for name, value in self.model_dump(include=self.model_fields_set).items():
            if name.startswith("adapter_") or name == "time_scale":
                out[PREFIX + name.upper()] = str(value)
        return out


class ClientEnv(_Env):
    """The ``vidroute`` client commands and the SDK (`clients.cli_config`)."""

    target: str = Field("", description="the control plane's address")
    token: str = Field("", description="the bearer token sent on every call")
    config: FilePath | None = Field(None, description="TOML file with target, token and tls")
    debug: str = Field("", description="any value: tracebacks, like --debug")


#: Names other programs read from the same environment, with who reads them.
OTHER_PROGRAMS: Mapping[str, str] = {
    "VIDROUTE_TEST_POSTGRES_URL": "tests: the PostgreSQL of the integration tests",
    "VIDROUTE_TEST_REDIS_URL": "tests: the Redis of the integration tests",
    "VIDROUTE_TEST_ARTIFACTS": "tests: where the browser test keeps its artifacts",
    "VIDROUTE_E2E_TIME_SCALE": "tests: the e2e stack's time scale",
    "VIDROUTE_E2E_REDIS_LOSS_TASKS": "tests: tasks of the Redis-loss test",
    "VIDROUTE_E2E_KEY": "tests: credential_ref of the e2e sidecars",
    "VIDROUTE_CONTRACT_KEY": "contract suite: credential_ref of its sidecar",
    "VIDROUTE_SOAK_SIZE": "tests: tasks of the soak test",
    "VIDROUTE_CRASH_ROUNDS": "tests: rounds of the crash test",
    "VIDROUTE_FUZZ_EXAMPLES": "tests: calls of the RPC fuzz tests",
    "VIDROUTE_MONEY_EXAMPLES": "tests: examples of the ledger property tests",
    "VIDROUTE_RECIPE_ADAPTERS": "tests: adapters of the adapter-author recipe test",
    "VIDROUTE_CHROMIUM": "tests: the browser of the console test",
    "VIDROUTE_PROMTOOL": "tests: promtool for the alert rules",
    "VIDROUTE_SITE": "tests: the isolated interpreter's site-packages",
    "VIDROUTE_ALLOWED": "tests: the isolated interpreter's allowed modules",
    "VIDROUTE_MODULES_OUT": "tests: where the isolated interpreter lists its modules",
    "VIDROUTE_BENCH_POSTGRES_URL": "bench: its PostgreSQL",
    "VIDROUTE_BENCH_REDIS_URL": "bench: its Redis",
    "VIDROUTE_BENCH_SHARDS": "bench: shards of the shard benchmark",
    "VIDROUTE_BENCH_KEEP": "bench: keep the run's directory",
}

PROGRAMS: tuple[type[_Env], ...] = (ControlPlaneEnv, SidecarEnv, ClientEnv)


def known_names() -> frozenset[str]:
    """Every declared ``VIDROUTE_*`` name: of the programs and of `OTHER_PROGRAMS`."""
    names = {name for program in PROGRAMS for name in program.variables()}
    return frozenset(names | set(OTHER_PROGRAMS))


def check_names(
    environ: Mapping[str, str], also_known: Iterable[str] = (), prefer: Iterable[str] = ()
) -> None:
    """Refuse a set ``VIDROUTE_*`` variable nobody declares, naming the closest known one (of
    `prefer`, the starting program's names, if one is close)."""
    known = known_names() | set(also_known)
    unknown = sorted(
        name
        for name, value in environ.items()
        if name.upper().startswith(PREFIX) and value != "" and name not in known
    )
    if unknown:
        preferred = sorted(prefer)
        raise SettingsError("; ".join(_unknown(name, preferred, known) for name in unknown))


def _unknown(name: str, preferred: list[str], known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name.upper(), preferred, n=1, cutoff=0.6)
    close = close or difflib.get_close_matches(name.upper(), sorted(known), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{name} is not a vidroute setting{hint}"


def file_of(path: Path | None) -> str:
    """A declared file as the string the parsers take ('' when unset)."""
    return "" if path is None else str(path)
