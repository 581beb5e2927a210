"""Procedural MP4 clips (H.264, yuv420p) derived from the prompt, plus signed media links.

The colour and the moving square come from a hash of the prompt, so the same request always
yields the same bytes; rendered clips are cached by their parameters. Emulators hand out
links like ``/media/<token>.mp4?_jwt=<sig>&exp=<unix>`` that stop working after ``exp``.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import secrets
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from urllib.parse import urlencode

import av
import numpy as np


@dataclass(frozen=True)
class MediaSpec:
    """Everything that determines a rendered clip."""

    prompt: str
    duration_s: float
    width: int = 320
    height: int = 180
    fps: int = 24


def fit_size(ratio_w: int, ratio_h: int, max_side: int) -> tuple[int, int]:
    """Scale an aspect ratio so its longer side is `max_side`; both sides even (yuv420p)."""
    scale = max_side / max(ratio_w, ratio_h)
    w, h = round(ratio_w * scale / 2) * 2, round(ratio_h * scale / 2) * 2
    return max(w, 2), max(h, 2)


def render_mp4(spec: MediaSpec) -> bytes:
    """Render `spec` to MP4 bytes (cached)."""
    return _render(spec.prompt, round(spec.duration_s, 3), spec.width, spec.height, spec.fps)


@lru_cache(maxsize=64)
def _render(prompt: str, duration_s: float, width: int, height: int, fps: int) -> bytes:
    digest = hashlib.sha256(prompt.encode()).digest()
    background = np.array(list(digest[0:3]), dtype=np.uint8)
    square = np.array([255 - c for c in digest[0:3]], dtype=np.uint8)
    side = max(4, min(width, height) // 4)
    frames = max(1, round(duration_s * fps))
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, fps)
        stream.options = {"preset": "ultrafast", "tune": "zerolatency", "crf": "35"}
        base = np.empty((height, width, 3), dtype=np.uint8)
        base[:, :] = background
        for i in range(frames):
            image = base.copy()
            x = int((width - side) * i / max(frames - 1, 1))
            y = int((height - side) * (0.5 + 0.4 * np.sin(i / fps * 2 + digest[3])))
            y = min(max(y, 0), height - side)
            image[y : y + side, x : x + side] = square
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


class MediaLinks:
    """Signed, expiring links to rendered clips served by the emulator itself."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()
        self._specs: dict[str, MediaSpec] = {}
        self._lock = threading.Lock()

    def register(self, spec: MediaSpec) -> str:
        token = secrets.token_hex(12)
        with self._lock:
            self._specs[token] = spec
        return token

    def url(self, base_url: str, token: str, ttl_s: float, now: float | None = None) -> str:
        """A link valid for `ttl_s` seconds from `now` (negative ttl = already expired)."""
        exp = int((now or time.time()) + ttl_s)
        query = urlencode({"_jwt": self._sig(token, exp), "exp": exp})
        return f"{base_url}/media/{token}.mp4?{query}"

    def check(self, token: str, jwt: str, exp: str) -> MediaSpec | None:
        """Return the spec when the link is authentic and unexpired, else None."""
        spec = self._specs.get(token)
        try:
            exp_i = int(exp)
        except ValueError:
            return None
        if spec is None or exp_i < time.time():
            return None
        return spec if hmac.compare_digest(self._sig(token, exp_i), jwt) else None

    def clear(self) -> None:
        with self._lock:
            self._specs.clear()

    def _sig(self, token: str, exp: int) -> str:
        return hmac.new(self._secret, f"{token}.{exp}".encode(), hashlib.sha256).hexdigest()[:40]
