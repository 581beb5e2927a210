"""`vidroute up`: the whole platform on one machine, as child processes of one command.

Starts the Runway and Veo emulators and the self-hosted model server (a real Cog server running
models/cog_video, `cog_child`; its sidecar on the Cog backend), then the
three adapter sidecars pointed at them, then the control plane in this process, wired to the
sidecars. Every child's output goes to ``./var/log/<name>.log``. Ctrl-C (or SIGTERM) stops the
control plane gracefully, then each child with SIGTERM (SIGKILL after a grace period).

Ports are the fixed dev ports (emulators 8101-8103, sidecars 8061-8063) unless a port is 0:
then the child binds a free port and reports it (an emulator prints its URL, a sidecar writes
its port file), and `start_stack` wires the sidecars and the control plane to what was bound.
That is what ``vidroute up --ephemeral-ports`` (and the e2e test of `make up`) uses, so two
stacks on one machine never fight over a port; on the fixed ports a second stack is refused in
one line (exit 78) before it starts any child.

Production terms, faster: the sidecars run their shipped configs, the emulators answer like the
real providers (an emulator-only route only when `start_stack` is asked for it by name), and the
whole stack runs on one time scale, ``VIDROUTE_TIME_SCALE`` (`DEV_TIME_SCALE` unless set): every
process multiplies every duration it has by it, and the emulators' job times are production-like
times multiplied by it, so a task takes seconds and every deadline keeps its production order.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("vidroute.up")
ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"listening on (http://\S+)")
DEV_TIME_SCALE = 0.1
# Production-like provider job times in seconds (queued, generating), before the time scale.
JOB_QUEUE_S = 5.0
JOB_RUN_S = 60.0
DEV_METRICS_PORTS = {"runway": 9465, "veo": 9466, "selfhosted": 9467}  # sidecars' /metrics
DEV_CALLBACK_PORT = 8180  # the control plane's provider callback ingress
UP_PORTS_FIX = (
    "another vidroute up? Stop it, or run this one on free ports: "
    "make up ARGS=--ephemeral-ports (vidroute up --ephemeral-ports)"
)
# What the emulators sign webhooks with (`EmulatorConfig.callback_secret`, their default).
EMULATOR_CALLBACK_SECRET = "vidroute-emulator-secret"
# The sidecar extension option that goes with an emulator extension (same name).
EXTENSIONS = {"runway": ("task_listing",), "veo": ("operation_list", "billing_export")}


def callback_settings(
    environ: Mapping[str, str], providers: Iterable[str], ephemeral_ports: bool
) -> dict[str, object]:
    """The callback ingress of `vidroute up`, unless ``VIDROUTE_CALLBACK_*`` configures it.

    It listens on `DEV_CALLBACK_PORT` (any free port with ephemeral ports; the URL sent to the
    providers is then the bound one) and verifies the emulators' webhooks with their secret.
    """
    out: dict[str, object] = {}
    if not environ.get("VIDROUTE_CALLBACK_LISTEN"):
        out["callback_listen"] = f"127.0.0.1:{0 if ephemeral_ports else DEV_CALLBACK_PORT}"
    if not environ.get("VIDROUTE_CALLBACK_SECRETS"):
        out["callback_secrets"] = dict.fromkeys(providers, EMULATOR_CALLBACK_SECRET)
    return out


def time_scale(environ: Mapping[str, str]) -> float:
    """The dev stack's one factor: ``VIDROUTE_TIME_SCALE`` if set, else `DEV_TIME_SCALE`."""
    from vidroute_core.timescale import check_factor

    return check_factor(environ.get("VIDROUTE_TIME_SCALE") or DEV_TIME_SCALE, "VIDROUTE_TIME_SCALE")


@dataclass(frozen=True)
class Child:
    """A process of the dev stack."""

    name: str
    args: tuple[str, ...]
    ready_url: str = ""  # polled until it answers (emulators on a fixed port)
    port_file: bool = False  # waits for --port-file (sidecars)
    listen_log: bool = False  # waits for "listening on <url>" in its log (emulators on port 0)
    env: Mapping[str, str] = field(default_factory=dict)


