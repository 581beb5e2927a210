"""The platform safety policy: what the platform allows before any provider sees it (9.9.2).

Provider moderation decides whether *that provider* accepts a request; this policy decides
whether the *platform* does, and it runs first, at CreateTask, so a refused request is never
written, routed or sent. Because a provider's SAFETY_INPUT refusal never fails over
(`controlplane.domain.failover`), the policy is also the only place where "allowed" is decided:
a more lenient provider can never widen it.

The rules, each named in a `SafetyViolation` (``rule``, ``field``):

    blocked_terms       a configured term or regex found in ``prompt`` / ``negative_prompt``
    mode                the generation mode is not in the allowed set
    output.duration_ms  longer than the policy allows
    output.pixels       a frame larger (width x height) than the policy allows
    asset_host          an input asset's host is not on the allow-list (``asset://`` is ours)

A tenant section only tightens the global rules (more blocked terms, fewer modes, lower
maxima); it can never allow what the global policy refuses, so the platform's floor holds for
every tenant. A *profile* is a named section of the same shape (``profiles:``) that the tenants
document assigns to tenants (``safety_profile``): it tightens the global rules before the
tenant's own section does. A profile the policy does not define refuses the request
(``SAFETY_PROFILE_UNKNOWN``): a tightening that cannot be applied is not skipped.
`SafetyPolicy.from_mapping` reads the configuration document (the composition
root loads the YAML file); nothing here does I/O.

Matching: text is NFKC-normalized, case-folded and stripped of format characters (zero-width
joiners and kin) before matching, so "ＷＥＡＰＯＮ" or "wea\u200bpon" is the same word as
"weapon". A term matches on word boundaries; a pattern is a regex applied to the normalized text.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from vidroute_core.exceptions import PreconditionFailed
from vidroute_core.spec import AssetRef, GenerationSpec, Mode
from vidroute_core.validation import FieldViolation

__all__ = [
    "REASON",
    "BlockRule",
    "PolicyError",
    "SafetyPolicy",
    "SafetyViolation",
    "TenantRules",
    "ensure_allowed",
    "normalize_text",
]

REASON = "SAFETY_POLICY_VIOLATION"
TEXT_FIELDS = ("prompt", "negative_prompt")
_PLATFORM_SCHEME = "asset"  # assets already in platform storage need no host check


class PolicyError(ValueError):
    """The policy document is malformed (raised at start-up, never per request)."""


def normalize_text(text: str) -> str:
    """The form every rule matches against: NFKC, case-folded, without format characters."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in folded if unicodedata.category(ch) != "Cf")


@dataclass(frozen=True, slots=True)
class BlockRule:
    """One named set of blocked terms and patterns, checked on `fields`."""

    name: str
    terms: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    fields: tuple[str, ...] = TEXT_FIELDS
    _compiled: tuple[re.Pattern[str], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise PolicyError("every blocked rule needs a name")
        unknown = set(self.fields) - set(TEXT_FIELDS)
        if unknown:
            raise PolicyError(f"rule {self.name!r}: unknown fields {sorted(unknown)}")
        compiled: list[re.Pattern[str]] = []
        for term in self.terms:
            words = normalize_text(term).split()
            if not words:
                raise PolicyError(f"rule {self.name!r}: empty term")
            # Whitespace inside a term matches any run of whitespace; the ends are word bounds.
            compiled.append(re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, words)) + r"(?!\w)"))
        for pattern in self.patterns:
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise PolicyError(f"rule {self.name!r}: bad pattern {pattern!r}: {exc}") from exc
        object.__setattr__(self, "_compiled", tuple(compiled))

    def matches(self, normalized: str) -> bool:
        return any(p.search(normalized) for p in self._compiled)


@dataclass(frozen=True, slots=True)
class TenantRules:
    """What one policy level (global or one tenant) says; None / 0 means "no rule here"."""

    blocked: tuple[BlockRule, ...] = ()
    allowed_modes: frozenset[Mode] | None = None
    max_duration_ms: int = 0
    max_frame_pixels: int = 0
    # Hosts an input asset may come from: "cdn.example.com" exactly, ".example.com" any
    # subdomain. None: any host.
    asset_hosts: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class SafetyViolation:
    """One broken rule: which rule, on which spec field, and a sentence for the client."""

    rule: str
    field: str
    description: str
    # `field` names the spec field above, so the dataclass helper is spelled out here.
    numbers: Mapping[str, int] = dataclasses.field(default_factory=dict)


def _tightest(a: int, b: int) -> int:
    """The stricter of two maxima where 0 means unlimited."""
    return min(x for x in (a, b) if x) if (a or b) else 0


