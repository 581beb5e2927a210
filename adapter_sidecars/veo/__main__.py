"""``python -m adapter_sidecars.veo --config FILE [--listen ADDR] [--port-file PATH]``."""

from __future__ import annotations

from collections.abc import Sequence

from adapter_sidecars.common.cli import run
from adapter_sidecars.veo.adapter import VeoAdapter


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    return run("vidroute-adapter-veo", VeoAdapter.from_config, argv)


if __name__ == "__main__":
    raise SystemExit(main())
