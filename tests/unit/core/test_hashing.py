"""Canonical JSON, the normalized spec hash and the attempt request hash (design 9.7.3)."""

from __future__ import annotations

import copy
import hashlib
import json
import random
import unicodedata
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from vidroute_core.codec import spec_from_dict, spec_to_dict
from vidroute_core.hashing import (
    canonical_json,
    normalize_asset_uri,
    normalized_spec,
    normalized_spec_hash,
    request_hash,
)
from vidroute_core.spec import (
    NO_TAGS,
    AssetRef,
    CameraMotion,
    ContentCategory,
    ContentTags,
    GenerationSpec,
    Mode,
    OutputSpec,
    RoutingMode,
    RoutingPolicy,
    ServiceClass,
    Style,
)
from vidroute_core.validation import validate_spec

VECTORS = sorted((Path(__file__).parents[2] / "testdata" / "hashing").glob("*.json"))
REQUEST_KEYS = (
    "provider",
    "model",
    "model_version",
    "capability_version",
    "compile_plan",
    "asset_checksums",
)

# --- strategies ---------------------------------------------------------------------------------
ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)
texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
shas = st.text("0123456789abcdef", min_size=64, max_size=64)
https_uris = st.builds("https://{}.example.com/{}/{}.png".format, ids, ids, ids)
other_uris = st.builds("{}://{}/{}".format, st.sampled_from(["s3", "gs", "asset"]), ids, ids)
assets = st.builds(
    AssetRef,
    object_uri=https_uris | other_uris,
    mime_type=st.sampled_from(["", "image/png", "video/mp4"]),
    size_bytes=st.integers(0, 2**40),
    checksum_sha256=st.just("") | shas,
    asset_id=st.just("") | ids,
)
outputs = st.builds(
    OutputSpec,
    width=st.integers(2, 7680),
    height=st.integers(2, 7680),
    duration_ms=st.integers(1, 600_000),
    fps=st.integers(1, 120),
    with_audio=st.booleans(),
    sample_count=st.integers(1, 4),
)
routings = st.builds(
    RoutingPolicy,
    mode=st.sampled_from(RoutingMode),
    required_provider=st.just("") | ids,
    required_model=st.just("") | ids,
    preferred_providers=st.lists(ids, max_size=3).map(tuple),
    max_estimated_cost_micros=st.integers(0, 10**9),
    currency=st.sampled_from(["USD", "EUR"]),
    max_queue_delay_ms=st.integers(0, 10**7),
    allow_semantic_degrade=st.booleans(),
    region=st.just("") | ids,
)
contents = st.builds(
    ContentTags,
    category=st.none() | st.sampled_from(ContentCategory),
    style=st.none() | st.sampled_from(Style),
    has_human=st.none() | st.booleans(),
    camera_motion=st.none() | st.sampled_from(CameraMotion),
)
specs = st.builds(
    GenerationSpec,
    tenant_id=ids,
    prompt=texts,
    mode=st.sampled_from(Mode),
    output=outputs,
    user_id=st.just("") | ids,
    project_id=st.just("") | ids,
    negative_prompt=texts,
    first_frame=st.none() | assets,
    last_frame=st.none() | assets,
    source_video=st.none() | assets,
    references=st.lists(assets, max_size=3).map(tuple),
    seed=st.none() | st.integers(0, 2**32 - 1),
    safety_profile=st.just("") | ids,
    routing=routings,
    service_class=st.sampled_from(ServiceClass),
    priority=st.integers(-100, 100),
    content=st.just(NO_TAGS) | contents,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)
# Codec keys whose value may be left out of a dict, with the value that leaving out implies.
OPTIONAL: dict[str, object] = {
    "user_id": "",
    "project_id": "",
    "negative_prompt": "",
    "first_frame": None,
    "last_frame": None,
    "source_video": None,
    "references": [],
    "seed": None,
    "safety_profile": "",
    "service_class": "STANDARD",
    "priority": 0,
    "content": {"category": None, "style": None, "has_human": None, "camera_motion": None},
}
OPTIONAL_OUTPUT: dict[str, object] = {"fps": 24, "with_audio": False, "sample_count": 1}
OPTIONAL_ROUTING = spec_to_dict(GenerationSpec("t", "p", Mode.TEXT_TO_VIDEO, OutputSpec(2, 2, 1)))[
    "routing"
]


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _assets(spec: GenerationSpec) -> list[tuple[str, AssetRef]]:
    slots = [(n, getattr(spec, n)) for n in ("first_frame", "last_frame", "source_video")]
    slots += [(f"references[{i}]", r) for i, r in enumerate(spec.references)]
    return [(n, a) for n, a in slots if a is not None]


