"""``python -m adapter_sidecars.selfhosted --config FILE [--listen ADDR] [--port-file PATH]``."""

from __future__ import annotations

from collections.abc import Sequence

from adapter_sidecars.common.cli import run
from adapter_sidecars.selfhosted.adapter import build_adapter


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    return run("vidroute-adapter-selfhosted", build_adapter, argv)


if __name__ == "__main__":
    raise SystemExit(main())