def emulator_child(
    name: str, port: int, scale: float = DEV_TIME_SCALE, extensions: tuple[str, ...] = ()
) -> Child:
    """A provider emulator in time mode; port 0 means "any free port, reported in the log".

    Job times are production-like times on the stack's time scale; `extensions` names the
    emulator-only routes to serve (none by default: it answers like the real provider).
    """
    timing = ["--queue-s", str(JOB_QUEUE_S * scale), "--run-s", str(JOB_RUN_S * scale)]
    if name == "selfhosted":  # a worker pool: wall seconds per simulated GPU second
        timing = ["--speed", str(scale)]
    unknown = set(extensions) - set(EXTENSIONS.get(name, ()))
    if unknown:
        raise ValueError(f"{name} emulator has no extensions {sorted(unknown)}")
    named = ["--extensions", ",".join(extensions)] if extensions else []
    return Child(
        name=f"emulator-{name}",
        args=(
            "-m",
            f"adapter_sidecars.emulators.{name}",
            "--port",
            str(port),
            "--advance",
            "time",
            *timing,
            *named,
        ),
        ready_url=f"http://127.0.0.1:{port}/__emulator/faults" if port else "",
        listen_log=not port,
    )


def adapter_child(
    name: str,
    port: int,
    provider_url: str = "",
    scale: float = DEV_TIME_SCALE,
    config: Path | None = None,
) -> Child:
    """An adapter sidecar on its shipped config (or `config`), pointed at `provider_url`."""
    config = config or ROOT / "adapter_sidecars" / name / "config.example.yaml"
    env = {"VIDROUTE_TIME_SCALE": str(scale)}
    if provider_url:
        env["VIDROUTE_ADAPTER_BASE_URL"] = provider_url
    # Its /metrics: a fixed dev port beside a fixed gRPC port, else any free one (in its log).
    metrics_port = DEV_METRICS_PORTS.get(name, 0) if port else 0
    env["VIDROUTE_METRICS_LISTEN"] = f"127.0.0.1:{metrics_port}"
    return Child(
        name=f"adapter-{name}",
        args=(
            "-m",
            f"adapter_sidecars.{name}",
            "--config",
            str(config),
            "--listen",
            f"127.0.0.1:{port}",
        ),
        port_file=True,
        env=env,
    )


def cog_child(port: int, token: str) -> Child:
    """The self-hosted model server: a real Cog server (coglet) running models/cog_video with
    this Python, on `port`; coglet signs its webhooks with `token` (the sidecar's credential)."""
    from adapter_sidecars.selfhosted.cog_server import DEFAULT_PREDICTOR, cog_server_command

    predictor = DEFAULT_PREDICTOR.relative_to(ROOT)  # children run in ROOT
    argv, env = cog_server_command(
        port, predictor=predictor, webhook_token=token, environ={"PATH": os.environ["PATH"]}
    )
    return Child(
        name="model-server-cog",
        args=tuple(argv[1:]),
        ready_url=f"http://127.0.0.1:{port}/health-check",
        env=env,
    )


def _cog_sidecar_config(run_dir: Path, extensions: tuple[str, ...]) -> Path:
    """The shipped self-hosted config on its Cog backend (webhooks to a free local port)."""
    import yaml

    shipped = ROOT / "adapter_sidecars" / "selfhosted" / "config.example.yaml"
    config = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    options = config.setdefault("provider", {}).get("options") or {}
    options.update({extension: True for extension in extensions})
    options.update({"backend": "cog", "webhook_listen": "127.0.0.1:0"})
    config["provider"]["options"] = options
    path = run_dir / "adapter-selfhosted.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def stack(
    provider_ports: Mapping[str, int],
    adapter_ports: Mapping[str, int],
    scale: float = DEV_TIME_SCALE,
) -> list[Child]:
    """The children on fixed ports, in start order (the example configs name these ports)."""
    return [emulator_child(name, port, scale) for name, port in provider_ports.items()] + [
        adapter_child(name, port, scale=scale) for name, port in adapter_ports.items()
    ]


