"""The whole platform for end-to-end tests, on production terms: emulators, sidecar processes, a
control plane process, every duration compressed by one factor.

    with ProviderFarm(workdir, time_scale=0.02) as farm:      # emulators (threads) + 3 sidecars
        cp = ControlPlane(workdir, farm, database_url=..., redis_url=...)
        cp.start()
        task_id = cp.create_task("runway")                   # STRICT_MODEL, pinned
        task = cp.wait_terminal(task_id, timeout_s=60)
        cp.kill(); cp.start()                                # SIGKILL and restart, same database

* **One factor.** `ProviderFarm.time_scale` is handed to every process of the run as
  ``VIDROUTE_TIME_SCALE`` (sidecars and control plane multiply every duration they have by it)
  and to the emulators' job durations; tests scale their fault durations with
  `ProviderFarm.seconds` (``farm.seconds(40)`` is a 40 s provider stall). So every deadline and
  window keeps its production order: at 0.02 the sidecar's 60 s ``submit_read`` is 1.2 s and the
  control plane's 1800 s unknown-recovery deadline 36 s.
* **Shipped configuration.** Each sidecar runs from its shipped
  ``adapter_sidecars/<name>/config.example.yaml`` with only the listen address, the provider base
  URL and the account keys substituted; the control plane runs on its defaults.
* **Real-provider emulators.** The emulators serve no emulator-only route (Runway task listing,
  Veo operation list, billing export) unless a test names one in ``extensions`` (which also
  turns on the sidecar's matching option); jobs take production-like times (scaled) in
  ``advance="time"`` mode and webhooks are signed with `CALLBACK_SECRET`.
* The control plane is `vidroute serve` on PostgreSQL/SQLite, Redis leases in a logical
  database of its own (`RedisDb`: the lease store's key namespace is not configurable from the
  environment), callbacks on.

Every wait polls a condition with a deadline; nothing sleeps a fixed time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import grpc
import redis
import yaml
from google.protobuf import json_format

from adapter_sidecars.emulators import (
    EmulatorThread,
    RunwayEmulator,
    SelfHostedEmulator,
    VeoEmulator,
)
from adapter_sidecars.emulators.runway import RunwayConfig
from adapter_sidecars.emulators.selfhosted import SelfHostedConfig
from adapter_sidecars.emulators.veo import VeoConfig
from clients import auth as client_auth
from controlplane.api.auth import hash_token, new_token
from tests.support import processes
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2, scheduler_service_pb2_grpc
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

ROOT = Path(__file__).resolve().parents[2]
CALLBACK_SECRET = "e2e-callback-secret"
UNRESOLVABLE_URL = "http://nonexistent.invalid:8080"
# The factor of a run unless a test picks its own: production's 60 s submit_read becomes 1.2 s,
# the 1800 s unknown-recovery deadline 36 s. ``VIDROUTE_E2E_TIME_SCALE`` changes it by hand.
DEFAULT_TIME_SCALE = float(os.environ.get("VIDROUTE_E2E_TIME_SCALE") or 0.02)
# How long a process may take to start (port file, first log lines, capabilities published): a
# hang guard, not a speed claim. On two cores at load 20, `vidroute serve` took over 60 s.
START_GUARD_S = 300.0
# The deadline of the tests' own API calls (CreateTask, GetTask, ...): a hang guard too. At load
# 40 a GetTask of a control plane running at time factor 0.05 took over 10 s to answer.
RPC_GUARD_S = 60.0
TERMINAL = frozenset(
    {
        scheduler_pb2.TASK_STATE_SUCCEEDED,
        scheduler_pb2.TASK_STATE_FAILED,
        scheduler_pb2.TASK_STATE_CANCELLED,
    }
)
T = TypeVar("T")

# Production-like provider timings (seconds, before the factor): time in the provider's queue
# and generating. Real jobs take about a minute; what matters is that they are long next to the
# polling schedule's first steps and short next to the recovery and plausibility windows.
JOB_QUEUE_S = 5.0
JOB_RUN_S = 60.0


@dataclass(frozen=True)
class Provider:
    """One provider of the stack: its control-plane name, sidecar package, pinned model."""

    name: str  # the provider name the capabilities and VIDROUTE_ADAPTERS use
    package: str  # adapter_sidecars.<package>, whose config.example.yaml is the shipped config
    model: str
    emulator: Callable[[float, frozenset[str]], Any]  # (time scale, extensions) -> emulator
    callbacks: bool = False  # does the provider push webhooks?

    @property
    def shipped_config(self) -> Path:
        return ROOT / "adapter_sidecars" / self.package / "config.example.yaml"


def _runway(scale: float, extensions: frozenset[str]) -> RunwayEmulator:
    # The tier limits are Runway's defaults; only the balance is an account fact we choose, so a
    # long soak never runs out of credits.
    return RunwayEmulator(
        RunwayConfig(
            advance="time",
            queue_s=JOB_QUEUE_S * scale,
            run_s=JOB_RUN_S * scale,
            url_ttl_s=86400.0 * scale,
            credit_balance=10_000_000,
            callback_secret=CALLBACK_SECRET,
            extensions=extensions,
        )
    )


def _veo(scale: float, extensions: frozenset[str]) -> VeoEmulator:
    return VeoEmulator(
        VeoConfig(
            advance="time",
            queue_s=JOB_QUEUE_S * scale,
            run_s=JOB_RUN_S * scale,
            url_ttl_s=86400.0 * scale,
            retention_s=2 * 86400.0 * scale,
            callback_secret=CALLBACK_SECRET,
            extensions=extensions,
        )
    )


def _selfhosted(scale: float, extensions: frozenset[str]) -> SelfHostedEmulator:
    # speed = wall seconds per simulated GPU second: 1.0 on real hardware.
    return SelfHostedEmulator(
        SelfHostedConfig(
            advance="time",
            workers=4,
            speed=1.0 * scale,
            url_ttl_s=86400.0 * scale,
            callback_secret=CALLBACK_SECRET,
            extensions=extensions,
        )
    )


PROVIDERS: dict[str, Provider] = {
    "runway": Provider("runway", "runway", "gen4.5", _runway),
    "google": Provider("google", "veo", "veo-3.1-generate-preview", _veo, callbacks=True),
    "self_hosted": Provider("self_hosted", "selfhosted", "wan2.2-t2v", _selfhosted, callbacks=True),
}


@dataclass(frozen=True)
class ProviderSetup:
    """A provider run another way than `PROVIDERS` says (a farm's ``setups``): its own emulator
    factory (time scale, extensions) and sidecar config (emulator URL, workdir) -> config."""

    emulator: Callable[[float, frozenset[str]], Any]
    sidecar_config: Callable[[str, Path], dict[str, Any]]


def shipped_sidecar_config(
    provider: str, *, base_url: str, extensions: Iterable[str] = ()
) -> dict[str, Any]:
    """The provider's shipped sidecar config with only listen, base URL and keys substituted.

    An emulator extension named in `extensions` also switches on the sidecar option of the same
    name (``provider.options.task_listing: true``), as an operator would for such a provider.
    """
    config = yaml.safe_load(PROVIDERS[provider].shipped_config.read_text(encoding="utf-8"))
    config["listen"] = "127.0.0.1:0"
    config.setdefault("provider", {})["base_url"] = base_url
    options = config["provider"].get("options") or {}
    options.update({name: True for name in extensions})
    config["provider"]["options"] = options
    for account in config["accounts"]:
        account["credential_ref"] = f"env:VIDROUTE_E2E_KEY:-key_e2e_{provider}"
    return dict(config)


def wait_for(
    probe: Callable[[], T | None], *, timeout_s: float, interval_s: float = 0.05, what: str = ""
) -> T:
    """Poll `probe` until it returns something truthy; raise TimeoutError with `what` if not."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not reached within {timeout_s:.0f} s: {what}")
        time.sleep(interval_s)


