"""The console's vendored htmx is the npm package package.json pins, with its licence header,
and no template loads anything from another origin (no CDN: the console works offline)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import require_server

ROOT = Path(__file__).resolve().parents[3]
STATIC = ROOT / "controlplane" / "console" / "static"
TEMPLATES = ROOT / "controlplane" / "console" / "templates"


def test_vendored_htmx_is_the_version_package_json_pins() -> None:
    """The committed htmx.min.js names the exact htmx.org version of package.json and its 0BSD
    licence in its first line."""
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["htmx.org"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned), "htmx.org must be pinned exactly"
    header = (STATIC / "htmx.min.js").read_text(encoding="utf-8").splitlines()[0]
    assert header.startswith(f"/*! htmx.org {pinned} | Zero-Clause BSD"), header


def test_vendored_htmx_matches_the_installed_package() -> None:
    """After `npm ci`, the committed copy is byte for byte the package's dist file under the
    header (scripts/vendor_htmx.sh writes it)."""
    dist = ROOT / "node_modules" / "htmx.org" / "dist" / "htmx.min.js"
    if not dist.exists():
        require_server("node_modules not installed (npm ci; `make test` runs it)")
    vendored = (STATIC / "htmx.min.js").read_bytes()
    assert vendored.split(b"\n", 1)[1] == dist.read_bytes()


def test_pages_load_no_remote_script_or_stylesheet() -> None:
    """No template refers to another origin: the console works offline."""
    for template in TEMPLATES.glob("*.html"):
        text = template.read_text(encoding="utf-8")
        assert not re.search(r"""(src|href)=["'](https?:)?//""", text), template.name