def _with_options(name: str, extensions: tuple[str, ...], run_dir: Path) -> Path | None:
    """The shipped sidecar config with the options of `extensions` on, written to `run_dir`."""
    if not extensions:
        return None
    import yaml

    shipped = ROOT / "adapter_sidecars" / name / "config.example.yaml"
    config = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    options = config.setdefault("provider", {}).get("options") or {}
    options.update({extension: True for extension in extensions})
    config["provider"]["options"] = options
    path = run_dir / f"adapter-{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _refuse_busy_ports(ports: Iterable[int]) -> None:
    """A fixed dev port something listens on already (another `vidroute up`, most likely) is
    one refusal line before any child starts, not a child's crash (or, for an emulator, the
    other stack's emulator answering this one's readiness probe)."""
    from controlplane.startup import refuse
    from vidroute_core.wire.listen import PortInUse, address_in_use

    for port in ports:
        if port and address_in_use(f"127.0.0.1:{port}"):
            refuse(str(PortInUse(f"127.0.0.1:{port}", UP_PORTS_FIX)))


def start_stack(
    supervisor: Supervisor,
    provider_ports: Mapping[str, int],
    adapter_ports: Mapping[str, int],
    *,
    scale: float = DEV_TIME_SCALE,
    extensions: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, str]:
    """Start every emulator, then every sidecar pointed at its emulator's bound URL.

    `extensions` asks for emulator-only routes by name, per emulator (``{"runway":
    ("task_listing",)}``), and switches on the matching sidecar option. Returns each sidecar's
    bound ``host:port`` by name (``runway``, ``veo``, ``selfhosted``).
    """
    _refuse_busy_ports(
        [
            *provider_ports.values(),
            *adapter_ports.values(),
            *(DEV_METRICS_PORTS.get(name, 0) for name, port in adapter_ports.items() if port),
        ]
    )
    named = dict(extensions or {})
    urls = {
        name: supervisor.start(_provider_child(name, port, scale, named.get(name, ())))
        for name, port in provider_ports.items()
    }
    configs = {name: _with_options(name, named.get(name, ()), supervisor.run_dir) for name in urls}
    if "selfhosted" in urls:
        configs["selfhosted"] = _cog_sidecar_config(supervisor.run_dir, named.get("selfhosted", ()))
    return {
        name: supervisor.start(
            adapter_child(name, port, urls.get(name, ""), scale, configs.get(name))
        )
        for name, port in adapter_ports.items()
    }


def _provider_child(name: str, port: int, scale: float, extensions: tuple[str, ...]) -> Child:
    """The self-hosted provider is a real Cog server (issue 24); the others are emulators."""
    if name != "selfhosted":
        return emulator_child(name, port, scale, extensions)
    if extensions:
        raise ValueError(f"the Cog model server has no extensions {sorted(extensions)}")
    return cog_child(port or _free_port(), _selfhosted_token())


