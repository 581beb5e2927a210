"""``python -m adapter_sidecars.veo --config FILE [--listen ADDR] [--port-file PATH]``.

The accounts' ``options.surface`` (``gemini``, the default, or ``vertex``) picks the adapter.
"""

from __future__ import annotations

from collections.abc import Sequence

from adapter_sidecars.common.cli import run
from adapter_sidecars.veo.surfaces import build_adapter


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    return run("vidroute-adapter-veo", build_adapter, argv)


if __name__ == "__main__":
    raise SystemExit(main())
