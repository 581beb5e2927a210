"""Spec -> Runway create request (provider-apis.md §1.3), on top of `common.compiling`.

Wire facts come from the entry's ``native`` block, never from code::

    native:
      model: gen4.5                       # wire model id (default: the entry's model)
      ratios: {"16:9@720p": "1280:720"}   # aspect@resolution -> Runway pixel ratio
      audio_param: false                  # send "audio": bool (veo3.1 family)

Aspect ratio + resolution class -> pixel ratio is LOSSLESS (the ratio *is* that size class).
Input frames go into ``promptImage`` with positions; Runway fetches them itself, so they must be
https (or data:/runway:) URIs, or objects of the platform's store that Submit uploads
(`stored`, see `runway.inputs`) — anything else is REJECT here rather than a 400 later. The plan
keeps the object's ``s3://`` URI: the upload's ``runway://`` URI exists only at Submit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapter_sidecars.common.compiling import Draft, Resolved, finish, resolve
from vidroute_core.adapter import CompiledPlan, TransformationKind
from vidroute_core.capabilities.loader import Capability
from vidroute_core.spec import AssetRef, GenerationSpec, Mode

ENDPOINTS = {
    Mode.TEXT_TO_VIDEO: "POST /v1/text_to_video",
    Mode.IMAGE_TO_VIDEO: "POST /v1/image_to_video",
    Mode.FIRST_LAST_TO_VIDEO: "POST /v1/image_to_video",
}
_FETCHABLE = ("https://", "data:", "runway://")


def _ratio(resolved: Resolved, cap: Capability, draft: Draft) -> str | None:
    ratios = cap.native.get("ratios", {})
    key = f"{resolved.aspect_ratio}@{resolved.resolution}"
    ratio = ratios.get(key) if isinstance(ratios, dict) else None
    if ratio is None:
        draft.add(
            "output.width,output.height",
            TransformationKind.REJECT,
            f"no Runway ratio for {key} on {cap.model}",
        )
        return None
    return str(ratio)


def _nothing_stored(uri: str) -> bool:
    return False


def _image(
    asset: AssetRef, position: str, path: str, draft: Draft, stored: Callable[[str], bool]
) -> dict[str, str] | None:
    if not (asset.object_uri.startswith(_FETCHABLE) or stored(asset.object_uri)):
        draft.add(path, TransformationKind.REJECT, "Runway fetches inputs itself: https URI needed")
        return None
    return {"uri": asset.object_uri, "position": position}


def build_request(
    spec: GenerationSpec, cap: Capability, stored: Callable[[str], bool] = _nothing_stored
) -> CompiledPlan:
    """Compile `spec` for one Runway entry; `stored` says which URIs Submit can upload."""
    resolved, draft = resolve(spec, cap)
    endpoint = ENDPOINTS.get(spec.mode, "")
    if not endpoint:
        return finish(draft, resolved, endpoint="", native_request=None)
    ratio = _ratio(resolved, cap, draft)
    body: dict[str, Any] = {"model": str(cap.native.get("model", cap.model))}
    if spec.prompt:
        body["promptText"] = spec.prompt
    if ratio is not None:
        body["ratio"] = ratio
    body["duration"] = resolved.duration_seconds
    if spec.mode is not Mode.TEXT_TO_VIDEO:
        images = []
        if spec.first_frame is not None:
            images.append(_image(spec.first_frame, "first", "first_frame", draft, stored))
        if spec.last_frame is not None and cap.supports_last_frame:
            images.append(_image(spec.last_frame, "last", "last_frame", draft, stored))
        body["promptImage"] = [i for i in images if i is not None]
    if resolved.seed is not None:
        body["seed"] = resolved.seed
    if resolved.negative_prompt:
        body["negativePrompt"] = resolved.negative_prompt
    if cap.native.get("audio_param"):
        body["audio"] = resolved.generate_audio
    return finish(draft, resolved, endpoint=endpoint, native_request=body)