def _selfhosted_token() -> str:
    """The credential the shipped self-hosted config resolves (its dev default unless set)."""
    return os.environ.get("SELFHOSTED_API_KEY") or "dev_token"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Supervisor:
    """Starts children, waits for readiness without guessing, and stops them in reverse."""

    def __init__(self, run_dir: Path) -> None:
        # Absolute: children run in the repository root, their --port-file must still land here.
        self._run_dir = run_dir.resolve()
        self.run_dir = self._run_dir
        self._procs: list[tuple[Child, subprocess.Popen[bytes]]] = []
        (run_dir / "log").mkdir(parents=True, exist_ok=True)

    def start(self, child: Child, timeout_s: float = 60.0) -> str:
        """Start `child` and wait until it is ready; returns where it listens.

        An emulator's address is its base URL (``http://127.0.0.1:8101``); a sidecar's is the
        ``127.0.0.1:<port>`` it wrote to its port file.
        """
        args = list(child.args)
        port_file = self._run_dir / f"{child.name}.port"
        if child.port_file:
            port_file.unlink(missing_ok=True)
            args += ["--port-file", str(port_file)]
        log_path = self._run_dir / "log" / f"{child.name}.log"
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **child.env, "PYTHONUNBUFFERED": "1"},
            )
        self._procs.append((child, proc))
        offset = log_path.stat().st_size if child.listen_log else 0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{child.name} exited early; see {log_path}")
            address = self._ready(child, port_file, log_path, offset)
            if address:
                log.info("%s ready at %s (log %s)", child.name, address, log_path)
                return address
            time.sleep(0.1)
        raise RuntimeError(f"{child.name} not ready after {timeout_s:.0f} s; see {log_path}")

    @staticmethod
    def _ready(child: Child, port_file: Path, log_path: Path, offset: int) -> str:
        """Where the child listens once it is ready, else ""."""
        if child.port_file:
            text = port_file.read_text().strip() if port_file.exists() else ""
            return f"127.0.0.1:{text}" if text else ""
        if child.listen_log:
            with log_path.open("rb") as fh:
                fh.seek(offset)
                match = _LISTENING.search(fh.read().decode("utf-8", "replace"))
            return match.group(1) if match else ""
        try:
            ok = httpx.get(child.ready_url, timeout=1.0).status_code < 500
        except httpx.HTTPError:
            return ""
        if child.ready_url.endswith("/health-check"):  # a Cog server: ready once set up
            try:
                ok = ok and httpx.get(child.ready_url, timeout=1.0).json()["status"] == "READY"
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return ""
            return child.ready_url.removesuffix("/health-check") if ok else ""
        return child.ready_url.removesuffix("/__emulator/faults") if ok else ""

    def stop_all(self, grace_s: float = 10.0) -> None:
        for _child, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child, proc in reversed(self._procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop; killing it", child.name)
                proc.kill()
                proc.wait()
        self._procs.clear()


async def publish_example_tenants(database_url: str) -> str | None:
    """Publish the shipped example tenants document (``controlplane/tenants.example.yaml``) when
    no tenants document was ever published on this database, as an admin would: through the
    tenants service and its unit of work, recorded as by ``vidroute up``. An operator's own
    publication is never replaced. The version published, or None."""
    from controlplane.service.tenants import TenantBook, TenantConfigService

    return await _publish_example(
        database_url, "tenants", lambda db: TenantConfigService(db, TenantBook(db))
    )


async def publish_example_accounts(database_url: str) -> str | None:
    """As `publish_example_tenants`, for ``controlplane/accounts.example.yaml`` (the limits of
    the ``vidroute up`` sidecars' accounts)."""
    from controlplane.service.accounts import AccountBook, AccountConfigService

    return await _publish_example(
        database_url, "accounts", lambda db: AccountConfigService(db, AccountBook(db))
    )


async def publish_examples(database_url: str) -> None:
    """The example tenants and accounts documents (each only on a database that never had one)."""
    await publish_example_tenants(database_url)
    await publish_example_accounts(database_url)


async def _publish_example(
    database_url: str, kind: str, service_for: Callable[[Any], Any]
) -> str | None:
    import controlplane
    from controlplane.persistence.database import Database
    from controlplane.service.access import Caller

    name = f"{kind}.example.yaml"
    text = (Path(controlplane.__file__).parent / name).read_text("utf-8")
    db = Database.from_url(database_url)
    try:
        service = service_for(db)
        if (await service.history()).versions:
            return None
        row = await service.publish(text, source=name, caller=Caller.admin("vidroute up"))
    finally:
        await db.dispose()
    log.info("example %s %s published (vidroute %s get shows them)", kind, row.version, kind)
    return str(row.version)
