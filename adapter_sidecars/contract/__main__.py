"""``python -m adapter_sidecars.contract ...``: the same as ``vidroute-contract``."""

from adapter_sidecars.contract.cli import main

raise SystemExit(main())
