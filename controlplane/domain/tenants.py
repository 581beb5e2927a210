"""Tenants as configuration (design 9.12.1-9.12.3, 9.25.5): text in, validated entitlements out.

The operators' tenants document is YAML or JSON, one mapping::

    version: tenants-2026-12-05        # required; what a publication and its history name
    description: "..."                 # optional
    default:                           # required; the entry of every tenant not listed
      service_classes:                 # required; the classes the tenant may use
        STANDARD: {weight: 1}          # weight: its DRR weight in that class, (0, 1000], 1
        BATCH: {weight: 1, max_in_flight: 50, max_queued: 10000}
      projects:                        # project id -> its priority inside the tenant
        launch: {priority: 2}          # added to a task's priority, [-10, 10]
      allowed_regions: [us-east1]      # regions a task may run in; absent or []: any
      preferred_regions: [us-east1]    # ranked first to last by routing's region score
      routing_scenario: AD_PRODUCTION  # the routing policy's weight set of that name scores
                                       # its tasks (9.13); absent, or not in the policy: the
                                       # service class's set
      create_rate: {per_second: 5, burst: 20}   # CreateTask token bucket; absent: no limit
      safety_profile: strict           # a profile of the safety policy tightens its rules
      billing_policy: postpaid:5000000 # prepaid | postpaid[:overdraft micros]; absent: the
                                       # deployment's (VIDROUTE_BILLING_*); applies with billing
    tenants:
      acme:                            # a tenant id; a field it leaves out is default's
        service_classes:
          INTERACTIVE: {weight: 5, max_in_flight: 20}
          STANDARD: {weight: 5}

``max_in_flight`` caps the tenant's tasks of the class being dispatched or run at once (the
fair queue skips the tenant in that class at its cap and keeps its place); ``max_queued`` caps
its QUEUED tasks of the class (CreateTask refuses past it). Both absent: no cap.

Every problem is reported at once as `TenantsDocumentError` (an `InvalidSpec`: INVALID_ARGUMENT
with one field violation each, paths like ``tenants.acme.service_classes.BATCH.weight``). Pure:
no I/O. `Tenants` answers the questions the rest of the system asks (`entry`, `weight`,
`max_in_flight`, `project_priority`), and `ensure_entitled` is CreateTask's rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from controlplane.domain.documents import Checker, load_document
from controlplane.domain.documents import join_path as _join
from controlplane.domain.money import BillingPolicy
from vidroute_core.exceptions import InvalidSpec, PermissionDenied
from vidroute_core.spec import ServiceClass
from vidroute_core.validation import IDENTIFIER_RE, FieldViolation

MAX_DOCUMENT_CHARS = 1_000_000
MAX_TENANTS = 10_000
MAX_PROJECTS = 1_000
MAX_REGIONS = 64
MAX_WEIGHT = 1000.0
MAX_PRIORITY = 10
MAX_COUNT = 10_000_000
MAX_RATE = 100_000.0
BUILTIN_VERSION = "tenants-builtin"
_TOP = frozenset({"version", "description", "default", "tenants"})
_ENTRY = frozenset(
    {"service_classes", "projects", "allowed_regions", "preferred_regions", "create_rate"}
    | {"billing_policy", "routing_scenario", "safety_profile"}
)
_CLASS = frozenset({"weight", "max_in_flight", "max_queued"})
_PROJECT = frozenset({"priority"})
_RATE = frozenset({"per_second", "burst"})


class TenantsDocumentError(InvalidSpec):
    """The tenants document is refused; `violations` names every problem, by path."""


@dataclass(frozen=True, slots=True)
class ClassShare:
    """A tenant's share of one service class."""

    weight: float = 1.0
    max_in_flight: int | None = None
    max_queued: int | None = None


@dataclass(frozen=True, slots=True)
class CreateRate:
    """A token bucket: `burst` creates at once, refilled at `per_second`."""

    per_second: float
    burst: int


