"""What the contract suite needs to know about the adapter under test: `AdapterProfile`.

A profile is data, not code: the built-in ones live in ``profiles/<name>.yaml`` beside this
module, and a new adapter ships its own YAML file in the same format (see README.md). The
suite never branches on an adapter's *name*; it branches on the capability flags below, and
those flags select which tests are collected (``plugin.contract_requires``).

Specs are written in proto3 JSON form (``{"mode": "MODE_TEXT_TO_VIDEO", "output":
{"durationMs": 8000}}``) so a profile can be written without importing protobuf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

PROFILES_DIR = Path(__file__).with_name("profiles")

#: The golden cases of design 9.25.2, each with the generation mode it exercises.
GOLDEN_CASE_MODES: Mapping[str, str] = MappingProxyType(
    {
        "text_to_video_16x9": "TEXT_TO_VIDEO",
        "image_to_video_portrait": "IMAGE_TO_VIDEO",
        "first_last_8s": "FIRST_LAST_TO_VIDEO",
    }
)

_BASE_SPEC: dict[str, Any] = {
    "tenantId": "contract-tenant",
    "prompt": "A lighthouse at dusk, waves crashing against the rocks, slow dolly-in",
    "output": {"width": 1280, "height": 720, "durationMs": 8000},
}
_FIRST_FRAME = {
    "objectUri": "https://assets.example.com/contract/first.png",
    "mimeType": "image/png",
    "checksumSha256": "1" * 64,
}
_LAST_FRAME = {
    "objectUri": "https://assets.example.com/contract/last.png",
    "mimeType": "image/png",
    "checksumSha256": "2" * 64,
}
_GOLDEN_OVERRIDES: dict[str, dict[str, Any]] = {
    "text_to_video_16x9": {"mode": "MODE_TEXT_TO_VIDEO"},
    "image_to_video_portrait": {
        "mode": "MODE_IMAGE_TO_VIDEO",
        "prompt": "The subject turns towards the camera and smiles",
        "firstFrame": _FIRST_FRAME,
        "output": {"width": 720, "height": 1280, "durationMs": 8000},
    },
    "first_last_8s": {
        "mode": "MODE_FIRST_LAST_TO_VIDEO",
        "prompt": "Day turns to night over the harbour",
        "firstFrame": _FIRST_FRAME,
        "lastFrame": _LAST_FRAME,
        "output": {"width": 1280, "height": 720, "durationMs": 8000},
    },
}
# No model of any provider produces a ten-minute clip in one request: a REJECT everywhere.
_UNSUPPORTED_OVERRIDES: dict[str, Any] = {"output": {"durationMs": 600_000}}
_DEFAULT_FAILURE = {"INTERNAL": "INTERNAL_RETRYABLE"}


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `overrides` onto `base` (dicts merge, everything else replaces)."""
    out: dict[str, Any] = {k: v for k, v in base.items()}
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


class ProfileError(ValueError):
    """A profile file is malformed; the message names the field."""


