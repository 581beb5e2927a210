"""Procedural MP4 rendering probed with PyAV."""

from __future__ import annotations

import io

import av
import pytest

from adapter_sidecars.emulators.media import MediaSpec, fit_size, render_mp4


@pytest.mark.parametrize(
    ("duration", "size", "fps"), [(5.0, (320, 180), 24), (2.5, (180, 320), 12)]
)
def test_rendered_clip_matches_request(duration: float, size: tuple[int, int], fps: int) -> None:
    """The clip is H.264 yuv420p in MP4 with the asked size and duration within one frame."""
    data = render_mp4(MediaSpec("a lighthouse", duration, *size, fps=fps))
    with av.open(io.BytesIO(data), mode="r") as container:
        assert "mp4" in container.format.name
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert stream.codec_context.pix_fmt == "yuv420p"
        assert (stream.width, stream.height) == size
        assert container.duration is not None
        assert abs(container.duration / 1_000_000 - duration) <= 1 / fps


def test_rendering_is_deterministic_per_prompt() -> None:
    """Equal specs give identical bytes and different prompts give different clips."""
    spec = MediaSpec("same", 1.0)
    assert render_mp4(spec) == render_mp4(MediaSpec("same", 1.0))
    assert render_mp4(spec) != render_mp4(MediaSpec("other", 1.0))


def test_fit_size_keeps_aspect_and_even_sides() -> None:
    """Ratios scale to the max side with even dimensions."""
    assert fit_size(1280, 720, 320) == (320, 180)
    assert fit_size(720, 1280, 320) == (180, 320)
    assert fit_size(1584, 672, 320) == (320, 136)
