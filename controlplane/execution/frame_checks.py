"""Frozen and black frames on a few decoded frames of an output (design 9.14's technical signals).

`frame_defects` continues the probe's decode of the video stream for at most `MAX_DECODED`
frames (two seconds at 24 fps; about 1-2 ms of CPU a 720p frame, so tens of ms an output) and
looks at `SAMPLES` of them, evenly spaced, each reduced to a 32x18 luma thumbnail:

* BLACK_FRAMES: every sampled thumbnail's mean luma is below `BLACK_LUMA` (of 255; limited-range
  black is 16);
* FROZEN_FRAMES: with at least three samples over more than a second, no sampled thumbnail differs
  from the previous one by more than `FROZEN_DELTA` (mean absolute luma difference).

These are signals for the quality score, not reasons to refuse an output: a deliberately still
shot is a valid product, so the probe records them and delivery goes on. A video too short to
sample (fewer than three frames) reports nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

import av
import numpy as np

from controlplane.domain.quality import Defect

MAX_DECODED = 48
SAMPLES = 6
BLACK_LUMA = 20.0
FROZEN_DELTA = 0.5
_THUMB = (32, 18)


def _positions(frames: int) -> set[int]:
    last = min(frames, MAX_DECODED) - 1
    if last < 2:
        return set()
    return {round(i * last / (SAMPLES - 1)) for i in range(SAMPLES)}


def frame_defects(
    first: av.VideoFrame, rest: Iterator[av.VideoFrame], frames: int, fps: float | None
) -> tuple[Defect, ...]:
    """The defects of the sampled frames; `first` is the frame the probe decoded, `rest` the
    decoder's further frames, `frames` the stream's frame count (or its estimate)."""
    wanted = _positions(frames)
    if not wanted:
        return ()
    thumbs: list[np.ndarray] = []
    stop = max(wanted)
    frame: av.VideoFrame | None = first
    index = 0
    while frame is not None:
        if index in wanted:
            small = frame.reformat(width=_THUMB[0], height=_THUMB[1], format="gray")
            thumbs.append(small.to_ndarray().astype(np.float32))
        if index >= stop:
            break
        frame = next(rest, None)
        index += 1
    if len(thumbs) < 3:
        return ()
    found: list[Defect] = []
    if all(float(t.mean()) < BLACK_LUMA for t in thumbs):
        found.append(Defect.BLACK_FRAMES)
    span_s = stop / fps if fps else 0.0
    deltas = [float(np.abs(b - a).mean()) for a, b in pairwise(thumbs)]
    if span_s > 1.0 and max(deltas) <= FROZEN_DELTA:
        found.append(Defect.FROZEN_FRAMES)
    return tuple(found)