def free_port() -> int:
    """A port the kernel just handed out (for listeners whose URL must be known up front)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ProviderFarm:
    """The three emulators (threads) and their sidecars (processes), on one time scale."""

    def __init__(
        self,
        workdir: Path,
        *,
        time_scale: float = DEFAULT_TIME_SCALE,
        base_urls: Mapping[str, str] | None = None,
        providers: Iterable[str] = PROVIDERS,
        extensions: Mapping[str, Iterable[str]] | None = None,
        sidecar_env: Mapping[str, str] | None = None,
        emulator_options: Mapping[str, Mapping[str, Any]] | None = None,
        sidecar_options: Mapping[str, Mapping[str, Any]] | None = None,
        setups: Mapping[str, ProviderSetup] | None = None,
    ) -> None:
        self.workdir = workdir
        self.setups = dict(setups or {})  # e.g. Veo on Vertex AI instead of the Gemini API
        self.sidecar_env = dict(sidecar_env or {})  # e.g. the VIDROUTE_TLS_* files
        # Per provider: emulator config fields (a test's store CA) and sidecar
        # ``provider.options`` (an operator's setting such as ``platform_store``).
        self.emulator_options = {p: dict(o) for p, o in (emulator_options or {}).items()}
        self.sidecar_options = {p: dict(o) for p, o in (sidecar_options or {}).items()}
        self.time_scale = time_scale
        self._base_urls = dict(base_urls or {})
        self.providers = list(providers)
        self.extensions = {p: frozenset((extensions or {}).get(p, ())) for p in self.providers}
        self.emulators: dict[str, EmulatorThread] = {}
        self.sidecars: dict[str, processes.Proc] = {}

    def seconds(self, production_s: float) -> float:
        """`production_s` seconds of production time on this run's clock."""
        return production_s * self.time_scale

    @property
    def env(self) -> dict[str, str]:
        """What every process of this run gets: the one time scale."""
        return {"VIDROUTE_TIME_SCALE": repr(self.time_scale)}

    def __enter__(self) -> ProviderFarm:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in self.providers:
            setup = self.setups.get(name)
            factory = setup.emulator if setup else PROVIDERS[name].emulator
            emulator = factory(self.time_scale, self.extensions[name])
            if self.emulator_options.get(name):
                config = dataclasses.replace(emulator.config, **self.emulator_options[name])
                emulator = type(emulator)(config)
            self.emulators[name] = EmulatorThread(emulator)
            self.emulators[name].start()
        pending = {name: self._spawn_sidecar(name) for name in self.providers}
        for name, (popen, port_file, log_path) in pending.items():
            self.sidecars[name] = _await_port(popen, port_file, log_path, f"sidecar {name}")
            expect_time_scale(self.sidecars[name], self.time_scale, f"sidecar {name}")

    def _spawn_sidecar(self, name: str, port: int = 0) -> tuple[Any, Path, Path]:
        base_url = self._base_urls.get(name) or self.emulators[name].url
        setup = self.setups.get(name)
        if setup is not None:
            config = setup.sidecar_config(base_url, self.workdir)
        else:
            config = shipped_sidecar_config(
                name, base_url=base_url, extensions=self.extensions[name]
            )
        config["provider"]["options"].update(self.sidecar_options.get(name, {}))
        if port:  # a restart: the control plane knows the sidecar at its old address
            config["listen"] = f"127.0.0.1:{port}"
        path = self.workdir / f"sidecar-{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return _spawn(
            ["-m", f"adapter_sidecars.{PROVIDERS[name].package}", "--config", str(path)],
            workdir=self.workdir,
            name=f"sidecar-{name}",
            env={
                **self.env,
                # Port 0: the sidecar binds a free port and logs it (`metrics_port`); a port
                # picked here and bound later could be taken by another test in between.
                "VIDROUTE_METRICS_LISTEN": "127.0.0.1:0",
                **self.sidecar_env,
            },
        )

    # -- sidecar faults (a stall, a crash, a rolling update) --------------------------------
    def pause_sidecar(self, name: str) -> None:
        """SIGSTOP: the process holds its connections and answers nothing (a GC stall)."""
        self.sidecars[name].popen.send_signal(signal.SIGSTOP)

    def resume_sidecar(self, name: str) -> None:
        """SIGCONT after `pause_sidecar`."""
        self.sidecars[name].popen.send_signal(signal.SIGCONT)

    def kill_sidecar(self, name: str) -> None:
        """SIGKILL: no shutdown at all (an OOM kill)."""
        self.sidecars[name].kill()

    def stop_sidecar(self, name: str) -> None:
        """SIGTERM and wait: the sidecar drains and exits (a rolling update's first half)."""
        self.sidecars[name].stop(timeout=15)

    def restart_sidecar(self, name: str) -> None:
        """Start `name`'s sidecar again on its old port (it must have exited) and wait for it."""
        old = self.sidecars[name]
        assert old.popen.poll() is not None, f"sidecar {name} still runs"
        popen, port_file, log_path = self._spawn_sidecar(name, port=old.port)
        self.sidecars[name] = _await_port(popen, port_file, log_path, f"sidecar {name}")

    def metrics_port(self, name: str) -> int:
        """The port of `name`'s sidecar's /metrics (the one its current process bound)."""
        return logged_metrics_port(self.sidecars[name])

    def stop(self) -> None:
        for proc in self.sidecars.values():
            proc.stop(timeout=5)
        self.sidecars.clear()
        for emulator in self.emulators.values():
            emulator.stop()
        self.emulators.clear()

    def reset(self) -> None:
        """Forget every job, fault and callback of every emulator."""
        for emulator in self.emulators.values():
            emulator.reset()

    @property
    def adapters_env(self) -> str:
        return ",".join(f"{name}={proc.address}" for name, proc in self.sidecars.items())

    def emulator(self, provider: str) -> EmulatorThread:
        return self.emulators[provider]

    def truth(self, provider: str) -> list[dict[str, Any]]:
        return self.emulators[provider].truth()

    def logs(self) -> str:
        return "\n".join(
            f"--- sidecar {name} (tail) ---\n" + "\n".join(proc.log().splitlines()[-30:])
            for name, proc in self.sidecars.items()
        )