def _with_asset(spec: GenerationSpec, name: str, asset: AssetRef) -> GenerationSpec:
    if name.startswith("references["):
        i = int(name[len("references[") : -1])
        refs = list(spec.references)
        refs[i] = asset
        return replace(spec, references=tuple(refs))
    slot: dict[str, Any] = {name: asset}
    return replace(spec, **slot)


# --- golden vectors -----------------------------------------------------------------------------
@pytest.mark.parametrize("path", VECTORS, ids=[p.stem for p in VECTORS])
def test_golden_vector(path: Path) -> None:
    """Each stored spec encodes to the stored canonical JSON and hashes to the stored hash."""
    vector = json.loads(path.read_text(encoding="utf-8"))
    spec = spec_from_dict(vector["spec"])
    if "provider" in vector:
        extra = {k: vector[k] for k in REQUEST_KEYS}
        actual = request_hash(spec, **extra)
        document: Any = {"spec": normalized_spec(spec), **extra}
    else:
        actual = normalized_spec_hash(spec)
        document = normalized_spec(spec)
    expected_text = vector["expected_canonical_json"]
    assert canonical_json(document).decode("utf-8") == expected_text
    # The hash is SHA-256 over exactly that text, so other languages can check their encoders.
    assert vector["expected_hash"] == "sha256:" + hashlib.sha256(expected_text.encode()).hexdigest()
    assert actual == vector["expected_hash"]


def test_golden_vectors_are_valid_specs() -> None:
    """Every golden vector is a spec the platform would accept, so the vectors stay realistic."""
    for path in VECTORS:
        spec = spec_from_dict(json.loads(path.read_text(encoding="utf-8"))["spec"])
        assert validate_spec(spec) == [], path.stem


def test_golden_explicit_defaults_match_minimal() -> None:
    """The vector spelling out every default has the same hash as the minimal one."""
    hashes = {p.stem: json.loads(p.read_text(encoding="utf-8"))["expected_hash"] for p in VECTORS}
    assert hashes["t2v_explicit_defaults"] == hashes["t2v_minimal"]
    assert len(VECTORS) >= 5


# --- canonical JSON -----------------------------------------------------------------------------
def test_canonical_json_format() -> None:
    """Keys are sorted, separators carry no whitespace, strings are NFC in raw UTF-8."""
    doc = {"b": [1, True, None], "a": {"z": "e\u0301", "y": -2}}
    assert canonical_json(doc) == '{"a":{"y":-2,"z":"é"},"b":[1,true,null]}'.encode()


@pytest.mark.parametrize("bad", [1.5, {"a": 0.0}, {1: "x"}, {"x": {1, 2}}, b"raw"])
def test_canonical_json_rejects_unstable_types(bad: object) -> None:
    """Floats, non-string keys and non-JSON types are refused rather than encoded unstably."""
    with pytest.raises(TypeError):
        canonical_json(bad)


def test_canonical_json_rejects_keys_equal_after_nfc() -> None:
    """Two keys that normalize to the same NFC string are an error, not a silent overwrite."""
    with pytest.raises(ValueError, match="NFC"):
        canonical_json({"é": 1, "e\u0301": 2})


@given(json_values, st.randoms(use_true_random=False))
def test_canonical_json_ignores_key_order(value: Any, rng: random.Random) -> None:
    """Reordering the keys of any nested dict leaves the canonical bytes unchanged."""
    assert canonical_json(_shuffled(value, rng)) == canonical_json(value)


@given(texts)
def test_canonical_json_normalizes_strings(text: str) -> None:
    """A string and its NFD/NFC forms encode identically."""
    nfd = unicodedata.normalize("NFD", text)
    assert canonical_json({"k": nfd}) == canonical_json({"k": text})


