"""Stable hashes of a spec and of an attempt's provider request (design 9.7.3).

Two hashes, one canonical encoding:

* `normalized_spec_hash` identifies the user's request. CreateTask compares it under an
  idempotency key ("same key, same spec" replays; a different hash is `IdempotencyConflict`).
* `request_hash` identifies one attempt's provider request: spec + provider + model version +
  capability version + compile plan + asset checksums. It serves recovery of unknown
  submissions, reconciliation, audit and adapter golden tests.

Raw JSON is never hashed: key order, defaults and URL signatures would make equal requests differ.
What the normalized form keeps and drops:

* **Kept: the whole intent**, including ``tenant_id`` (identical specs from two tenants never
  share a hash), ``user_id``/``project_id`` (a replay that changes who is billed is a different
  request), routing constraints, priority, service class and content tags (they choose the
  quality bucket that routes the task). Excluding anything that "does not
  change the media" would let a reused key silently return a task with another budget or owner;
  refusing with a conflict is the safe failure (the same stance as Stripe's idempotency keys).
* **Output fields are always present** (``fps``, ``sample_count``, ``with_audio`` materialized)
  because they define the media: a later change of a dataclass default must not alias them.
* **Optional fields are omitted when empty** (``""``, ``None``, ``0``, ``[]``, the documented
  default enums, content tags not said), so a field added to the schema later, at its default,
  leaves every stored hash unchanged, and stating a default explicitly hashes like leaving it
  out.
* **https asset URLs lose their whole query string**; every URL loses its fragment; the scheme
  is lower-cased, and for https the host too (DNS is case-insensitive; bucket names and asset
  ids may not be) and ``:443`` is dropped. Signing parameters differ per store (``X-Amz-*``,
  ``X-Goog-*``, CloudFront ``Expires``/``Signature``, ``sig``, ``_jwt``...) and any name an
  allow-list missed would make every retry look new. A query that really selects other bytes
  (``?version=2``) then aliases; the asset's SHA-256, which is kept, is what distinguishes bytes,
  and clients should send it. s3/gs/asset URIs keep their query (``versionId`` is meaningful
  there and nothing signs them).
* Budget currency is dropped when there is no budget (``0`` micros), where it means nothing.

The golden vectors in ``tests/testdata/hashing`` pin this format: changing it re-keys every
stored hash, so it is a breaking change.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from vidroute_core.codec import content_to_dict
from vidroute_core.spec import AssetRef, GenerationSpec, RoutingPolicy

HASH_PREFIX = "sha256:"
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")

# Optional fields and the value meaning "not given"; such values are left out of the hash.
_SPEC_ABSENT: Mapping[str, object] = {
    "user_id": "",
    "project_id": "",
    "negative_prompt": "",
    "first_frame": None,
    "last_frame": None,
    "source_video": None,
    "references": [],
    "seed": None,
    "safety_profile": "",
    "routing": {},
    "service_class": "STANDARD",
    "priority": 0,
    "content": {},
}
_ROUTING_ABSENT: Mapping[str, object] = {
    "mode": "AUTO",
    "required_provider": "",
    "required_model": "",
    "preferred_providers": [],
    "max_estimated_cost_micros": 0,
    "max_queue_delay_ms": 0,
    "allow_semantic_degrade": False,
    "region": "",
}
_ASSET_ABSENT: Mapping[str, object] = {
    "object_uri": "",
    "mime_type": "",
    "size_bytes": 0,
    "checksum_sha256": "",
    "asset_id": "",
}


def canonical_json(obj: object) -> bytes:
    """The one byte encoding that gets hashed.

    Keys sorted by code point, no whitespace, UTF-8 without ``\\u`` escapes for non-ASCII, every
    string (keys included) NFC-normalized. Only dicts with string keys, lists/tuples, strings,
    ints, bools and None are accepted: floats are refused because their text form is not stable
    across languages (use integer ms and micros). For ASCII keys and integers below 2**53 this
    coincides with RFC 8785 (JCS) applied to NFC-normalized input.
    """
    return json.dumps(
        _canonical(obj),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def _canonical(obj: object) -> object:
    if obj is None or isinstance(obj, bool | int):
        return obj
    if isinstance(obj, str):
        return unicodedata.normalize("NFC", obj)
    if isinstance(obj, Mapping):
        out: dict[str, object] = {}
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"canonical JSON keys must be strings, got {key!r}")
            nkey = unicodedata.normalize("NFC", key)
            if nkey in out:
                raise ValueError(f"keys collide after NFC normalization: {key!r}")
            out[nkey] = _canonical(value)
        return out
    if isinstance(obj, list | tuple):
        return [_canonical(item) for item in obj]
    raise TypeError(f"canonical JSON does not encode {type(obj).__name__} (floats: use ints)")


def _sha256(obj: object) -> str:
    return HASH_PREFIX + hashlib.sha256(canonical_json(obj)).hexdigest()


def normalize_asset_uri(uri: str) -> str:
    """`uri` without what varies between equal requests: signature, fragment, case of host."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    netloc, query = parts.netloc, parts.query
    if scheme == "https":
        netloc, query = netloc.lower().removesuffix(":443"), ""
    return urlunsplit((scheme, netloc, parts.path, query, ""))


