"""The caller-webhook signing file of a dev stack: `vidroute up` without ``VIDROUTE_WEBHOOKS_FILE``
writes one under ``./var`` on its first start, so ``vidroute submit --webhook-url`` works there.

One tenant (the dev tenant, ``acme``) with a fresh ``whsec_`` secret (32 random bytes, the
Standard Webhooks format `controlplane.webhooks.config` reads). The file is kept on later starts,
unlike the dev API tokens: a receiver someone set up with the secret keeps verifying. A receiver
in development is a local ``http://127.0.0.1:...`` server, so `vidroute up` also allows plain
http and private addresses (``VIDROUTE_WEBHOOK_ALLOW_HTTP`` / ``_ALLOW_PRIVATE``) unless those
are set; production (k8s) allows neither.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from pathlib import Path

import yaml

DEV_WEBHOOKS_FILE = Path("var") / "dev-webhooks.yaml"


def ensure_dev_webhooks(run_dir: Path, tenant: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a dev stack adds to `environ` for caller webhooks ({} when it names its
    own file): the signing file under `run_dir` (written owner-only if absent), the allowances."""
    if environ.get("VIDROUTE_WEBHOOKS_FILE"):
        return {}
    path = run_dir / DEV_WEBHOOKS_FILE.name
    if not path.is_file():
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
        run_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)  # a secret: owner-only before anything is written to it
        document = {"tenants": {tenant: {"secret": secret}}}
        path.write_text(
            "# Written by `vidroute up`: the dev tenant's caller-webhook signing secret.\n"
            + yaml.safe_dump(document, sort_keys=True),
            encoding="utf-8",
        )
    print(f"caller webhooks: tenant {tenant} signs with the secret in {path}", flush=True)
    added = {"VIDROUTE_WEBHOOKS_FILE": str(path)}
    for name in ("VIDROUTE_WEBHOOK_ALLOW_HTTP", "VIDROUTE_WEBHOOK_ALLOW_PRIVATE"):
        if not environ.get(name):
            added[name] = "1"
    return added