# --- spec hash properties -----------------------------------------------------------------------
@given(specs, st.randoms(use_true_random=False))
def test_spec_hash_ignores_field_order(spec: GenerationSpec, rng: random.Random) -> None:
    """A spec sent as JSON with its fields in any order hashes the same."""
    text = json.dumps(_shuffled(spec_to_dict(spec), rng))
    assert normalized_spec_hash(spec_from_dict(json.loads(text))) == normalized_spec_hash(spec)
    assert canonical_json(_shuffled(normalized_spec(spec), rng)) == canonical_json(
        normalized_spec(spec)
    )


@given(specs, st.data())
def test_spec_hash_same_with_defaults_explicit_or_not(spec: GenerationSpec, data: Any) -> None:
    """Leaving out any field that holds its default gives the same hash as stating it."""
    full = spec_to_dict(spec)
    sparse = copy.deepcopy(full)
    for table, target in (
        (OPTIONAL, sparse),
        (OPTIONAL_OUTPUT, sparse.setdefault("output", {})),
    ):
        for key, default in table.items():
            if target.get(key) == default and data.draw(st.booleans()):
                del target[key]
    if full["routing"] == OPTIONAL_ROUTING and data.draw(st.booleans()):
        del sparse["routing"]
    assert normalized_spec_hash(spec_from_dict(sparse)) == normalized_spec_hash(spec)


@given(specs, st.sampled_from(["USD", "EUR", "JPY", ""]))
def test_currency_irrelevant_without_budget(spec: GenerationSpec, currency: str) -> None:
    """With no budget cap the currency means nothing and does not change the hash."""
    uncapped = replace(spec, routing=replace(spec.routing, max_estimated_cost_micros=0))
    other = replace(uncapped, routing=replace(uncapped.routing, currency=currency))
    assert normalized_spec_hash(other) == normalized_spec_hash(uncapped)


signing_queries = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "X-Amz-Signature",
                "X-Amz-Expires",
                "X-Goog-Signature",
                "Expires",
                "Signature",
                "Key-Pair-Id",
                "sig",
                "se",
                "_jwt",
                "token",
            ]
        ),
        st.text("abcdefABCDEF0123456789-_%=/+", min_size=1, max_size=40),
    ),
    min_size=1,
    max_size=5,
).map(urlencode)


@given(specs, signing_queries, st.text("abc", max_size=5), st.data())
def test_spec_hash_ignores_url_signatures(
    spec: GenerationSpec, query: str, fragment: str, data: Any
) -> None:
    """Signing query strings on https assets, and fragments on any asset, never change the hash."""
    assets = _assets(spec)
    assume(assets)
    name, asset = data.draw(st.sampled_from(assets))
    uri = asset.object_uri
    if uri.startswith("https://"):
        uri += "?" + query
    signed = _with_asset(spec, name, replace(asset, object_uri=f"{uri}#{fragment}"))
    assert normalized_spec_hash(signed) == normalized_spec_hash(spec)


def test_asset_uri_normalization_examples() -> None:
    """https loses query, fragment and :443 and gets a lower-case host; s3 keeps its query."""
    assert (
        normalize_asset_uri("HTTPS://CDN.Example.COM:443/A/b.PNG?X-Amz-Signature=1#f")
        == "https://cdn.example.com/A/b.PNG"
    )
    assert normalize_asset_uri("s3://b/k.mp4?versionId=7#f") == "s3://b/k.mp4?versionId=7"


@given(specs, st.data())
def test_case_insensitive_parts_ignore_case(spec: GenerationSpec, data: Any) -> None:
    """Upper-case checksums and MIME types hash like their lower-case forms."""
    assets = _assets(spec)
    assume(assets)
    name, asset = data.draw(st.sampled_from(assets))
    shouted = replace(
        asset, checksum_sha256=asset.checksum_sha256.upper(), mime_type=asset.mime_type.upper()
    )
    assert normalized_spec_hash(_with_asset(spec, name, shouted)) == normalized_spec_hash(spec)