def _asset(asset: AssetRef | None) -> dict[str, object] | None:
    if asset is None:
        return None
    fields: dict[str, object] = {
        "object_uri": normalize_asset_uri(asset.object_uri) if asset.object_uri else "",
        "mime_type": asset.mime_type.lower(),
        "size_bytes": asset.size_bytes,
        "checksum_sha256": asset.checksum_sha256.lower(),
        "asset_id": asset.asset_id,
    }
    return _without(fields, _ASSET_ABSENT)


def _routing(routing: RoutingPolicy) -> dict[str, object]:
    fields: dict[str, object] = {
        "mode": routing.mode.value,
        "required_provider": routing.required_provider,
        "required_model": routing.required_model,
        "preferred_providers": list(routing.preferred_providers),
        "max_estimated_cost_micros": routing.max_estimated_cost_micros,
        "max_queue_delay_ms": routing.max_queue_delay_ms,
        "allow_semantic_degrade": routing.allow_semantic_degrade,
        "region": routing.region,
    }
    if routing.max_estimated_cost_micros:
        fields["currency"] = routing.currency
    return _without(fields, _ROUTING_ABSENT)


def _without(fields: dict[str, object], absent: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in fields.items() if k not in absent or v != absent[k]}


def normalized_spec(spec: GenerationSpec) -> dict[str, Any]:
    """The spec as hashed: JSON-ready, defaults and volatile URL parts removed (see module doc)."""
    out = spec.output
    doc: dict[str, object] = {
        "tenant_id": spec.tenant_id,
        "user_id": spec.user_id,
        "project_id": spec.project_id,
        "prompt": spec.prompt,
        "negative_prompt": spec.negative_prompt,
        "mode": spec.mode.value,
        "first_frame": _asset(spec.first_frame),
        "last_frame": _asset(spec.last_frame),
        "source_video": _asset(spec.source_video),
        "references": [_asset(r) for r in spec.references],
        "output": {
            "width": out.width,
            "height": out.height,
            "duration_ms": out.duration_ms,
            "fps": out.fps,
            "with_audio": out.with_audio,
            "sample_count": out.sample_count,
        },
        "seed": spec.seed,
        "safety_profile": spec.safety_profile,
        "routing": _routing(spec.routing),
        "service_class": spec.service_class.value,
        "priority": spec.priority,
        "content": {k: v for k, v in content_to_dict(spec.content).items() if v is not None},
    }
    return _without(doc, _SPEC_ABSENT)


def normalized_spec_hash(spec: GenerationSpec) -> str:
    """``"sha256:" + hex`` of the canonical JSON of `normalized_spec`."""
    return _sha256(normalized_spec(spec))


def request_hash(
    spec: GenerationSpec,
    *,
    provider: str,
    model: str,
    model_version: str,
    capability_version: str,
    compile_plan: Mapping[str, Any],
    asset_checksums: Mapping[str, str],
) -> str:
    """The 9.7.3 request hash of one attempt.

    `compile_plan` must be canonical-JSON-encodable (no floats). `asset_checksums` maps each
    referenced asset's spec path (``first_frame``, ``references[0]``) to the SHA-256 hex the
    platform verified for it, so the hash changes if the bytes behind a URL change.
    """
    checksums: dict[str, str] = {}
    for path, checksum in asset_checksums.items():
        if not _SHA256_HEX.fullmatch(checksum):
            raise ValueError(f"asset checksum for {path!r} is not 64 hex digits")
        checksums[path] = checksum.lower()
    return _sha256(
        {
            "spec": normalized_spec(spec),
            "provider": provider,
            "model": model,
            "model_version": model_version,
            "capability_version": capability_version,
            "compile_plan": compile_plan,
            "asset_checksums": checksums,
        }
    )
