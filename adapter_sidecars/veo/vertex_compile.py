"""Spec -> Veo ``predictLongRunning`` body on Vertex AI (provider-apis.md §2.2).

Same ``instances[]/parameters`` envelope as the Gemini API, with what only Vertex takes:

* images may be ``{"gcsUri", "mimeType"}``: a ``gs://`` asset is passed by reference, so
  Google reads it from Cloud Storage with the project's own permissions. An ``https``/``data``
  asset is compiled to an asset reference and inlined as bytes at Submit (`assets`), exactly
  as on the Gemini surface. Any other scheme (``s3://``, ``asset://``) is a REJECT.
* ``parameters.storageUri`` is the account's ``output_uri``: outputs land in that bucket as
  ``gs://`` objects, which FetchOutput reads through the Cloud Storage JSON API.
* ``generateAudio`` (Veo 3.x on Vertex may render silently) and ``seed`` when the entry
  supports them.

The endpoint names the account's project and location; the host (regional or not) is the
adapter's business (`VertexAdapter.submit_url`). Labels are added at Submit, not here: they
carry the attempt's identity, which a plan (and its request hash) must not depend on.
"""

from __future__ import annotations

from typing import Any

from adapter_sidecars.common.compiling import Draft, finish, resolve
from adapter_sidecars.veo import assets
from adapter_sidecars.veo.compile import build_instance
from vidroute_core.adapter import CompiledPlan, TransformationKind
from vidroute_core.capabilities.loader import Capability
from vidroute_core.spec import AssetRef, GenerationSpec

API_VERSION = "v1"


def model_path(project: str, location: str, model: str) -> str:
    """``/v1/projects/{p}/locations/{l}/publishers/google/models/{m}``."""
    return (
        f"/{API_VERSION}/projects/{project}/locations/{location}/publishers/google/models/{model}"
    )


def _image(path: str, asset: AssetRef, draft: Draft) -> dict[str, str]:
    uri = asset.object_uri
    scheme = assets.scheme_of(uri)
    if scheme == "gs":
        return {"gcsUri": uri, "mimeType": asset.mime_type or "image/png"}
    if scheme not in assets.RESOLVABLE_SCHEMES:
        shown = f"{scheme}:// assets" if uri else "assets without a URI"
        draft.add(
            f"{path}.object_uri",
            TransformationKind.REJECT,
            f"Vertex AI reads images from gs:// or inline bytes; {shown} cannot be read "
            "(the adapter fetches https assets)",
        )
    return assets.reference(uri, asset.mime_type, asset.checksum_sha256)


def build_request(
    spec: GenerationSpec, cap: Capability, *, project: str, location: str, output_uri: str
) -> CompiledPlan:
    """Compile `spec` for one Vertex Veo entry of an account in `project`/`location`."""
    resolved, draft = resolve(spec, cap)
    model = str(cap.native.get("model", cap.model))
    instance = build_instance(
        spec,
        cap,
        draft,
        image=_image,
        video=lambda uri: {"gcsUri": uri, "mimeType": "video/mp4"},
    )
    parameters: dict[str, Any] = {
        "aspectRatio": resolved.aspect_ratio,
        "resolution": resolved.resolution,
        "durationSeconds": resolved.duration_seconds,
        "sampleCount": resolved.sample_count,
        "storageUri": output_uri,
    }
    if cap.native_audio and cap.audio_optional:
        parameters["generateAudio"] = resolved.generate_audio
    if resolved.seed is not None and cap.supports_seed:
        parameters["seed"] = resolved.seed
    if resolved.negative_prompt:
        parameters["negativePrompt"] = resolved.negative_prompt
    body = {"instances": [instance], "parameters": parameters}
    return finish(
        draft,
        resolved,
        endpoint=f"POST {model_path(project, location, model)}:predictLongRunning",
        native_request=body,
    )
