"""Spec -> self-hosted job request (``POST /v1/jobs``), on top of `common.compiling`.

The job API speaks our own vocabulary (resolution class, aspect label, seconds), so every
mapping is EXACT or LOSSLESS except what `resolve` already degrades. ``native.model`` may name
the served model when it differs from the capability's model id.
"""

from __future__ import annotations

from typing import Any

from adapter_sidecars.common.compiling import finish, resolve
from vidroute_core.adapter import CompiledPlan
from vidroute_core.capabilities.loader import Capability
from vidroute_core.spec import GenerationSpec

ENDPOINT = "POST /v1/jobs"


def build_request(spec: GenerationSpec, cap: Capability) -> CompiledPlan:
    """Compile `spec` for one self-hosted entry."""
    resolved, draft = resolve(spec, cap)
    body: dict[str, Any] = {
        "model": str(cap.native.get("model", cap.model)),
        "prompt": spec.prompt,
        "duration_s": resolved.duration_seconds,
        "resolution": resolved.resolution,
        "aspect_ratio": resolved.aspect_ratio,
    }
    if resolved.negative_prompt:
        body["negative_prompt"] = resolved.negative_prompt
    if spec.first_frame is not None:
        body["image_url"] = spec.first_frame.object_uri
    if resolved.seed is not None:
        body["seed"] = resolved.seed
    return finish(draft, resolved, endpoint=ENDPOINT, native_request=body)
