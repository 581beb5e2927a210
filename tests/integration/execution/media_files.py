"""Tiny real MP4 clips for fetch tests: solid-colour H.264 (yuv420p), optional silent AAC."""

from __future__ import annotations

import io
from fractions import Fraction
from functools import lru_cache

import av
import numpy as np

AUDIO_RATE = 48_000


@lru_cache(maxsize=16)
def render_mp4(
    duration_s: float,
    width: int = 160,
    height: int = 90,
    fps: int = 24,
    *,
    with_audio: bool = False,
    colour: tuple[int, int, int] = (30, 120, 200),
) -> bytes:
    """MP4 bytes holding round(duration_s * fps) frames of one colour (cached per arguments)."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.time_base = Fraction(1, fps)
        video.options = {"preset": "ultrafast", "crf": "40"}
        audio = container.add_stream("aac", rate=AUDIO_RATE) if with_audio else None
        pixels = np.empty((height, width, 3), dtype=np.uint8)
        pixels[:] = colour
        for index in range(round(duration_s * fps)):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = index
            container.mux(video.encode(frame))
        container.mux(video.encode())
        if audio is not None:
            samples = audio.codec_context.frame_size or 1024
            for index in range(round(duration_s * AUDIO_RATE / samples)):
                silence = av.AudioFrame.from_ndarray(
                    np.zeros((1, samples), dtype=np.float32), format="fltp", layout="mono"
                )
                silence.sample_rate = AUDIO_RATE
                silence.pts = index * samples
                container.mux(audio.encode(silence))
            container.mux(audio.encode())
    return buffer.getvalue()