def _narrowest(a: frozenset[Any] | None, b: frozenset[Any] | None) -> frozenset[Any] | None:
    if a is None or b is None:
        return b if a is None else a
    return a & b


@dataclass(frozen=True, slots=True)
class SafetyPolicy:
    """The global rules plus per-tenant tightenings; `version` is recorded with a refusal."""

    version: str = "none"
    rules: TenantRules = field(default_factory=TenantRules)
    tenants: Mapping[str, TenantRules] = field(default_factory=dict)
    profiles: Mapping[str, TenantRules] = field(default_factory=dict)

    def effective(self, tenant_id: str, profile: str = "") -> TenantRules:
        """The rules for `tenant_id`: the global ones, tightened by `profile`'s section (a name
        of ``profiles``; "" none), then by the tenant's own."""
        rules = self.rules
        if profile:
            rules = _tighten(rules, self.profiles[profile])
        own = self.tenants.get(tenant_id)
        return rules if own is None else _tighten(rules, own)

    def profile_violations(self, spec: GenerationSpec) -> list[FieldViolation]:
        """Why `spec.safety_profile` cannot be honoured: a request does not choose its profile
        (the tenants document assigns one per tenant, `profiles`; a tenant's own section applies
        by its tenant id), so only "" (the tenant's) is accepted; anything else is refused
        rather than silently ignored (issue 20)."""
        if not spec.safety_profile:
            return []
        return [
            FieldViolation(
                "safety_profile",
                f"unknown safety profile {spec.safety_profile!r}: a request cannot choose one"
                " (the tenants document assigns each tenant's); leave it empty for the"
                " tenant's safety policy",
            )
        ]

    def check(self, spec: GenerationSpec, profile: str = "") -> list[SafetyViolation]:
        """Every rule `spec` breaks, in a stable order; empty when the platform allows it."""
        return list(_violations(spec, self.effective(spec.tenant_id, profile)))

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> SafetyPolicy:
        """Build from the configuration document (see ``controlplane/safety_policy.yaml``)."""
        _only(doc, {"version", "rules", "tenants", "profiles"}, "policy")
        sections: dict[str, dict[str, TenantRules]] = {}
        for name in ("tenants", "profiles"):
            raw = doc.get(name) or {}
            if not isinstance(raw, Mapping):
                raise PolicyError(f"{name} must be a mapping of name -> rules")
            sections[name] = {str(k): _rules(r or {}, f"{name}.{k}") for k, r in raw.items()}
        return cls(
            version=str(doc.get("version") or "unversioned"),
            rules=_rules(doc.get("rules") or {}, "rules"),
            tenants=sections["tenants"],
            profiles=sections["profiles"],
        )


def _tighten(base: TenantRules, own: TenantRules) -> TenantRules:
    return TenantRules(
        blocked=base.blocked + own.blocked,
        allowed_modes=_narrowest(base.allowed_modes, own.allowed_modes),
        max_duration_ms=_tightest(base.max_duration_ms, own.max_duration_ms),
        max_frame_pixels=_tightest(base.max_frame_pixels, own.max_frame_pixels),
        asset_hosts=_narrowest(base.asset_hosts, own.asset_hosts),
    )


def ensure_allowed(policy: SafetyPolicy, spec: GenerationSpec, profile: str = "") -> None:
    """Raise `PreconditionFailed` (reason SAFETY_POLICY_VIOLATION) naming the first broken rule.

    The message lists every violation; ErrorInfo metadata carries the first one's ``rule`` and
    ``field`` plus the policy version, so a client can act without parsing prose. A `profile`
    the policy does not define is SAFETY_PROFILE_UNKNOWN: never checked without it."""
    if profile and profile not in policy.profiles:
        raise PreconditionFailed(
            f"tenant {spec.tenant_id!r} is assigned safety profile {profile!r}, which safety"
            f" policy {policy.version} does not define; an operator must fix the tenants"
            " document or the safety policy",
            reason="SAFETY_PROFILE_UNKNOWN",
            labels={"safety_profile": profile, "policy_version": policy.version},
        )
    violations = policy.check(spec, profile)
    if not violations:
        return
    first = violations[0]
    summary = "; ".join(f"{v.field}: {v.description} [{v.rule}]" for v in violations)
    raise PreconditionFailed(
        f"the platform safety policy refuses this request: {summary}",
        {**first.numbers, "violations": len(violations)},
        reason=REASON,
        labels={"rule": first.rule, "field": first.field, "policy_version": policy.version},
    )


