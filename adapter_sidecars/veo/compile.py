"""Spec -> Veo ``predictLongRunning`` body (Gemini API, provider-apis.md §2.1).

Images travel as ``{"bytesBase64Encoded", "mimeType"}`` when the asset is a ``data:`` URI. For
an https asset the body carries ``{"uri", "mimeType"}``, which the emulator accepts but the real
Gemini API does not (it wants inline bytes): fetching and inlining assets at submit time is not
implemented yet. Veo 3.x in Gemini mode always renders audio (``generateAudio`` is refused), so
the capability says ``audio_optional: false`` and a silent request records a LOSSLESS strip.
"""

from __future__ import annotations

from typing import Any

from adapter_sidecars.common.compiling import finish, resolve
from adapter_sidecars.common.types import Plan
from controlplane.capabilities.loader import Capability
from controlplane.domain.spec import AssetRef, GenerationSpec, Mode


def _media(asset: AssetRef) -> dict[str, str]:
    uri = asset.object_uri
    if uri.startswith("data:") and ";base64," in uri:
        header, data = uri.split(",", 1)
        mime = header[5:].split(";", 1)[0] or asset.mime_type
        return {"bytesBase64Encoded": data, "mimeType": mime}
    media = {"uri": uri}
    if asset.mime_type:
        media["mimeType"] = asset.mime_type
    return media


def build_request(spec: GenerationSpec, cap: Capability) -> Plan:
    """Compile `spec` for one Veo entry."""
    resolved, draft = resolve(spec, cap)
    model = str(cap.native.get("model", cap.model))
    instance: dict[str, Any] = {"prompt": spec.prompt}
    if spec.first_frame is not None:
        instance["image"] = _media(spec.first_frame)
    if spec.last_frame is not None and cap.supports_last_frame:
        instance["lastFrame"] = _media(spec.last_frame)
    if spec.source_video is not None and spec.mode is Mode.EXTEND_VIDEO:
        instance["video"] = {"uri": spec.source_video.object_uri}
    parameters: dict[str, Any] = {
        "aspectRatio": resolved.aspect_ratio,
        "resolution": resolved.resolution,
        "durationSeconds": resolved.duration_seconds,
        "sampleCount": resolved.sample_count,
    }
    if resolved.negative_prompt:
        parameters["negativePrompt"] = resolved.negative_prompt
    body = {"instances": [instance], "parameters": parameters}
    return finish(
        draft,
        resolved,
        endpoint=f"POST /v1beta/models/{model}:predictLongRunning",
        native_request=body,
    )