def _spawn(
    args: list[str], *, workdir: Path, name: str, env: Mapping[str, str]
) -> tuple[Any, Path, Path]:
    """Start ``python <args> --port-file F``; returns (popen, port file, log path)."""
    import subprocess
    import sys

    port_file = workdir / f"{name}.port"
    port_file.unlink(missing_ok=True)
    log_path = workdir / f"{name}.log"
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            [sys.executable, *args, "--port-file", str(port_file)],
            cwd=workdir,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return popen, port_file, log_path


_METRICS_LINE = re.compile(r"metrics on http://[^:/]+:(\d+)/metrics")


def logged_metrics_port(proc: processes.Proc) -> int:
    """The /metrics port `proc` logged as it started (the last such line: a restarted sidecar
    appends to its old log, and logs its metrics port before it writes its port file)."""
    found = wait_for(
        lambda: _METRICS_LINE.findall(proc.log()), timeout_s=START_GUARD_S, what="metrics port"
    )
    return int(found[-1])


def expect_time_scale(proc: processes.Proc, factor: float, what: str) -> None:
    """The process logged that it runs on `factor` (each logs its factor once at start)."""
    wanted = f"time scale {factor:g}"
    wait_for(lambda: wanted in proc.log(), timeout_s=START_GUARD_S, what=f"{what} logs {wanted!r}")


