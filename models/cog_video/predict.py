"""A Cog predictor that renders a real MP4 (H.264, yuv420p) from a prompt and a duration.

It stands in for a video diffusion model on a GPU host: the same Cog HTTP protocol, inputs a
video model takes (prompt, duration, resolution, aspect ratio, seed), an MP4 file as output.
The picture is a square moving over a background whose colours come from a hash of the prompt
(and seed), so a request always renders the same bytes. ``seconds_per_output_second`` makes a
run take GPU-like time (0 = as fast as it renders), so tests can hold a run in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
import time
from fractions import Fraction

import av
import numpy as np
from cog import BasePredictor, Input, Path

#: Long side of the rendered clip per resolution class (tiny: this is a stand-in model).
_LONG_SIDE = {"480p": 96, "720p": 128, "1080p": 160}
_FPS = 8


def _size(resolution: str, aspect_ratio: str) -> tuple[int, int]:
    long_side = _LONG_SIDE.get(resolution, 96)
    w_part, _, h_part = aspect_ratio.partition(":")
    try:
        ratio_w, ratio_h = max(1, int(w_part)), max(1, int(h_part))
    except ValueError:
        ratio_w, ratio_h = 16, 9
    scale = long_side / max(ratio_w, ratio_h)
    return max(2, round(ratio_w * scale / 2) * 2), max(2, round(ratio_h * scale / 2) * 2)


class Predictor(BasePredictor):
    """Prompt + duration -> MP4."""

    def setup(self) -> None:
        """Nothing to load: a real model loads its weights here (the server says STARTING)."""

    async def predict(  # noqa: PLR0917  # Cog reads a model's inputs from these parameters
        self,
        prompt: str = Input(description="What the clip shows"),
        duration_s: float = Input(default=2.0, ge=0.1, le=30.0, description="Clip length"),
        resolution: str = Input(default="480p", description="480p, 720p or 1080p"),
        aspect_ratio: str = Input(default="16:9", description="W:H"),
        seed: int = Input(default=0, description="Varies the colours"),
        negative_prompt: str = Input(default="", description="Ignored by this stand-in"),
        seconds_per_output_second: float = Input(
            default=0.0, ge=0.0, le=60.0, description="Simulated GPU time per output second"
        ),
        fail_with: str = Input(default="", description="Fail this run: OOM or any error code"),
    ) -> Path:
        """Render the clip; a cancel interrupts the simulated GPU time.

        Async, so a server started with COG_MAX_CONCURRENCY > 1 runs several at once."""
        if fail_with == "OOM":  # what torch says when a GPU runs out of memory
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if fail_with:
            raise RuntimeError(f"prediction failed: {fail_with}")
        busy_s = duration_s * seconds_per_output_second
        started = time.monotonic()
        out = await asyncio.to_thread(_render, prompt, duration_s, resolution, aspect_ratio, seed)
        await asyncio.sleep(max(0.0, busy_s - (time.monotonic() - started)))  # cancel lands here
        return out


def _render(prompt: str, duration_s: float, resolution: str, aspect_ratio: str, seed: int) -> Path:
    width, height = _size(resolution, aspect_ratio)
    digest = hashlib.sha256(f"{seed}:{prompt}".encode()).digest()
    background = np.array(list(digest[0:3]), dtype=np.uint8)
    square = np.array([255 - c for c in digest[0:3]], dtype=np.uint8)
    side = max(4, min(width, height) // 4)
    frames = max(1, round(duration_s * _FPS))
    out = Path(tempfile.mkdtemp(prefix="cog_video_")) / "output.mp4"
    with av.open(str(out), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=_FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, _FPS)
        stream.options = {"preset": "ultrafast", "crf": "35"}
        base = np.empty((height, width, 3), dtype=np.uint8)
        base[:, :] = background
        for i in range(frames):
            image = base.copy()
            x = int((width - side) * i / max(frames - 1, 1))
            y = int((height - side) * (0.5 + 0.4 * np.sin(i / _FPS * 2 + digest[3])))
            y = min(max(y, 0), height - side)
            image[y : y + side, x : x + side] = square
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out
