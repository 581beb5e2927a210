"""How Runway fetches an input URL at create time (provider-apis.md §1.7, §1.10).

Runway reads ``promptImage`` / ``videoUri`` URLs itself: https only, a domain rather than an IP
address, no redirects, a 2xx with an image or video ``Content-Type`` and a size under the URL cap
(16 MB for images, 32 MB for videos). Anything else refuses the create with 400 before a task
exists. `check_remote` performs that fetch and answers the refusal text, None when usable.
"""

from __future__ import annotations

import ipaddress
import ssl

import httpx

#: Size caps of an asset given by URL (§1.10): images 16 MB, videos 32 MB.
URL_CAPS = {"image/": 16 * 1024 * 1024, "video/": 32 * 1024 * 1024}
FETCH_TIMEOUT_S = 10.0


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _verify(ca_file: str) -> ssl.SSLContext | bool:
    if not ca_file:
        return True
    context = ssl.create_default_context()
    context.load_verify_locations(ca_file)
    return context


async def check_remote(uri: str, *, ca_file: str = "") -> str | None:
    """Fetch `uri` as Runway would; the 400 message when it cannot be used, else None."""
    try:
        url = httpx.URL(uri)
    except httpx.InvalidURL:
        return f"Invalid asset URL: {uri[:80]}"
    if url.scheme != "https":
        return "Invalid asset URL: assets must be served over HTTPS"
    if not url.host or _is_ip(url.host):
        return "Invalid asset URL: the host must be a domain name, not an IP address"
    shown = str(url.copy_with(query=None, fragment=None))  # never the signature
    try:
        async with (
            httpx.AsyncClient(
                verify=_verify(ca_file), timeout=FETCH_TIMEOUT_S, follow_redirects=False
            ) as client,
            client.stream("GET", url) as response,
        ):
            if response.status_code != 200:
                return f"Failed to fetch asset {shown}: HTTP {response.status_code}"
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            cap = next((c for prefix, c in URL_CAPS.items() if kind.startswith(prefix)), 0)
            if not cap:
                return f"Unsupported asset content type {kind or 'none'!r} at {shown}"
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > cap:
                    return f"Asset at {shown} is larger than {cap} bytes"
    except httpx.HTTPError as exc:
        return f"Failed to fetch asset {shown}: {type(exc).__name__}"
    return None
