"""`vidroute submit`'s request building: flags, spec files (YAML/JSON, spec or whole request),
flags over the file, defaults only where neither speaks, assets with their MIME types, and the
client-side checks the server could never make (values that do not fit the proto)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients import cli
from clients.cli_config import config_path, read_file, resolve
from clients.cli_spec import SpecError, SubmitFlags, asset, build_request, money
from vidroute.common.v1 import generation_pb2 as gen


def test_flags_fill_every_spec_field() -> None:
    """Each flag lands in its GenerationSpec / CreateTaskRequest field."""
    request = build_request(
        SubmitFlags(
            tenant="acme", user="u1", project="p1", prompt="a kite", negative_prompt="rain",
            mode="first-last-to-video", width=720, height=1280, duration_s=8, fps=30, audio=True,
            samples=2, seed=7, safety_profile="strict", routing="preferred", provider="google",
            model="veo-3.1-generate-preview", prefer=("google", "runway"), max_cost="0.50USD",
            max_queue_delay_s=1.5, region="us", degrade=True, service_class="interactive",
            priority=-5, category="people", style="render-3d", has_human=False,
            camera_motion="orbit", idempotency_key="k1", webhook_url="https://hooks.example.com/v",
            webhook_events=("task.progress",), first_frame="https://cdn.example.com/a.png",
            last_frame="https://cdn.example.com/b.jpg", references=("s3://bucket/ref.webp",),
        )
    )  # fmt: skip
    spec = request.spec
    assert (spec.tenant_id, spec.user_id, spec.project_id) == ("acme", "u1", "p1")
    assert (spec.prompt, spec.negative_prompt, spec.safety_profile) == ("a kite", "rain", "strict")
    assert spec.mode == gen.MODE_FIRST_LAST_TO_VIDEO
    out = spec.output
    assert (out.width, out.height, out.duration_ms, out.fps) == (720, 1280, 8000, 30)
    assert out.with_audio
    assert out.sample_count == 2
    assert spec.HasField("seed")
    assert spec.seed == 7
    r = spec.routing
    assert r.mode == gen.ROUTING_MODE_PREFERRED
    assert (r.required_provider, r.required_model) == ("google", "veo-3.1-generate-preview")
    assert list(r.preferred_providers) == ["google", "runway"]
    assert (r.max_estimated_cost.amount_micros, r.max_estimated_cost.currency_code) == (
        500_000,
        "USD",
    )
    assert r.max_queue_delay_ms == 1500
    assert r.region == "us"
    assert r.allow_semantic_degrade
    assert spec.service_class == gen.SERVICE_CLASS_INTERACTIVE
    assert spec.priority == -5
    c = spec.content
    assert (c.category, c.style) == (gen.CONTENT_CATEGORY_PEOPLE, gen.STYLE_RENDER_3D)
    assert c.HasField("has_human")
    assert not c.has_human
    assert c.camera_motion == gen.CAMERA_MOTION_ORBIT
    assert (spec.first_frame.object_uri, spec.first_frame.mime_type) == (
        "https://cdn.example.com/a.png",
        "image/png",
    )
    assert spec.last_frame.mime_type == "image/jpeg"
    assert [(a.object_uri, a.mime_type) for a in spec.references] == [
        ("s3://bucket/ref.webp", "image/webp")
    ]
    assert request.idempotency_key == "k1"
    assert request.webhook.url == "https://hooks.example.com/v"
    assert list(request.webhook.events) == ["task.progress"]


def test_defaults_fill_only_what_nothing_names() -> None:
    """Without flags the spec is text-to-video 1280x720 for 4 s, no seed, AUTO routing, and no
    idempotency key (the SDK generates one); a named model pins the routing to it."""
    request = build_request(SubmitFlags(tenant="acme", prompt="x"))
    spec = request.spec
    assert spec.mode == gen.MODE_TEXT_TO_VIDEO
    assert (spec.output.width, spec.output.height, spec.output.duration_ms) == (1280, 720, 4000)
    assert not spec.HasField("seed")
    assert spec.routing.mode == gen.ROUTING_MODE_UNSPECIFIED
    assert request.idempotency_key == ""
    assert not request.HasField("webhook")
    pinned = build_request(SubmitFlags(tenant="acme", prompt="x", model="gen4.5")).spec.routing
    assert pinned.mode == gen.ROUTING_MODE_STRICT_MODEL
    preferring = build_request(SubmitFlags(tenant="a", prompt="x", prefer=("runway",))).spec
    assert preferring.routing.mode == gen.ROUTING_MODE_PREFERRED


def test_a_yaml_spec_file_is_read_and_flags_override_it(tmp_path: Path) -> None:
    """A YAML GenerationSpec (snake_case) is the base; each given flag replaces its field and the
    file's other fields stay (its 720x1280 is not reset to the default 1280x720)."""
    path = tmp_path / "spec.yaml"
    path.write_text(
        "tenant_id: acme\nprompt: from the file\nmode: MODE_IMAGE_TO_VIDEO\n"
        "first_frame: {object_uri: 'https://cdn.example.com/f.png', mime_type: image/png}\n"
        "output: {width: 720, height: 1280, duration_ms: 5000}\n"
        "routing: {mode: ROUTING_MODE_STRICT_MODEL, required_model: gen4.5}\n"
        "content: {style: STYLE_ANIME, has_human: true}\n",
        encoding="utf-8",
    )
    spec = build_request(SubmitFlags(spec_file=path, prompt="from the flag", duration_s=6)).spec
    assert spec.content.style == gen.STYLE_ANIME
    assert spec.content.has_human
    assert spec.prompt == "from the flag"
    assert spec.tenant_id == "acme"
    assert spec.mode == gen.MODE_IMAGE_TO_VIDEO
    assert (spec.output.width, spec.output.height, spec.output.duration_ms) == (720, 1280, 6000)
    assert spec.first_frame.object_uri == "https://cdn.example.com/f.png"
    assert spec.routing.mode == gen.ROUTING_MODE_STRICT_MODEL