def _all_classes() -> Mapping[ServiceClass, ClassShare]:
    return MappingProxyType({c: ClassShare() for c in ServiceClass})


@dataclass(frozen=True, slots=True)
class TenantEntry:
    """What one tenant may use and how much of it."""

    service_classes: Mapping[ServiceClass, ClassShare] = field(default_factory=_all_classes)
    projects: Mapping[str, int] = field(default_factory=dict)
    allowed_regions: frozenset[str] | None = None  # None: any region
    create_rate: CreateRate | None = None
    preferred_regions: tuple[str, ...] = ()  # best first; (): no preference
    billing_policy: BillingPolicy | None = None  # None: the deployment's configured one
    routing_scenario: str = ""  # "": the service class's weight set
    safety_profile: str = ""  # a profile of the safety policy; "": none

    @property
    def entitled(self) -> tuple[ServiceClass, ...]:
        """The classes it may use, in `ServiceClass` order."""
        return tuple(c for c in ServiceClass if c in self.service_classes)


@dataclass(frozen=True)
class Tenants:
    """A validated tenants document; `entry` is a listed tenant's, else ``default``."""

    version: str
    default: TenantEntry
    tenants: Mapping[str, TenantEntry] = field(default_factory=dict)
    description: str = ""

    def entry(self, tenant_id: str) -> TenantEntry:
        return self.tenants.get(tenant_id, self.default)

    def share(self, tenant_id: str, service_class: ServiceClass | str) -> ClassShare | None:
        """The tenant's share of the class (by member or value); None: not entitled."""
        return self.entry(tenant_id).service_classes.get(ServiceClass(service_class))

    def weight(self, tenant_id: str, service_class: ServiceClass | str) -> float:
        # A task of a class its tenant is no longer entitled to (queued before a publication)
        # is still served, at weight 1: entitlement is checked when a task is created.
        share = self.share(tenant_id, service_class)
        return 1.0 if share is None else share.weight

    def max_in_flight(self, tenant_id: str, service_class: ServiceClass | str) -> int | None:
        share = self.share(tenant_id, service_class)
        return None if share is None else share.max_in_flight

    def project_priority(self, tenant_id: str, project_id: str) -> int:
        return self.entry(tenant_id).projects.get(project_id, 0) if project_id else 0

    def allowed_regions(self, tenant_id: str) -> frozenset[str] | None:
        return self.entry(tenant_id).allowed_regions

    def preferred_regions(self, tenant_id: str) -> tuple[str, ...]:
        return self.entry(tenant_id).preferred_regions

    def routing_scenario(self, tenant_id: str) -> str:
        return self.entry(tenant_id).routing_scenario

    def safety_profiles(self) -> dict[str, str]:
        """Path -> profile of every entry that names one itself (for the publication's check
        against the safety policy)."""
        named = {"default.safety_profile": self.default.safety_profile}
        for tenant, entry in self.tenants.items():
            if entry.safety_profile != self.default.safety_profile:
                named[f"{_join('tenants', tenant)}.safety_profile"] = entry.safety_profile
        return {path: profile for path, profile in named.items() if profile}


def ensure_entitled(tenants: Tenants, tenant_id: str, service_class: ServiceClass) -> ClassShare:
    """The tenant's share of `service_class`, or `PermissionDenied` naming the classes it may use.

    PERMISSION_DENIED rather than FAILED_PRECONDITION: the caller's tenant is not allowed the
    class, nothing about the system's state would let the same request through on a retry."""
    entry = tenants.entry(tenant_id)
    share = entry.service_classes.get(service_class)
    if share is not None:
        return share
    entitled = ", ".join(c.value for c in entry.entitled)
    raise PermissionDenied(
        f"tenant {tenant_id!r} is not entitled to service class {service_class.value}"
        f" (entitled: {entitled}; tenants version {tenants.version})",
        operation="CreateTask",
        reason="SERVICE_CLASS_NOT_ENTITLED",
        labels={
            "service_class": service_class.value,
            "entitled_service_classes": ",".join(c.value for c in entry.entitled),
            "tenants_version": tenants.version,
        },
    )


