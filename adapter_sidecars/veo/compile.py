"""Spec -> Veo ``predictLongRunning`` body (Gemini API, provider-apis.md §2.1).

The Gemini API wants every image (``image``, ``lastFrame``, ``referenceImages[].image``) as
inline ``{"bytesBase64Encoded", "mimeType"}``. Compile stays deterministic and offline, so the
plan carries an asset reference (URI, declared MIME type, checksum) in each image slot and
Submit inlines the bytes (`adapter_sidecars.veo.assets`). The request hash therefore covers the
asset's checksum, not its signed URL. An asset the adapter cannot read (``gs://``, ``s3://``,
``asset://``, no URI) is a REJECT here: Gemini refuses ``gcsUri`` and we hold no bucket
credentials. ``video`` (extension) stays ``{"uri"}``, which Gemini accepts for its own outputs.
Veo 3.x in Gemini mode always renders audio (``generateAudio`` is refused), so the capability
says ``audio_optional: false`` and a silent request records a LOSSLESS strip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapter_sidecars.common.compiling import Draft, finish, resolve
from adapter_sidecars.veo import assets
from vidroute_core.adapter import CompiledPlan, TransformationKind
from vidroute_core.capabilities.loader import Capability
from vidroute_core.spec import AssetRef, GenerationSpec, Mode


def _image(path: str, asset: AssetRef, draft: Draft) -> dict[str, str]:
    """The asset reference of one image slot; a REJECT when the adapter cannot read it."""
    uri = asset.object_uri
    if assets.scheme_of(uri) not in assets.RESOLVABLE_SCHEMES:
        shown = f"{assets.scheme_of(uri)}:// assets" if uri else "assets without a URI"
        draft.add(
            f"{path}.object_uri",
            TransformationKind.REJECT,
            f"the Gemini API takes images as inline bytes; {shown} cannot be read by the adapter "
            "(it fetches https assets)",
        )
    return assets.reference(uri, asset.mime_type, asset.checksum_sha256)


def build_instance(
    spec: GenerationSpec,
    cap: Capability,
    draft: Draft,
    *,
    image: Callable[[str, AssetRef, Draft], dict[str, str]],
    video: Callable[[str], dict[str, str]],
) -> dict[str, Any]:
    """The ``instances[0]`` of a Veo predictLongRunning call, on either surface: the prompt,
    the frames and references in the surface's `image` form, an extended video in its
    `video` form (each surface reads images and videos its own way)."""
    instance: dict[str, Any] = {"prompt": spec.prompt}
    if spec.first_frame is not None:
        instance["image"] = image("first_frame", spec.first_frame, draft)
    if spec.last_frame is not None and cap.supports_last_frame:
        instance["lastFrame"] = image("last_frame", spec.last_frame, draft)
    if spec.references and cap.max_reference_images:
        instance["referenceImages"] = [
            {"image": image(f"references[{i}]", ref, draft), "referenceType": "asset"}
            for i, ref in enumerate(spec.references)
        ]
    if spec.source_video is not None and spec.mode is Mode.EXTEND_VIDEO:
        instance["video"] = video(spec.source_video.object_uri)
    return instance


def build_request(spec: GenerationSpec, cap: Capability) -> CompiledPlan:
    """Compile `spec` for one Veo entry."""
    resolved, draft = resolve(spec, cap)
    model = str(cap.native.get("model", cap.model))
    instance = build_instance(spec, cap, draft, image=_image, video=lambda uri: {"uri": uri})
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