def _violations(spec: GenerationSpec, rules: TenantRules) -> Iterator[SafetyViolation]:
    for name in TEXT_FIELDS:
        text = normalize_text(getattr(spec, name))
        for rule in rules.blocked:
            if name in rule.fields and rule.matches(text):
                yield SafetyViolation(rule.name, name, "contains content the platform blocks")
    if rules.allowed_modes is not None and spec.mode not in rules.allowed_modes:
        allowed = ", ".join(sorted(m.value for m in rules.allowed_modes)) or "none"
        yield SafetyViolation("mode", "mode", f"{spec.mode.value} is not allowed ({allowed})")
    out = spec.output
    if rules.max_duration_ms and out.duration_ms > rules.max_duration_ms:
        yield SafetyViolation(
            "max_duration",
            "output.duration_ms",
            f"at most {rules.max_duration_ms} ms",
            {"duration_ms": out.duration_ms, "max_duration_ms": rules.max_duration_ms},
        )
    pixels = out.width * out.height
    if rules.max_frame_pixels and pixels > rules.max_frame_pixels:
        yield SafetyViolation(
            "max_frame_pixels",
            "output.width",
            f"a frame of {out.width}x{out.height} exceeds {rules.max_frame_pixels} pixels",
            {"frame_pixels": pixels, "max_frame_pixels": rules.max_frame_pixels},
        )
    if rules.asset_hosts is not None:
        for path, asset in _assets(spec):
            host = _host_problem(asset, rules.asset_hosts)
            if host is not None:
                yield SafetyViolation(
                    "asset_host", f"{path}.object_uri", f"host {host!r} is not on the allow-list"
                )


def _assets(spec: GenerationSpec) -> Iterator[tuple[str, AssetRef]]:
    for slot in ("first_frame", "last_frame", "source_video"):
        asset: AssetRef | None = getattr(spec, slot)
        if asset is not None:
            yield slot, asset
    for i, ref in enumerate(spec.references):
        yield f"references[{i}]", ref


def host_allowed(host: str, allowed: Iterable[str]) -> bool:
    """`host` equals an entry, or is a subdomain of a ".suffix" entry."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        if entry.startswith(".") and host.endswith(entry):
            return True
        if host == entry:
            return True
    return False


def _host_problem(asset: AssetRef, allowed: frozenset[str]) -> str | None:
    """The offending host, or None when the asset's location is allowed."""
    if not asset.object_uri:
        return None  # an asset_id alone names an asset already in platform storage
    parts = urlsplit(asset.object_uri)
    if parts.scheme.lower() == _PLATFORM_SCHEME:
        return None
    host = (parts.hostname or "").lower()
    return None if host and host_allowed(host, allowed) else host


# ---- the configuration document -------------------------------------------------------------


def _only(doc: Mapping[str, Any], keys: set[str], where: str) -> None:
    if not isinstance(doc, Mapping):
        raise PolicyError(f"{where} must be a mapping")
    unknown = set(doc) - keys
    if unknown:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}")


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{where} must be a list of strings")
    return tuple(value)


def _limit(value: Any, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PolicyError(f"{where} must be a non-negative integer (0: no limit)")
    return value


def _rules(doc: Mapping[str, Any], where: str) -> TenantRules:
    keys = {"blocked", "allowed_modes", "max_duration_ms", "max_frame_pixels", "asset_hosts"}
    _only(doc, keys, where)
    blocked = []
    for i, item in enumerate(doc.get("blocked") or []):
        _only(item, {"name", "terms", "patterns", "fields"}, f"{where}.blocked[{i}]")
        blocked.append(
            BlockRule(
                name=str(item.get("name") or ""),
                terms=_strings(item.get("terms"), f"{where}.blocked[{i}].terms"),
                patterns=_strings(item.get("patterns"), f"{where}.blocked[{i}].patterns"),
                fields=_strings(item.get("fields"), f"{where}.blocked[{i}].fields") or TEXT_FIELDS,
            )
        )
    modes = None
    if doc.get("allowed_modes") is not None:
        names = _strings(doc["allowed_modes"], f"{where}.allowed_modes")
        try:
            modes = frozenset(Mode(n) for n in names)
        except ValueError as exc:
            raise PolicyError(f"{where}.allowed_modes: {exc}") from exc
    hosts = None
    if doc.get("asset_hosts") is not None:
        hosts = frozenset(h.lower() for h in _strings(doc["asset_hosts"], f"{where}.asset_hosts"))
    return TenantRules(
        blocked=tuple(blocked),
        allowed_modes=modes,
        max_duration_ms=_limit(doc.get("max_duration_ms"), f"{where}.max_duration_ms"),
        max_frame_pixels=_limit(doc.get("max_frame_pixels"), f"{where}.max_frame_pixels"),
        asset_hosts=hosts,
    )