def parse_tenants_document(text: str) -> Tenants:
    """The document in `text` (YAML or JSON) validated whole; `TenantsDocumentError` otherwise."""
    return tenants_from_mapping(load_document(text, MAX_DOCUMENT_CHARS, TenantsDocumentError))


def tenants_from_mapping(data: Any) -> Tenants:
    """As `parse_tenants_document`, for a document already loaded."""
    check = Checker()
    top = check.fields(data, "", _TOP)
    version, description = check.header(top)
    if "default" not in top:
        check.bad("default", "is required: the entry of every tenant the document does not list")
        default = TenantEntry()
    else:
        default = _entry(check, top["default"], "default", None)
    tenants: dict[str, TenantEntry] = {}
    raw = check.fields(top.get("tenants", {}), "tenants", None)
    if len(raw) > MAX_TENANTS:
        check.bad("tenants", f"at most {MAX_TENANTS} tenants, got {len(raw)}")
    for tenant_id, body in raw.items():
        path = _join("tenants", tenant_id)
        if not IDENTIFIER_RE.fullmatch(tenant_id):
            check.bad(path, f"tenant id must match {IDENTIFIER_RE.pattern}")
            continue
        tenants[tenant_id] = _entry(check, body, path, default)
    if check.found:
        raise TenantsDocumentError(check.found)
    return Tenants(version, default, MappingProxyType(tenants), description)


def _entry(check: Checker, value: Any, path: str, base: TenantEntry | None) -> TenantEntry:
    """One entry; a field it leaves out is `base`'s (``default``'s), or built-in for default."""
    body = check.fields(value, path, _ENTRY)
    inherited = base or TenantEntry(create_rate=None)
    if "service_classes" in body:
        classes = _classes(check, body["service_classes"], _join(path, "service_classes"))
    elif base is None:
        check.bad(_join(path, "service_classes"), "is required: the classes a tenant may use")
        classes = inherited.service_classes
    else:
        classes = inherited.service_classes
    projects = (
        _projects(check, body["projects"], _join(path, "projects"))
        if "projects" in body
        else inherited.projects
    )
    regions = (
        _regions(check, body["allowed_regions"], _join(path, "allowed_regions"))
        if "allowed_regions" in body
        else inherited.allowed_regions
    )
    rate = (
        _rate(check, body["create_rate"], _join(path, "create_rate"))
        if "create_rate" in body
        else inherited.create_rate
    )
    preferred = inherited.preferred_regions
    where = _join(path, "preferred_regions")
    if "preferred_regions" in body:
        ranked = _regions(check, body["preferred_regions"], where) or frozenset()
        preferred = tuple(r for r in body["preferred_regions"] if r in ranked)
        if len(set(preferred)) != len(preferred):
            check.bad(where, "lists a region twice")
    outside = sorted(set(preferred) - (regions or set(preferred)))
    if outside and ("preferred_regions" in body or "allowed_regions" in body):
        check.bad(where, f"{', '.join(outside)} not in allowed_regions")
    billing = inherited.billing_policy
    if "billing_policy" in body:
        raw = body["billing_policy"]
        where = _join(path, "billing_policy")
        if not isinstance(raw, str):
            check.bad(where, f"must be a string (prepaid | postpaid[:micros]), got {raw!r}")
        else:
            try:
                billing = BillingPolicy.parse(raw)
            except ValueError as exc:
                check.bad(where, str(exc))
    scenario = inherited.routing_scenario
    if "routing_scenario" in body:
        scenario = check.identifier(body["routing_scenario"], _join(path, "routing_scenario"))
    profile = inherited.safety_profile
    if "safety_profile" in body:
        profile = check.identifier(body["safety_profile"], _join(path, "safety_profile"))
    return TenantEntry(classes, projects, regions, rate, preferred, billing, scenario, profile)


