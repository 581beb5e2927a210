"""Versioned capability entries from YAML (design 9.6.1, 9.6.3, 9.6.4), validated by JSON Schema.

Each YAML document is one entry (provider + account + region + model + version); a file may hold
several documents separated by ``---``. Every document is checked against
``capability.schema.json`` and its constraint expressions are parsed before anything is
returned, so a malformed file fails at start-up, never in the middle of a request.

An entry without ``account`` (or with ``account: "*"``) is a template: `expand_for_accounts`
stamps it out once per configured account, taking the account's region unless the entry names
one. The result is plain frozen dataclasses: the scheduler and the adapter sidecars share them,
and only the sidecar's gRPC layer turns them into ``CapabilityEntry`` messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from vidroute_core.capabilities.constraints import Constraint, ConstraintError, validate_syntax
from vidroute_core.spec import Mode

ANY_ACCOUNT = "*"


class CapabilityLoadError(ValueError):
    """A capability file is unreadable, breaks the schema, or has a bad constraint."""


@dataclass(frozen=True, slots=True)
class Operations:
    """Operations a provider offers for a model."""

    polling: bool = True
    callback: bool = False
    cancellation: bool = False
    client_idempotency_key: bool = False
    task_search: bool = False
    # ListUsage returns the provider's usage records (recovery's last evidence, 9.17.4).
    usage_records: bool = False


@dataclass(frozen=True, slots=True)
class Commercial:
    """Versioned price facts; money in integer micros of `currency`."""

    currency: str
    price_version: str
    price_micros_per_output_second: int
    price_micros_per_output_second_with_audio: int | None = None
    provider_unit: str = ""
    provider_milliunits_per_output_second: int = 0
    provider_milliunits_per_output_second_with_audio: int | None = None
    micros_per_provider_unit: int = 0
    #: Provider units (thousandths) every generation costs besides its output seconds.
    provider_milliunits_per_generation: int = 0
    #: The schema's ``billing`` block as written (empty: failures billed nothing, per job);
    #: read by reconciliation (`controlplane.domain.billing_rules.BillingRules`).
    billing: Mapping[str, Any] = field(default_factory=dict)

    def micros_per_second(self, with_audio: bool) -> int:
        """Price of one output second, with the audio price when audio is generated."""
        if with_audio and self.price_micros_per_output_second_with_audio is not None:
            return self.price_micros_per_output_second_with_audio
        return self.price_micros_per_output_second


@dataclass(frozen=True, slots=True)
class SelfHostedProfile:
    """Extra facts of a model served on our own GPUs (design 9.21)."""

    required_gpu_type: str
    checkpoint_version: str
    container_image_digest: str
    estimated_vram_mb: int = 0
    estimated_gpu_seconds_per_output_second: float = 0.0
    batchable: bool = False
    scheduler_queue: str = ""
    cold_start_seconds: int = 0


@dataclass(frozen=True, slots=True)
class Capability:
    """One capability matrix entry; `native` holds adapter-interpreted wire facts."""

    provider: str
    account: str
    region: str
    model: str
    model_version: str
    capability_version: str
    lifecycle: str  # preview | stable | deprecated | sunset
    modes: tuple[Mode, ...]
    aspect_ratios: tuple[str, ...]
    durations_seconds: tuple[int, ...]
    resolutions: tuple[str, ...]
    operations: Operations
    commercial: Commercial
    sunset_at: datetime | None = None
    native_audio: bool = False
    audio_optional: bool = True
    max_sample_count: int = 1
    supports_last_frame: bool = False
    max_reference_images: int = 0
    supports_seed: bool = False
    supports_negative_prompt: bool = False
    max_prompt_chars: int = 0
    constraints: tuple[Constraint, ...] = ()
    max_concurrency: int = 0
    output_url_ttl_seconds: int = 0
    #: The model's quality score before evidence (9.14); None: the router's default prior.
    quality_prior: float | None = None
    self_hosted: SelfHostedProfile | None = None
    native: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def is_template(self) -> bool:
        """True when the entry applies to every account (no concrete account named)."""
        return self.account == ANY_ACCOUNT


def _schema() -> dict[str, Any]:
    text = resources.files("vidroute_core.capabilities").joinpath("capability.schema.json")
    loaded: dict[str, Any] = json.loads(text.read_text(encoding="utf-8"))
    return loaded


_VALIDATOR = jsonschema.Draft202012Validator(_schema())


def _parse_time(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    text = str(value)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        text += "T00:00:00+00:00"
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise CapabilityLoadError(f"{where}: sunset {value!r} is not a date or time") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _normalize_yaml(doc: Any) -> Any:
    """YAML turns bare dates into `date` objects; the schema wants strings."""
    if isinstance(doc, dict):
        return {str(k): _normalize_yaml(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_normalize_yaml(v) for v in doc]
    if isinstance(doc, datetime | date):
        return doc.isoformat()
    return doc


def parse_entry(doc: Mapping[str, Any], where: str = "<memory>") -> Capability:
    """Validate one document and build its `Capability`."""
    data = _normalize_yaml(doc)
    errors = sorted(_VALIDATOR.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        details = "; ".join(
            f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in errors
        )
        raise CapabilityLoadError(f"{where}: {details}")
    inputs, output, ops = data.get("inputs", {}), data["output"], data["operations"]
    com = data["commercial"]
    constraints = tuple(
        Constraint(c["when"], c["require"], c.get("message", ""))
        for c in data.get("constraints", [])
    )
    try:
        validate_syntax(constraints)
    except ConstraintError as exc:
        raise CapabilityLoadError(f"{where}: {exc}") from exc
    version = str(data["version"])
    hosted = data.get("self_hosted")
    prior = data.get("quality_prior")
    return Capability(
        provider=data["provider"],
        account=data.get("account", ANY_ACCOUNT),
        region=data.get("region", ""),
        model=data["model"],
        model_version=version,
        capability_version=data.get(
            "capability_version", f"{data['provider']}/{data['model']}/{version}"
        ),
        lifecycle=data["status"],
        sunset_at=_parse_time(data.get("sunset"), where),
        modes=tuple(Mode(m) for m in data["modes"]),
        aspect_ratios=tuple(output["aspect_ratios"]),
        durations_seconds=tuple(sorted(output["durations_seconds"])),
        resolutions=tuple(output["resolutions"]),
        native_audio=bool(output.get("native_audio", False)),
        audio_optional=bool(output.get("audio_optional", True)),
        max_sample_count=int(output.get("max_sample_count", 1)),
        supports_last_frame=bool(inputs.get("last_frame", False)),
        max_reference_images=int(inputs.get("max_reference_images", 0)),
        supports_seed=bool(inputs.get("seed", False)),
        supports_negative_prompt=bool(inputs.get("negative_prompt", False)),
        max_prompt_chars=int(inputs.get("max_prompt_chars", 0)),
        constraints=constraints,
        operations=Operations(**ops),
        commercial=Commercial(**com),
        max_concurrency=int(data.get("max_concurrency", 0)),
        output_url_ttl_seconds=int(data.get("output_url_ttl_seconds", 0)),
        quality_prior=None if prior is None else float(prior),
        self_hosted=SelfHostedProfile(**hosted) if hosted else None,
        native=dict(data.get("native", {})),
        source=where,
    )


def load_file(path: Path) -> list[Capability]:
    """Every entry of one YAML file (one per document)."""
    try:
        with path.open(encoding="utf-8") as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        raise CapabilityLoadError(f"{path}: {exc}") from exc
    out = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise CapabilityLoadError(f"{path}#{i}: a document must be a mapping")
        out.append(parse_entry(doc, f"{path}#{i}"))
    return out


def load_directory(directory: Path) -> list[Capability]:
    """Every entry of every ``*.yaml`` file in `directory`, files in name order.

    Two entries with the same (provider, account, region, model, model_version) are an error:
    a capability version must be unambiguous (9.6.4).
    """
    entries: list[Capability] = []
    for path in sorted(directory.glob("*.yaml")):
        entries.extend(load_file(path))
    _check_unique(entries)
    return entries


def _check_unique(entries: Sequence[Capability]) -> None:
    seen: dict[tuple[str, ...], str] = {}
    for e in entries:
        key = (e.provider, e.account, e.region, e.model, e.model_version)
        if key in seen:
            raise CapabilityLoadError(f"{e.source}: duplicates {seen[key]} for {'/'.join(key)}")
        seen[key] = e.source


def expand_for_accounts(
    entries: Iterable[Capability], accounts: Iterable[tuple[str, str]]
) -> list[Capability]:
    """Stamp template entries out per (account name, region); concrete entries stay as they are.

    A concrete entry whose account is not configured is dropped: the adapter could not serve it.
    """
    accounts = list(accounts)
    names = {name for name, _ in accounts}
    out: list[Capability] = []
    for e in entries:
        if e.is_template:
            out.extend(
                replace(e, account=name, region=e.region or region) for name, region in accounts
            )
        elif e.account in names:
            region = e.region or next(r for n, r in accounts if n == e.account)
            out.append(replace(e, region=region))
    _check_unique(out)
    return out


def find(
    entries: Iterable[Capability], *, account: str, model: str, model_version: str = ""
) -> Capability | None:
    """The entry for account + model (+ version; empty means the newest non-sunset version)."""
    matches = [e for e in entries if e.account == account and e.model == model]
    if model_version:
        return next((e for e in matches if e.model_version == model_version), None)
    live = [e for e in matches if e.lifecycle != "sunset"] or matches
    return max(live, key=lambda e: e.model_version, default=None)