def _await_port(
    popen: Any, port_file: Path, log_path: Path, what: str, timeout_s: float = START_GUARD_S
) -> processes.Proc:
    def ready() -> bool:
        if popen.poll() is not None:
            raise RuntimeError(f"{what} exited early:\n{log_path.read_text(errors='replace')}")
        return port_file.exists() and bool(port_file.read_text().strip())

    try:
        wait_for(ready, timeout_s=timeout_s, what=f"{what} port file")
    except TimeoutError:
        popen.kill()
        popen.wait()
        raise
    return processes.Proc(popen, log_path, int(port_file.read_text()))


class RedisDb:
    """A Redis logical database claimed for one test, flushed before and after use.

    The control plane's lease store always uses the key prefix ``vidroute:``, so tests isolate
    by logical database: a claim key in db 0 (``SET NX`` with an expiry) makes concurrent test
    runs (and the workers of one run) pick different databases, and only the claimed database
    is ever flushed. With all eight claimed, a claim waits for one to come free.
    """

    FIRST, LAST = 8, 15
    CLAIM_WAIT_S = 300.0

    def __init__(self, base_url: str) -> None:
        self._base = base_url
        self._admin = redis.Redis.from_url(base_url)
        self._token = secrets.token_hex(8)
        self.number = -1
        self.url = ""

    def __enter__(self) -> RedisDb:
        # make test runs on several workers, each holding a database per running stack, and
        # other runs on the machine claim from the same eight: wait for one to come free.
        self.number = wait_for(
            self._claim_free,
            timeout_s=self.CLAIM_WAIT_S,
            interval_s=0.5,
            what="a free e2e Redis database (8-15 are all claimed by other tests or runs)",
        )
        parts = urlsplit(self._base)
        self.url = parts._replace(path=f"/{self.number}").geturl()
        self.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.number >= 0:
            self.flush()
            if self._admin.get(self._claim(self.number)) == self._token.encode():
                self._admin.delete(self._claim(self.number))
        self._admin.close()

    def flush(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            client.flushdb()
        finally:
            client.close()

    def _claim_free(self) -> int | None:
        for number in range(self.FIRST, self.LAST + 1):
            if self._admin.set(self._claim(number), self._token, nx=True, ex=1800):
                return number
        return None

    @staticmethod
    def _claim(number: int) -> str:
        return f"vidroute:e2e-claim:db{number}"


def spec_for(
    provider: str,
    prompt: str = "a red kite over a green hill",
    duration_s: int = 4,
    model: str = "",
) -> gen.GenerationSpec:
    """A text-to-video spec pinned to `provider` and `model` (default: the provider's test
    model; STRICT_MODEL)."""
    return gen.GenerationSpec(
        tenant_id="acme",
        prompt=prompt,
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=duration_s * 1000),
        routing=gen.RoutingPolicy(
            mode=gen.ROUTING_MODE_STRICT_MODEL,
            required_provider=provider,
            required_model=model or PROVIDERS[provider].model,
        ),
    )


