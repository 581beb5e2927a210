"""Remove the audio of a delivered MP4 without touching its video (the 9.7 LOSSLESS strip).

Models that always render audio (Veo 3 on the Gemini API) answer a silent request with a
soundtrack; the compile plan records "audio stripped on delivery" as LOSSLESS, and this is the
delivery. The first video stream is copied packet for packet into a new MP4 (no decode, no
re-encode, so no quality loss and no cost in CPU); every other track is left behind. The result
is then opened again and must prove it: no audio stream, one video stream with the same codec,
size, packet count and packet bytes. Blocking functions: run them in a thread.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import av

__all__ = ["size_and_sha256", "strip_audio"]

_CHUNK = 256 * 1024


@dataclass(frozen=True, slots=True)
class _Video:
    codec: str
    width: int
    height: int
    packets: int
    payload_bytes: int
    audio_streams: int
    video_streams: int


def _video_of(path: Path) -> _Video:
    with av.open(str(path), mode="r") as container:
        video = container.streams.video[0]
        ctx = video.codec_context
        packets = payload = 0
        for packet in container.demux(video):
            if packet.size:
                packets += 1
                payload += packet.size
        return _Video(
            ctx.name,
            ctx.width,
            ctx.height,
            packets,
            payload,
            len(container.streams.audio),
            len(container.streams.video),
        )


def strip_audio(source: Path, target: Path) -> str | None:
    """Write `source` without audio to `target`; None when done and proven, else the problem."""
    try:
        with (
            av.open(str(source), mode="r") as src,
            av.open(str(target), mode="w", format="mp4") as dst,
        ):
            video_in = src.streams.video[0]
            video_out = dst.add_stream_from_template(video_in)
            for packet in src.demux(video_in):
                if packet.dts is None:  # the demuxer's end-of-stream flush packet
                    continue
                packet.stream = video_out
                dst.mux(packet)
        before, after = _video_of(source), _video_of(target)
    except (av.FFmpegError, IndexError, ValueError) as exc:
        return f"stripping the audio track failed: {exc}"
    if after.audio_streams or after.video_streams != 1:
        return f"the stripped file still has {after.audio_streams} audio stream(s)"
    same = (before.codec, before.width, before.height, before.packets, before.payload_bytes)
    if (after.codec, after.width, after.height, after.packets, after.payload_bytes) != same:
        return f"the stripped video differs from the delivered one: {after} vs {before}"
    return None


def size_and_sha256(path: Path) -> tuple[int, str]:
    """The file's size and SHA-256 (hex), read in chunks."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()
