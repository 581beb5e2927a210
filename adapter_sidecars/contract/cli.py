"""``vidroute-contract``: run the adapter contract suite against an already-running adapter.

    vidroute-contract --adapter 127.0.0.1:8061 --emulator http://127.0.0.1:8101 \\
        --profile runway --adapter-config adapter_sidecars/runway/config.example.yaml \\
        [--unresolvable-adapter HOST:PORT] [--update-goldens] [pytest args]

The same as ``pytest --vidroute-adapter ... --vidroute-emulator ... --vidroute-profile ...``
(the ``vidroute_contract`` plugin); anything not recognised here is passed to pytest (``-k
cancel``, ``-x``, ``-v`` ...). Golden files are read from ``./tests/testdata/<adapter>/`` unless
``--goldens-dir`` says otherwise. Exit status is pytest's: 0 all passed, 1 some failed, 2-5
usage or collection problems.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from collections.abc import Sequence
from pathlib import Path

import pytest

#: The plugin's pytest11 entry-point name, and its module for a checkout that is not installed.
ENTRY_POINT = "vidroute_contract"
PLUGIN = "adapter_sidecars.contract.plugin"
_ALREADY_IMPORTED = "Module already imported so cannot be rewritten; adapter_sidecars"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vidroute-contract",
        description="Run the vidroute adapter contract suite against a running adapter sidecar.",
        epilog="Unrecognised arguments are passed to pytest.",
    )
    parser.add_argument(
        "--adapter", required=True, metavar="HOST:PORT", help="adapter gRPC address"
    )
    parser.add_argument(
        "--emulator", required=True, metavar="URL", help="provider emulator base URL"
    )
    parser.add_argument(
        "--profile",
        required=True,
        metavar="NAME|FILE",
        help="built-in profile (runway, veo, selfhosted) or a profile YAML file",
    )
    parser.add_argument(
        "--adapter-config",
        type=Path,
        metavar="FILE",
        help="the adapter's config file: timings are read from it (at VIDROUTE_TIME_SCALE)",
    )
    parser.add_argument(
        "--unresolvable-adapter",
        metavar="HOST:PORT",
        help="the same adapter configured with an unresolvable provider host (DNS boundary test)",
    )
    parser.add_argument("--update-goldens", action="store_true", help="rewrite golden files")
    parser.add_argument(
        "--goldens-dir",
        type=Path,
        default=None,
        help="folder holding <adapter>/<case>.golden.json (default: ./tests/testdata)",
    )
    return parser


def _plugin_spec() -> str:
    """``-p`` value loading the plugin: by entry point when installed, else by module."""
    installed = any(
        ep.name == ENTRY_POINT for ep in importlib.metadata.entry_points(group="pytest11")
    )
    return ENTRY_POINT if installed else PLUGIN


def pytest_args(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """The pytest command line equivalent to `args` plus the pass-through `extra`."""
    goldens = args.goldens_dir or Path.cwd() / "tests" / "testdata"
    argv = [
        "-p",
        _plugin_spec(),
        "-p",
        "no:cacheprovider",
        # pytest marks every package of a distribution with a pytest11 entry point for
        # assertion rewriting; this command has imported ours already (harmless: the suite's
        # own modules are imported later and rewritten).
        "-W",
        f"ignore:{_ALREADY_IMPORTED}:pytest.PytestAssertRewriteWarning",
        "--vidroute-adapter",
        args.adapter,
        "--vidroute-emulator",
        args.emulator,
        "--vidroute-profile",
        args.profile,
        "--vidroute-goldens-dir",
        str(goldens.resolve()),
    ]
    if args.adapter_config:
        argv += ["--vidroute-adapter-config", str(args.adapter_config)]
    if args.unresolvable_adapter:
        argv += ["--vidroute-unresolvable-adapter", args.unresolvable_adapter]
    if args.update_goldens:
        argv.append("--vidroute-update-goldens")
    return [*argv, *extra]


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point (``vidroute-contract = adapter_sidecars.contract.cli:main``)."""
    args, extra = build_parser().parse_known_args(argv)
    return int(pytest.main(pytest_args(args, extra)))


if __name__ == "__main__":
    raise SystemExit(main())