def test_a_json_create_request_file_keeps_its_key_and_webhook(tmp_path: Path) -> None:
    """A JSON CreateTaskRequest (camelCase is proto JSON too) keeps its key and webhook."""
    path = tmp_path / "request.json"
    path.write_text(
        json.dumps(
            {
                "idempotencyKey": "file-key",
                "spec": {"tenantId": "acme", "prompt": "p", "mode": "MODE_EXTEND_VIDEO",
                         "sourceVideo": {"objectUri": "https://cdn.example.com/v.mp4"}},
                "webhook": {"url": "https://hooks.example.com/x", "events": ["task.progress"]},
            }
        ),
        encoding="utf-8",
    )  # fmt: skip
    request = build_request(SubmitFlags(spec_file=path))
    assert request.idempotency_key == "file-key"
    assert request.spec.mode == gen.MODE_EXTEND_VIDEO
    assert request.spec.source_video.object_uri == "https://cdn.example.com/v.mp4"
    assert request.webhook.url == "https://hooks.example.com/x"
    override = build_request(SubmitFlags(spec_file=path, idempotency_key="flag-key"))
    assert override.idempotency_key == "flag-key"


@pytest.mark.parametrize(
    ("content", "suffix", "wanted"),
    [
        ("prompt: [unclosed", ".yaml", "not valid YAML: expected ',' or ']'.* at line 1, column"),
        ("{", ".json", "not valid JSON"),
        ("- a list\n", ".yaml", "must be a mapping"),
        ("tenant_id: acme\nno_such_field: 1\n", ".yaml", "no_such_field"),
    ],
)
def test_a_broken_spec_file_is_one_usage_error(
    tmp_path: Path, content: str, suffix: str, wanted: str
) -> None:
    """A file that is not a spec is a SpecError naming the file and the problem, in one line."""
    path = tmp_path / f"spec{suffix}"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SpecError, match=wanted) as caught:
        build_request(SubmitFlags(spec_file=path))
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_asset_mime_types_come_from_the_fragment_or_the_extension() -> None:
    """``URI#mime`` wins; else the path's extension (query ignored); unknown stays empty."""
    assert asset("https://x.example.com/a.bin#image/png").mime_type == "image/png"
    assert asset("https://x.example.com/a.bin#image/png").object_uri == (
        "https://x.example.com/a.bin"
    )
    assert asset("https://x.example.com/v.mp4?X-Amz-Signature=abc").mime_type == "video/mp4"
    assert asset("asset://uploads/123").mime_type == ""
    with pytest.raises(SpecError):
        asset("#image/png")


def test_money_is_exact_micros() -> None:
    """Budget caps are parsed as decimals into integer micros, never through a float."""
    assert money("0.1").amount_micros == 100_000
    assert money("12.345678 EUR").amount_micros == 12_345_678
    assert money("12.345678 EUR").currency_code == "EUR"
    with pytest.raises(SpecError):
        money("0.0000001")
    with pytest.raises(SpecError):
        money("cheap")


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["--height", "-1"], "--height"),
        (["--width", "4294967296"], "--width"),
        (["--duration", "-2"], "--duration"),
        (["--mode", "sideways"], "--mode"),
        (["--priority", "x"], "--priority"),
    ],
)
def test_values_the_proto_cannot_carry_are_usage_errors(
    argv: list[str], wanted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Such values exit 2 with one line on stderr naming the flag, before any connection."""
    code = cli.main(["submit", "--tenant", "a", "--prompt", "p", "--target", "127.0.0.1:1", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert wanted in err
    assert "Traceback" not in err


def test_the_config_file_supplies_target_token_and_tls(tmp_path: Path) -> None:
    """Flags beat VIDROUTE_TARGET / VIDROUTE_TOKEN, which beat the TOML file, which beats the
    default; a broken or unknown key is an error, a missing default file is not."""
    path = tmp_path / "config.toml"
    path.write_text('target = "cp.example.com:443"\ntoken = "file-token"\ntls = true\n')
    env = {"VIDROUTE_CONFIG": str(path)}
    assert config_path(env) == path
    conn = resolve(env=env)
    assert (conn.target, conn.token, conn.tls) == ("cp.example.com:443", "file-token", True)
    env_wins = resolve(env={**env, "VIDROUTE_TARGET": "h:1", "VIDROUTE_TOKEN": "env-token"})
    assert (env_wins.target, env_wins.token) == ("h:1", "env-token")
    assert resolve("flag:2", None, False, env={**env, "VIDROUTE_TARGET": "h:1"}).target == "flag:2"
    with pytest.raises(ValueError, match="VIDROUTE_CONFIG="):  # named, so it must exist
        resolve(env={"VIDROUTE_CONFIG": str(tmp_path / "none.toml")})
    assert resolve(env={"XDG_CONFIG_HOME": str(tmp_path / "none")}).target == "localhost:8051"
    assert config_path({"XDG_CONFIG_HOME": "/cfg"}) == Path("/cfg/vidroute/config.toml")
    path.write_text('targett = "typo"\n')
    with pytest.raises(ValueError, match="targett"):
        read_file(path)