def _classes(check: Checker, value: Any, path: str) -> Mapping[ServiceClass, ClassShare]:
    known = frozenset(c.value for c in ServiceClass)
    raw = check.fields(value, path, known)
    if isinstance(value, Mapping) and not value:
        check.bad(path, "must name at least one service class")
    out: dict[ServiceClass, ClassShare] = {}
    for name, body in raw.items():
        where = _join(path, name)
        share = check.fields({} if body is None else body, where, _CLASS)
        weight = 1.0
        if "weight" in share:
            weight = check.bounded(share["weight"], f"{where}.weight", 0, MAX_WEIGHT, open_lo=True)
        caps: dict[str, int | None] = {"max_in_flight": None, "max_queued": None}
        for cap in caps:
            if cap in share:
                caps[cap] = check.integer(share[cap], f"{where}.{cap}", 1, MAX_COUNT)
        out[ServiceClass(name)] = ClassShare(weight, caps["max_in_flight"], caps["max_queued"])
    return MappingProxyType(out)


def _projects(check: Checker, value: Any, path: str) -> Mapping[str, int]:
    raw = check.fields(value, path, None)
    if len(raw) > MAX_PROJECTS:
        check.bad(path, f"at most {MAX_PROJECTS} projects, got {len(raw)}")
    out: dict[str, int] = {}
    for project, body in raw.items():
        where = _join(path, project)
        if not IDENTIFIER_RE.fullmatch(project):
            check.bad(where, f"project id must match {IDENTIFIER_RE.pattern}")
            continue
        fields = check.fields(body, where, _PROJECT)
        if "priority" not in fields:
            if isinstance(body, Mapping):
                check.bad(f"{where}.priority", "is required")
            continue
        out[project] = check.integer(
            fields["priority"], f"{where}.priority", -MAX_PRIORITY, MAX_PRIORITY
        )
    return MappingProxyType(out)


def _regions(check: Checker, value: Any, path: str) -> frozenset[str] | None:
    if not isinstance(value, list):
        check.bad(path, f"must be a list of region names, got {type(value).__name__}")
        return None
    if len(value) > MAX_REGIONS:
        check.bad(path, f"at most {MAX_REGIONS} regions")
    regions = [check.identifier(r, f"{path}[{i}]") for i, r in enumerate(value)]
    return frozenset(regions) or None


def _rate(check: Checker, value: Any, path: str) -> CreateRate | None:
    if value is None:  # an explicit null: no limit (over a default that has one)
        return None
    body = check.fields(value, path, _RATE)
    for key in sorted(_RATE - set(body)):
        if isinstance(value, Mapping):
            check.bad(f"{path}.{key}", "is required")
    per_second, burst = 1.0, 1
    if "per_second" in body:
        per_second = check.bounded(
            body["per_second"], f"{path}.per_second", 0, MAX_RATE, open_lo=True
        )
    if "burst" in body:
        burst = check.integer(body["burst"], f"{path}.burst", 1, MAX_COUNT)
    return CreateRate(per_second, burst)  # used only when nothing was found wrong


# Before any publication: every class, equal weights, no caps, no rate limit (as before tenants
# were configuration). GetTenantConfig shows this text while nothing is published.
BUILTIN_DOCUMENT = """\
# Built in: in use until a tenants document is published (vidroute tenants publish FILE).
version: tenants-builtin
description: every tenant may use every class at weight 1, no caps, no CreateTask rate limit
default:
  service_classes: {INTERACTIVE: {weight: 1}, STANDARD: {weight: 1}, BATCH: {weight: 1}}
"""
BUILTIN = parse_tenants_document(BUILTIN_DOCUMENT)


def ensure_publishable(tenants: Tenants) -> None:
    """A published document may not take the built-in one's version name."""
    if tenants.version == BUILTIN_VERSION:
        raise TenantsDocumentError(
            [FieldViolation("version", f"{BUILTIN_VERSION!r} names the built-in configuration")]
        )