@given(specs, texts)
def test_spec_hash_changes_with_prompt(spec: GenerationSpec, prompt: str) -> None:
    """A prompt that differs after NFC normalization gives a different hash."""
    nfc = unicodedata.normalize
    assume(nfc("NFC", prompt) != nfc("NFC", spec.prompt))
    assert normalized_spec_hash(replace(spec, prompt=prompt)) != normalized_spec_hash(spec)


@given(specs, contents)
def test_spec_hash_changes_with_content_tags(spec: GenerationSpec, tags: ContentTags) -> None:
    """The same request with other content tags is another spec (it routes on other quality)."""
    assume(tags != spec.content)
    assert normalized_spec_hash(replace(spec, content=tags)) != normalized_spec_hash(spec)


@given(specs)
def test_codec_round_trips_content_tags(spec: GenerationSpec) -> None:
    """Stored specs keep their tags; a spec stored before tags existed decodes untagged."""
    assert spec_from_dict(spec_to_dict(spec)) == spec
    legacy = spec_to_dict(replace(spec, content=NO_TAGS))
    del legacy["content"]
    assert spec_from_dict(legacy).content == NO_TAGS


@given(specs, st.integers(1, 600_000))
def test_spec_hash_changes_with_duration(spec: GenerationSpec, duration_ms: int) -> None:
    """A different duration gives a different hash."""
    assume(duration_ms != spec.output.duration_ms)
    changed = replace(spec, output=replace(spec.output, duration_ms=duration_ms))
    assert normalized_spec_hash(changed) != normalized_spec_hash(spec)


@given(specs, shas, st.data())
def test_spec_hash_changes_with_checksum(spec: GenerationSpec, sha: str, data: Any) -> None:
    """A different checksum on any asset gives a different hash."""
    assets = _assets(spec)
    assume(assets)
    name, asset = data.draw(st.sampled_from(assets))
    assume(sha != asset.checksum_sha256.lower())
    changed = _with_asset(spec, name, replace(asset, checksum_sha256=sha))
    assert normalized_spec_hash(changed) != normalized_spec_hash(spec)


@given(specs, ids, ids)
def test_spec_hash_changes_with_tenant_and_owner(spec: GenerationSpec, a: str, b: str) -> None:
    """Tenant, user and project are part of the request's identity."""
    assume(a != spec.tenant_id and b != spec.user_id)
    base = normalized_spec_hash(spec)
    assert normalized_spec_hash(replace(spec, tenant_id=a)) != base
    assert normalized_spec_hash(replace(spec, user_id=b)) != base


# --- request hash -------------------------------------------------------------------------------
def _request(spec: GenerationSpec, **changes: Any) -> str:
    args: dict[str, Any] = {
        "provider": "veo",
        "model": "veo-3",
        "model_version": "001",
        "capability_version": "cap-1",
        "compile_plan": {"resolution": "720p", "duration_seconds": 8},
        "asset_checksums": {"first_frame": "a" * 64},
    }
    return request_hash(spec, **(args | changes))


@given(specs)
def test_request_hash_covers_every_9_7_3_input(spec: GenerationSpec) -> None:
    """Changing the spec, provider, model, versions, compile plan or checksums changes it."""
    base = _request(spec)
    assert base.startswith("sha256:")
    assert len(base) == 7 + 64
    assert _request(spec, asset_checksums={"first_frame": "A" * 64}) == base
    variants = [
        _request(replace(spec, tenant_id=spec.tenant_id + "x")),
        _request(spec, provider="runway"),
        _request(spec, model="veo-3-fast"),
        _request(spec, model_version="002"),
        _request(spec, capability_version="cap-2"),
        _request(spec, compile_plan={"resolution": "1080p", "duration_seconds": 8}),
        _request(spec, asset_checksums={"first_frame": "b" * 64}),
        _request(spec, asset_checksums={}),
        normalized_spec_hash(spec),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_request_hash_rejects_bad_checksum_and_floats() -> None:
    """Malformed checksums and float-valued compile plans are refused."""
    spec = GenerationSpec("t", "p", Mode.TEXT_TO_VIDEO, OutputSpec(2, 2, 1))
    with pytest.raises(ValueError, match="64 hex"):
        _request(spec, asset_checksums={"first_frame": "xyz"})
    with pytest.raises(TypeError):
        _request(spec, compile_plan={"aspect_ratio": 1.7778})
