"""``python -m adapter_sidecars.runway --config FILE [--listen ADDR] [--port-file PATH]``."""

from __future__ import annotations

from collections.abc import Sequence

from adapter_sidecars.common.cli import run
from adapter_sidecars.runway.adapter import RunwayAdapter


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    return run("vidroute-adapter-runway", RunwayAdapter.from_config, argv)


if __name__ == "__main__":
    raise SystemExit(main())
