"""Sample specs of a capability entry: what a publication compiles against the live sidecars
before it may serve (design 9.25.5: 样例规格编译).

Every request shape the entry declares and its constraints allow: each mode x resolution x
aspect ratio x duration x audio choice, one spec each (the input assets a mode needs are
https placeholders with a checksum, as a caller sends them). Compiling all of them is what
proves the adapter can map everything the catalog will route to it: a model the adapter has
no mapping for (a typo) is refused on the first sample, a ratio it cannot map on that ratio's.
An entry whose value space is too large gets a covering set instead (every value of every axis
at least once), so a check stays a few hundred compiles.

An aspect ratio no width x height reduces to (``21:9`` is 7:3 once reduced) cannot be asked
for, so it has no sample; `unrequestable` names those.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from controlplane.domain.routing.filters import aspect_label
from controlplane.domain.routing.plan import RESOLUTION_PX
from vidroute_core.capabilities.constraints import Environment, violations
from vidroute_core.capabilities.loader import Capability
from vidroute_core.spec import AssetRef, GenerationSpec, Mode, OutputSpec

MAX_SAMPLES = 400
MAX_SCAN = 200_000  # shapes a covering set looks through at most
Shape = tuple[Mode, str, str, int, bool]
SAMPLE_TENANT = "vidroute-release-check"
_IMAGE = AssetRef(
    "https://samples.vidroute.invalid/frame.png",
    "image/png",
    1024,
    hashlib.sha256(b"vidroute sample frame").hexdigest(),
)
_VIDEO = AssetRef(
    "https://samples.vidroute.invalid/source.mp4",
    "video/mp4",
    4096,
    hashlib.sha256(b"vidroute sample video").hexdigest(),
)


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample request and how a violation names it (``TEXT_TO_VIDEO 16:9 720p 5s``)."""

    label: str
    spec: GenerationSpec


def _size(aspect: str, resolution: str) -> tuple[int, int] | None:
    """Width and height of `aspect` with its short side at `resolution`; None when no size
    reduces to that label."""
    try:
        a, b = (int(x) for x in aspect.split(":"))
    except ValueError:
        return None
    short = RESOLUTION_PX.get(resolution)
    if short is None or a <= 0 or b <= 0 or short % min(a, b):
        return None
    k = short // min(a, b)
    width, height = a * k, b * k
    return (width, height) if aspect_label(width, height) == aspect else None


def unrequestable(cap: Capability) -> list[str]:
    """The entry's aspect ratios no request can name (at any of its resolutions)."""
    return [a for a in cap.aspect_ratios if all(_size(a, r) is None for r in cap.resolutions)]


def _audio(cap: Capability) -> tuple[bool, ...]:
    if not cap.native_audio:
        return (False,)
    return (False, True) if cap.audio_optional else (True,)


def _env(mode: Mode, res: str, aspect: str, dur: int, audio: bool) -> Environment:
    return {
        "mode": mode.value,
        "resolution": res,
        "aspect_ratio": aspect,
        "duration_seconds": dur,
        "with_audio": audio,
        "sample_count": 1,
        "has_last_frame": mode is Mode.FIRST_LAST_TO_VIDEO,
        "reference_count": 0,
        "has_negative_prompt": False,
        "has_seed": False,
    }


def _spec(mode: Mode, width: int, height: int, dur: int, audio: bool) -> GenerationSpec:
    image = mode in (Mode.IMAGE_TO_VIDEO, Mode.FIRST_LAST_TO_VIDEO)
    return GenerationSpec(
        tenant_id=SAMPLE_TENANT,
        prompt="A paper boat drifting down a rain gutter, release sample",
        mode=mode,
        output=OutputSpec(width, height, dur * 1000, with_audio=audio),
        first_frame=_IMAGE if image else None,
        last_frame=_IMAGE if mode is Mode.FIRST_LAST_TO_VIDEO else None,
        source_video=_VIDEO if mode in (Mode.VIDEO_TO_VIDEO, Mode.EXTEND_VIDEO) else None,
    )


def _all(cap: Capability) -> Iterator[Shape]:
    return itertools.product(
        cap.modes, cap.resolutions, cap.aspect_ratios, cap.durations_seconds, _audio(cap)
    )


def _valid(cap: Capability, shape: Shape) -> bool:
    mode, res, aspect, dur, audio = shape
    if _size(aspect, res) is None:
        return False
    return not violations(cap.constraints, _env(mode, res, aspect, dur, audio))


def _covering(cap: Capability) -> Iterator[Shape]:
    """Legal shapes until every value of every axis appeared in one (for a huge value space):
    a shape is kept when it shows a value not shown yet."""
    axes = (cap.modes, cap.resolutions, cap.aspect_ratios, cap.durations_seconds, _audio(cap))
    missing = {(axis, value) for axis, values in enumerate(axes) for value in values}
    for n, shape in enumerate(_all(cap)):
        if not missing or n >= MAX_SCAN:
            return
        new = set(enumerate(shape)) & missing
        if new and _valid(cap, shape):
            missing -= new
            yield shape


def sample_specs(cap: Capability) -> list[Sample]:
    """The entry's samples (module docstring): every legal shape, or a covering set."""
    count = (
        len(cap.modes)
        * len(cap.resolutions)
        * len(cap.aspect_ratios)
        * len(cap.durations_seconds)
        * len(_audio(cap))
    )
    shapes = _all(cap) if count <= MAX_SAMPLES else _covering(cap)
    out = []
    for shape in shapes:
        if not _valid(cap, shape):
            continue
        mode, res, aspect, dur, audio = shape
        size = _size(aspect, res)
        assert size is not None  # _valid checked it
        label = f"{mode.value} {aspect} {res} {dur}s" + (" audio" if audio else "")
        out.append(Sample(label, _spec(mode, *size, dur, audio)))
    return out
