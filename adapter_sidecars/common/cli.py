"""The command line every sidecar shares (the composition root: the only reader of os.environ).

    python -m adapter_sidecars.<name> --config FILE [--listen HOST:PORT] [--port-file PATH]
                                      [--log-level INFO] [--log-format json|text]
                                      [--metrics-listen HOST:PORT] [--health-listen HOST:PORT]

``--listen`` beats ``VIDROUTE_ADAPTER_LISTEN`` beats the file's ``listen``. The variables are
declared in `vidroute_core.settings.SidecarEnv`; a bad value or a set ``VIDROUTE_*`` name nobody
declares (a name a ``credential_ref`` of the file reads is declared by it) is a bad
configuration. Exit status: 0 after a clean shutdown, 2 for a bad configuration (a TLS one
included: ``VIDROUTE_TLS_*`` as in `vidroute_core.tls`; plaintext on a non-loopback address
without ``VIDROUTE_TLS=off``) or a listen port already in use (one line on stderr, no traceback).
Traces follow the standard ``OTEL_*`` variables (`vidroute_core.tracing`; off when unset), with
the program name as the service name.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from adapter_sidecars.common.config import ConfigError, SidecarConfig, load_config
from adapter_sidecars.common.server import serve
from adapter_sidecars.common.types import ProviderAdapter
from vidroute_core.capabilities.loader import CapabilityLoadError
from vidroute_core.logs import configure_logging
from vidroute_core.settings import LOG_LEVELS, SettingsError, SidecarEnv, check_names
from vidroute_core.tls import TlsConfigError, TlsSettings
from vidroute_core.tracing import TracingConfigError, configure_tracing
from vidroute_core.wire.listen import PortInUse

AdapterFactory = Callable[[SidecarConfig], ProviderAdapter]


def parse_args(prog: str, argv: Sequence[str] | None, env: SidecarEnv) -> argparse.Namespace:
    """Parse the shared options (their defaults from `env`)."""
    parser = argparse.ArgumentParser(prog=prog, description="vidroute provider adapter sidecar")
    parser.add_argument("--config", type=Path, required=True, help="YAML configuration file")
    parser.add_argument("--listen", help="host:port to bind (port 0 = any free port)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here when ready")
    parser.add_argument(
        "--metrics-listen",
        default=env.metrics_listen,
        help="host:port of the Prometheus /metrics endpoint (default: off)",
    )
    parser.add_argument(
        "--health-listen",
        default=env.health_listen,
        help="host:port of a plaintext port serving only grpc.health.v1 (default: off)",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, type=str.upper, default=env.log_level)
    parser.add_argument("--log-format", choices=("json", "text"), default=env.log_format or "json")
    return parser.parse_args(argv)


def _credential_names(config: SidecarConfig) -> set[str]:
    """The variables the file's ``env:`` credential references read (the file declares them)."""
    refs = (account.credential.ref.partition(":") for account in config.accounts)
    return {rest.partition(":-")[0] for scheme, _, rest in refs if scheme == "env"}


def run(prog: str, factory: AdapterFactory, argv: Sequence[str] | None = None) -> int:
    """Load config, build the adapter, serve until signalled."""
    try:
        env = SidecarEnv.load(os.environ, check=False)  # names: once the file is read, below
    except SettingsError as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return 2
    args = parse_args(prog, argv, env)
    # JSON lines with the id chain, redacted on the root handler (third-party loggers too).
    configure_logging(args.log_level, args.log_format, sys.stderr)
    # httpx logs every request URL at INFO; keep the sidecar's log about decisions, not noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = load_config(args.config, os.environ, env.overrides())
        check_names(os.environ, _credential_names(config), prefer=SidecarEnv.variables())
        if args.listen:
            config = replace(config, listen=args.listen)
        tls = TlsSettings.build(
            mode=env.tls,
            cert_file=env.tls_cert_file,
            key_file=env.tls_key_file,
            ca_file=env.tls_ca_file,
        )
        tls.check_plaintext(config.listen, role="plaintext listen address")
        # Before the adapter: its HTTP client and the gRPC server are instrumented when built.
        configure_tracing(prog, os.environ)
        adapter = factory(config)
    except (
        ConfigError,
        SettingsError,
        CapabilityLoadError,
        TlsConfigError,
        TracingConfigError,
    ) as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.getLogger(prog).info(
        "time scale %g (every duration multiplied; submit_read %.3g s)",
        config.time_scale,
        config.timeouts.submit_read,
    )
    try:
        asyncio.run(
            serve(
                adapter,
                config.listen,
                port_file=args.port_file,
                probe_interval_seconds=config.probe_interval_seconds,
                shutdown_grace_seconds=config.shutdown_grace_seconds,
                metrics_listen=args.metrics_listen,
                tls=tls,
                health_listen=args.health_listen,
            )
        )
    except PortInUse as exc:  # one line, no traceback
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return 0
