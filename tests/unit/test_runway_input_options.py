"""Which Runway inputs the sidecar uploads or re-signs, read from ``provider.options``."""

from __future__ import annotations

from typing import Any

import pytest

from adapter_sidecars.common.config import ConfigError
from adapter_sidecars.runway.inputs import PlatformStore, PrivateHosts, with_uris

STORE = "s3://inputs?endpoint_url=https://store.internal:9000&region=eu-west-1"


@pytest.fixture(autouse=True)
def _dummy_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """boto3's chain sees dummy keys only (presigning signs locally with them)."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "absent-credentials"))


def _store(**options: Any) -> PlatformStore:
    store = PlatformStore.from_options({"platform_store": STORE, **options})
    assert store is not None
    return store


def test_no_platform_store_means_nothing_is_uploaded_or_re_signed() -> None:
    """Without ``platform_store`` the adapter keeps its plain behaviour."""
    assert PlatformStore.from_options({}) is None


@pytest.mark.parametrize(
    ("uri", "key"),
    [
        ("s3://inputs/a/b.png", "a/b.png"),
        ("s3://other/a/b.png", None),
        ("s3://inputs/", None),
        ("https://cdn.example.com/inputs/a.png", None),
    ],
)
def test_only_objects_of_our_bucket_are_ours(uri: str, key: str | None) -> None:
    """An s3:// URI names a key of the store only in its own bucket."""
    assert _store().key_of_s3(uri) == key


@pytest.mark.parametrize(
    ("uri", "key"),
    [
        ("https://store.internal:9000/inputs/a/b.png?X-Amz-Signature=x", "a/b.png"),
        ("https://store.internal:9001/inputs/a/b.png?X-Amz-Signature=x", None),
        ("http://store.internal:9000/inputs/a/b.png", None),
        ("https://store.internal:9000/other/a/b.png", None),
        ("https://store.internal:9000/inputs/", None),
    ],
)
def test_only_path_style_urls_of_our_endpoint_and_bucket_are_re_signable(
    uri: str, key: str | None
) -> None:
    """A URL is re-signed only when it is on the store's own endpoint, in its bucket."""
    assert _store().key_of_url(uri) == key


def test_a_re_signed_url_is_a_fresh_signature_of_the_same_object() -> None:
    """presign signs locally: the same object's path, our lifetime."""
    url = _store(asset_url_ttl_seconds=120).presign("a/b.png")
    assert url.startswith("https://store.internal:9000/inputs/a/b.png?")
    assert "X-Amz-Expires=120" in url


@pytest.mark.parametrize(
    "options",
    [
        {"platform_store": "gs://inputs"},
        {"platform_store": "s3://inputs?endpoint=x"},
        {"platform_store": STORE, "asset_url_ttl_seconds": 0},
        {"platform_store": STORE, "asset_url_ttl_seconds": "soon"},
    ],
)
def test_a_bad_store_setting_stops_the_sidecar(options: dict[str, Any]) -> None:
    """A malformed store URL or lifetime is a configuration error, not a silent default."""
    with pytest.raises(ConfigError):
        PlatformStore.from_options(options)


def test_private_hosts_are_named_https_hosts_only() -> None:
    """Only https URLs on a named host are downloaded by the sidecar."""
    private = PrivateHosts.from_options({"private_input_hosts": ["Media.Internal"]})
    assert private.holds("https://media.internal/a.png")
    assert not private.holds("http://media.internal/a.png")
    assert not private.holds("https://media.internal.evil.example/a.png")
    assert not PrivateHosts.from_options({}).holds("https://media.internal/a.png")
    with pytest.raises(ConfigError):
        PrivateHosts.from_options({"private_input_hosts": "media.internal"})


def test_with_uris_rewrites_only_the_prompt_images() -> None:
    """Other fields and the positions stay as compiled."""
    body: dict[str, Any] = {
        "model": "gen4.5",
        "promptImage": [{"uri": "s3://inputs/a.png", "position": "first"}],
    }
    out = with_uris(body, lambda uri: "runway://x")
    assert out == {"model": "gen4.5", "promptImage": [{"uri": "runway://x", "position": "first"}]}
    assert body["promptImage"][0]["uri"] == "s3://inputs/a.png"
