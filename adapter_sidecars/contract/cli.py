"""``vidroute-contract``: run the adapter contract suite against an already-running adapter.

    vidroute-contract --adapter 127.0.0.1:50061 --emulator http://127.0.0.1:8101 \\
        --profile runway [--unresolvable-adapter HOST:PORT] [--update-goldens] [pytest args]

Anything not recognised here is passed to pytest (``-k cancel``, ``-x``, ``-v`` ...). Golden
files are read from ``./tests/testdata/<adapter>/`` unless ``--goldens-dir`` says otherwise.
Exit status is pytest's: 0 all passed, 1 some failed, 2-5 usage or collection problems.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pytest

from adapter_sidecars.contract import bound

PLUGIN = "adapter_sidecars.contract.plugin"


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


def pytest_args(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """The pytest command line equivalent to `args` plus the pass-through `extra`."""
    goldens = args.goldens_dir or Path.cwd() / "tests" / "testdata"
    argv = [
        "-p",
        PLUGIN,
        "-p",
        "no:cacheprovider",
        str(Path(bound.__file__)),
        "--adapter",
        args.adapter,
        "--emulator",
        args.emulator,
        "--profile",
        args.profile,
        "--goldens-dir",
        str(goldens.resolve()),
    ]
    if args.unresolvable_adapter:
        argv += ["--unresolvable-adapter", args.unresolvable_adapter]
    if args.update_goldens:
        argv.append("--update-goldens")
    return [*argv, *extra]


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point (``vidroute-contract = adapter_sidecars.contract.cli:main``)."""
    args, extra = build_parser().parse_known_args(argv)
    return int(pytest.main(pytest_args(args, extra)))


if __name__ == "__main__":
    raise SystemExit(main())