@dataclass(frozen=True)
class AdapterProfile:
    """The adapter under test, as far as the contract suite needs to know it.

    Identity and routes:
      name: adapter name; also the goldens sub-folder (``tests/testdata/<name>/``).
      models: generation mode (``TEXT_TO_VIDEO`` ...) -> model id the suite compiles for.
        A mode missing here means the adapter does not support it (its goldens are deselected).
      account: provider account passed in requests; "" means the adapter's default.
      submit_route: fault-rule route of the text-to-video submit, e.g. ``POST /v1/text_to_video``
        (fnmatch patterns allowed: ``POST /v1beta/models/*:predictLongRunning``).
      poll_route / cancel_route: routes of job reads and cancels, for job-level faults.

    Capability flags (each selects tests; see ``CAPABILITY_FLAGS``):
      supports_cancel: CancelJob reaches the provider and can stop a job.
      supports_idempotency_key: the provider dedups creates by client_request_key.
      supports_task_search: recent jobs can be searched, so recovery can be conclusive.
      supports_callbacks: the provider calls back (callback dedup is the control plane's job).
      cancel_deletes_job: a cancelled job disappears at the provider (later reads 404).
      reports_throttling: the provider has a distinct "held by concurrency" status.
      reports_progress: the provider reports a running job's progress (a 0..1 fraction);
        without it no live status may carry a fraction or a queue position (none invented).
      output_expiry_known: outputs carry an expiry the adapter can report in expires_at.
      supports_usage: ListUsage returns the provider's usage records.
      fetch_through_adapter: outputs need the provider's credentials, so they are flagged
        ``fetch_through_adapter`` and downloaded with FetchOutput (Gemini file URIs).
      outcomes_from_webhooks: the provider has no read of a job (a Cog server): GetJob and
        FetchOutput answer from the webhooks the sidecar journaled, so a fault on a provider
        read (an unknown status on the next poll, an expired output link) has nothing to hit.

    Behaviour facts:
      submit_labels: top-level body field the adapter adds at Submit to carry the attempt's
        identity (Vertex ``labels``), "" for none. The created job's body is then the plan's
        request plus that field, which must hold the client_request_key (as a label value).
      progression: normalized states a plain job must show, in order, when polled to the end.
      failure_codes: provider failure code injected with ``fail_job`` -> expected ErrorClass
        name (``SAFETY_INPUT``); every code the adapter declares should be listed.
      rate_limit_classes: classes acceptable for a 429 on submit.
      submit_read_timeout_s: the adapter's configured submit read timeout; stall faults last
        longer than this.
      recovery_settle_s: extra time after a submit window before the adapter may call a search
        conclusive (a request still in flight could yet create a job); NOT_FOUND is awaited
        for up to submit_read_timeout_s + recovery_settle_s (+ slack).
      base_spec / golden_specs / unsupported_overrides: specs in proto3 JSON form.
      emulator_options: the emulator settings the suite's expectations assume (``advance:
        polls``, ``delete_mode: delete`` ...), as ``--flag value`` options of the emulator's
        command line (`emulator_flags`); CI starts the emulator with exactly these.

    The two timings are best not written here: ``--vidroute-adapter-config`` reads them from
    the adapter's configuration file (`timings`), so they cannot drift from what the sidecar runs.
    """

    name: str
    models: Mapping[str, str]
    submit_route: str
    poll_route: str
    cancel_route: str = ""
    account: str = ""
    supports_cancel: bool = False
    supports_idempotency_key: bool = False
    supports_task_search: bool = False
    supports_callbacks: bool = False
    cancel_deletes_job: bool = False
    reports_throttling: bool = False
    reports_progress: bool = False
    output_expiry_known: bool = False
    supports_usage: bool = True
    fetch_through_adapter: bool = False
    submit_labels: str = ""
    outcomes_from_webhooks: bool = False
    progression: tuple[str, ...] = ("QUEUED", "RUNNING", "SUCCEEDED")
    failure_codes: Mapping[str, str] = field(default_factory=lambda: dict(_DEFAULT_FAILURE))
    rate_limit_classes: tuple[str, ...] = ("RATE_LIMITED", "QUOTA")
    submit_read_timeout_s: float = 1.5
    recovery_settle_s: float = 0.0
    base_spec: Mapping[str, Any] = field(default_factory=lambda: dict(_BASE_SPEC))
    golden_specs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    unsupported_overrides: Mapping[str, Any] = field(
        default_factory=lambda: dict(_UNSUPPORTED_OVERRIDES)
    )
    emulator_options: Mapping[str, Any] = field(default_factory=dict)

    # -- derived capabilities --------------------------------------------------------------
    @property
    def supports_image_to_video(self) -> bool:
        return "IMAGE_TO_VIDEO" in self.models

    @property
    def supports_first_last(self) -> bool:
        return "FIRST_LAST_TO_VIDEO" in self.models

    @property
    def conclusive_recovery(self) -> bool:
        """Whether a recovery search can prove a job does *not* exist (NOT_FOUND)."""
        return self.supports_task_search or self.supports_idempotency_key

    def has(self, flag: str) -> bool:
        """Value of a capability flag by name; unknown names are a profile/suite bug."""
        if flag not in CAPABILITY_FLAGS:
            raise ProfileError(
                f"unknown capability flag {flag!r}; known: {sorted(CAPABILITY_FLAGS)}"
            )
        return bool(getattr(self, flag))

    # -- specs -----------------------------------------------------------------------------
    def spec_json(
        self, overrides: Mapping[str, Any] | None = None, mode: str = "TEXT_TO_VIDEO"
    ) -> dict[str, Any]:
        """The base spec in `mode` with `overrides` merged in (proto3 JSON form)."""
        return merge(merge(self.base_spec, {"mode": f"MODE_{mode}"}), overrides or {})

    def golden_spec_json(self, case: str) -> dict[str, Any]:
        """The spec of a golden case: the built-in one, or the profile's override of it."""
        if case not in GOLDEN_CASE_MODES:
            raise ProfileError(f"unknown golden case {case!r}; known: {sorted(GOLDEN_CASE_MODES)}")
        built_in = merge(self.base_spec, _GOLDEN_OVERRIDES[case])
        return merge(built_in, self.golden_specs.get(case, {}))

    def emulator_flags(self) -> list[str]:
        """`emulator_options` as command-line flags: ``["--delete-mode", "delete", ...]``."""
        flags: list[str] = []
        for key, value in self.emulator_options.items():
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                flags.append(flag if value else "--no-" + key.replace("_", "-"))
            else:
                flags += [flag, str(value)]
        return flags

    def model_for(self, mode: str) -> str:
        try:
            return self.models[mode]
        except KeyError:
            raise ProfileError(f"profile {self.name!r} declares no model for {mode}") from None


CAPABILITY_FLAGS = frozenset(
    {
        "supports_cancel",
        "supports_idempotency_key",
        "supports_task_search",
        "supports_callbacks",
        "cancel_deletes_job",
        "reports_throttling",
        "reports_progress",
        "output_expiry_known",
        "supports_usage",
        "fetch_through_adapter",
        "outcomes_from_webhooks",
        "supports_image_to_video",
        "supports_first_last",
        "conclusive_recovery",
    }
)
_FIELDS = {f.name: f for f in dataclasses.fields(AdapterProfile)}
_TUPLE_FIELDS = {"progression", "rate_limit_classes"}


def profile_from_mapping(data: Mapping[str, Any], source: str = "<mapping>") -> AdapterProfile:
    """Build a profile from parsed YAML/JSON, rejecting unknown keys by name."""
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ProfileError(f"{source}: unknown profile keys {unknown}; known: {sorted(_FIELDS)}")
    for required in ("name", "models", "submit_route", "poll_route"):
        if not data.get(required):
            raise ProfileError(f"{source}: {required!r} is required")
    values: dict[str, Any] = {}
    for key, value in data.items():
        values[key] = tuple(value) if key in _TUPLE_FIELDS else value
    if "base_spec" in data:
        values["base_spec"] = merge(_BASE_SPEC, data["base_spec"])
    return AdapterProfile(**values)


def load_profile(name_or_path: str) -> AdapterProfile:
    """A built-in profile by name (``runway``) or a profile YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            known = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
            raise ProfileError(f"no built-in profile {name_or_path!r}; built-in: {known}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read profile {path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ProfileError(f"{path}: a profile must be a YAML mapping")
    return profile_from_mapping(data, str(path))