class ControlPlane:
    """`vidroute serve` as a child process; SIGKILL and restart keep the database and ports.

    It runs on its defaults, on the farm's time scale; `env` adds variables a test is about
    (never timings: those come from the one factor). It runs authenticated, as production
    should: the harness's channel sends an admin token (`token`) the process is configured with.
    """

    def __init__(
        self,
        workdir: Path,
        farm: ProviderFarm,
        *,
        database_url: str,
        redis_url: str | None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.farm = farm
        self.database_url = database_url
        self.redis_url = redis_url
        self.extra_env = dict(env or {})
        self.callback_port = free_port()
        self.proc: processes.Proc | None = None
        self.generation = 0
        self._channel: grpc.Channel | None = None
        self.stub: scheduler_service_pb2_grpc.SchedulerServiceStub | None = None
        self.token = new_token()  # the same across restarts, like a deployed secret

    # -- process ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the process; on its first start, a callback port another test took between
        `free_port` and the bind is replaced (no submit has carried the old URL yet)."""
        for _ in range(2):
            try:
                self._start()
                return
            except RuntimeError as exc:
                taken = f"127.0.0.1:{self.callback_port}) is in use" in str(exc)
                if not (taken and self.generation == 1):
                    raise
                self.generation = 0
                self.callback_port = free_port()
        self._start()

    def _start(self) -> None:
        secrets_env = ",".join(f"{name}={CALLBACK_SECRET}" for name in PROVIDERS)
        env = {
            **self.farm.env,
            "VIDROUTE_DATABASE_URL": self.database_url,
            "VIDROUTE_REDIS_URL": self.redis_url or "",
            "VIDROUTE_ADAPTERS": self.farm.adapters_env,
            "VIDROUTE_OBJECT_STORE": (self.workdir / "objects").as_uri(),
            "VIDROUTE_CALLBACK_LISTEN": f"127.0.0.1:{self.callback_port}",
            "VIDROUTE_CALLBACK_PUBLIC_URL": f"http://127.0.0.1:{self.callback_port}",
            "VIDROUTE_CALLBACK_SECRETS": secrets_env,
            "VIDROUTE_WORKER_ID": f"e2e-cp-{self.generation}",
            "VIDROUTE_AUTH_TOKENS": f"{hash_token(self.token)}=admin",
            **self.extra_env,
        }
        name = f"controlplane-{self.generation}"
        self.generation += 1
        popen, port_file, log_path = _spawn(
            ["-m", "clients.cli", "serve", "--listen", "127.0.0.1:0"],
            workdir=self.workdir,
            name=name,
            env=env,
        )
        self.proc = _await_port(popen, port_file, log_path, name)
        expect_time_scale(self.proc, self.farm.time_scale, name)
        self._connect()
        self.wait_capabilities()

    def _connect(self) -> None:
        self.close_channel()
        assert self.proc is not None
        self._channel = client_auth.channel(self.proc.address, self.token)
        self.stub = scheduler_service_pb2_grpc.SchedulerServiceStub(self._channel)

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self.stub = None

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, no cleanup, exactly like a node dying."""
        self.close_channel()
        if self.proc is not None:
            self.proc.kill()

    def stop(self) -> int:
        self.close_channel()
        return 0 if self.proc is None else self.proc.stop(timeout=15)

    def restart(self, *, kill: bool = True) -> None:
        if kill:
            self.kill()
        else:
            self.stop()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.popen.poll() is None

    def logs(self, lines: int = 60) -> str:
        out = []
        for path in sorted(self.workdir.glob("controlplane-*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name} (tail) ---\n" + "\n".join(tail))
        return "\n".join(out)

    def wait_capabilities(self, timeout_s: float = START_GUARD_S) -> None:
        """Wait until every sidecar's capabilities are published (routing needs them)."""

        def published() -> bool:
            providers = self._call(
                lambda s: s.ListProviders(api.ListProvidersRequest(), timeout=RPC_GUARD_S)
            ).providers
            return {p.provider for p in providers if p.capabilities} >= set(self.farm.providers)

        wait_for(published, timeout_s=timeout_s, interval_s=0.2, what="capabilities published")

    # -- API -------------------------------------------------------------------------------
    def _call(self, fn: Callable[[scheduler_service_pb2_grpc.SchedulerServiceStub], T]) -> T:
        assert self.stub is not None, "control plane not started"
        return fn(self.stub)

    def create_task(
        self,
        provider: str,
        *,
        prompt: str = "a red kite over a green hill",
        duration_s: int = 4,
        idempotency_key: str | None = None,
        model: str = "",
    ) -> str:
        """CreateTask pinned to `provider` (and `model`; STRICT_MODEL); returns the task id."""
        request = api.CreateTaskRequest(
            spec=spec_for(provider, prompt, duration_s, model),
            idempotency_key=idempotency_key or uuid.uuid4().hex,
        )
        return self._call(lambda s: s.CreateTask(request, timeout=RPC_GUARD_S)).task.task_id

    def get_task(self, task_id: str) -> scheduler_pb2.Task:
        return self._call(
            lambda s: s.GetTask(api.GetTaskRequest(task_id=task_id), timeout=RPC_GUARD_S)
        ).task

    def cancel_task(self, task_id: str) -> None:
        self._call(
            lambda s: s.CancelTask(api.CancelTaskRequest(task_id=task_id), timeout=RPC_GUARD_S)
        )

    def wait_terminal(self, task_id: str, timeout_s: float = 60.0) -> scheduler_pb2.Task:
        """Poll GetTask until the task is SUCCEEDED, FAILED or CANCELLED."""
        last: list[scheduler_pb2.Task] = []

        def terminal() -> scheduler_pb2.Task | None:
            task = self.get_task(task_id)
            last[:] = [task]
            return task if task.state in TERMINAL else None

        try:
            return wait_for(terminal, timeout_s=timeout_s, interval_s=0.1, what=task_id)
        except TimeoutError as exc:
            shown = describe(last[0]) if last else "never read"
            raise TimeoutError(f"{exc}\n{shown}\n{self.logs()}") from None

    def wait_attempt_state(
        self, task_id: str, states: Iterable[int], timeout_s: float = 30.0
    ) -> scheduler_pb2.Task:
        wanted = set(states)

        def reached() -> scheduler_pb2.Task | None:
            task = self.get_task(task_id)
            return task if any(a.state in wanted for a in task.attempts) else None

        state = scheduler_pb2.AttemptState
        names = [state.Name(state.ValueType(s)) for s in wanted]
        return wait_for(reached, timeout_s=timeout_s, interval_s=0.1, what=f"attempt in {names}")


def describe(task: scheduler_pb2.Task) -> str:
    """A compact JSON view of a task for assertion messages."""
    data = json_format.MessageToDict(task, preserving_proto_field_name=True)
    data.pop("route_decisions", None)
    data.pop("spec", None)
    return json.dumps(data, indent=1, sort_keys=True)


def local_path(uri: str) -> Path:
    """The file behind a ``file://`` URI of the object store."""
    parts = urlsplit(uri)
    assert parts.scheme == "file", uri
    return Path(unquote(parts.path))


def probe_mp4(path: Path) -> tuple[float, float]:
    """(duration in seconds, frame rate) of an MP4, read with PyAV."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.guessed_rate or 24)
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / 1_000_000
        else:
            frames = sum(1 for _ in container.decode(stream))
            duration = frames / fps
    return duration, fps
