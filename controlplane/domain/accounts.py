"""Provider accounts and their limits as configuration (design 9.11, 9.19.1, 9.25.5).

Every dimension 9.11 names, per provider account. Concurrency limits are held under leases (a
slot per running attempt, returned when it ends); rate and budget limits are windows (a count
or a sum that only the window's end gives back). ``None`` everywhere means "no limit of that
kind configured" (the model's capability ``max_concurrency`` still caps its model dimension).

The operators' accounts document is YAML or JSON, one mapping::

    version: accounts-2026-12-05       # required; what a publication and its history name
    description: "..."                 # optional
    accounts:
      runway:                          # a provider
        default:                       # one of its accounts (provider_accounts.account_name)
          credential_ref: env:RUNWAY_API_KEY   # required: where the secret lives (env:NAME,
                                               # file:/path, kms://...), never the secret
          enabled: true                # false: no new work routes to it (ACCOUNT_DISABLED)
          regions: [us-east1]          # where its candidates may run; absent or []: any
          limits:                      # every one optional; absent: no limit of that kind
            max_concurrency: 3         # running attempts of the account, every model
            model_concurrency: {gen4.5: 2}          # model id -> slots (the smaller of this
                                                    # and the capability's max_concurrency)
            modality_concurrency: {IMAGE_TO_VIDEO: 1}   # task mode -> slots
            region_concurrency: {us-east1: 3}       # region -> slots
            submits_per_minute: 60     # submits admitted in any rolling minute
            generations_per_day: 5000  # generations admitted in any rolling 24 hours
            spend_per_month_micros: 500000000       # estimated cost per calendar month, UTC

A *modality* is the task's generation mode (``spec.mode``: TEXT_TO_VIDEO, IMAGE_TO_VIDEO,
FIRST_LAST_TO_VIDEO, VIDEO_TO_VIDEO, EXTEND_VIDEO): providers quote separate concurrency for
text-to-video and image-to-video jobs of the same model, and the mode is what decides which.

Every problem is reported at once as `AccountsDocumentError` (INVALID_ARGUMENT, one field
violation each, paths like ``accounts.runway.default.limits.model_concurrency["gen4.5"]``).
Pure: no I/O. An account the document does not list keeps today's behaviour: enabled, any
region, no limits beyond its models' capability caps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from controlplane.domain.documents import Checker, join_path, load_document
from vidroute_core.exceptions import InvalidSpec
from vidroute_core.spec import Mode
from vidroute_core.validation import IDENTIFIER_RE, MODEL_NAME_RE, FieldViolation

MAX_DOCUMENT_CHARS = 1_000_000
MAX_ACCOUNTS = 10_000
MAX_KEYS = 1_000  # models, modalities or regions of one account
MAX_SLOTS = 1_000_000
MAX_PER_MINUTE = 1_000_000
MAX_PER_DAY = 1_000_000_000
MAX_SPEND_MICROS = 10**15  # a billion units of a currency a month
BUILTIN_VERSION = "accounts-builtin"
_TOP = frozenset({"version", "description", "accounts"})
_ENTRY = frozenset({"credential_ref", "enabled", "regions", "limits"})
_COUNTS = {
    "max_concurrency": MAX_SLOTS,
    "submits_per_minute": MAX_PER_MINUTE,
    "generations_per_day": MAX_PER_DAY,
    "spend_per_month_micros": MAX_SPEND_MICROS,
}
_PER_KEY = ("model_concurrency", "modality_concurrency", "region_concurrency")
_LIMITS = frozenset(_COUNTS) | frozenset(_PER_KEY)
_MODES = frozenset(m.value for m in Mode)
# scheme:where, no spaces: env:RUNWAY_KEY, file:/run/secrets/k, kms://runway/prod-us (9.19.1:
# the secret lives in a KMS or secret manager, the database keeps where).
_REFERENCE = re.compile(r"[a-z][a-z0-9+.-]*:\S+")


def _empty() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class AccountLimits:
    """The limits of one provider account; each is enforced atomically with its leases."""

    max_concurrency: int | None = None  # the account total, every model and modality
    model_concurrency: Mapping[str, int] = field(default_factory=_empty)  # model id -> slots
    modality_concurrency: Mapping[str, int] = field(default_factory=_empty)  # modality -> slots
    region_concurrency: Mapping[str, int] = field(default_factory=_empty)  # region -> slots
    submits_per_minute: int | None = None  # submits admitted in any rolling minute
    generations_per_day: int | None = None  # generations admitted in any rolling 24 hours
    spend_per_month_micros: int | None = None  # estimated cost admitted per calendar month, UTC


@dataclass(frozen=True, slots=True)
class AccountKey:
    """One provider account, as the catalog names it (``provider_accounts``)."""

    provider: str
    account: str


@dataclass(frozen=True, slots=True)
class AccountEntry:
    """One account as the document configures it."""

    credential_ref: str = ""  # where its secret lives (env:NAME, file:/path); "": not listed
    enabled: bool = True
    regions: tuple[str, ...] = ()  # (): any region
    limits: AccountLimits = field(default_factory=AccountLimits)


UNLISTED = AccountEntry()


@dataclass(frozen=True)
class Accounts:
    """A validated accounts document: each listed account's entry, `UNLISTED` for the others."""

    version: str
    accounts: Mapping[AccountKey, AccountEntry] = field(default_factory=dict)
    description: str = ""

    def entry(self, provider: str, account: str) -> AccountEntry:
        return self.accounts.get(AccountKey(provider, account), UNLISTED)

    def limits(self, provider: str, account: str) -> AccountLimits:
        """The account's limits; an unlisted account has none (today's behaviour)."""
        return self.entry(provider, account).limits

    def enabled(self, provider: str, account: str) -> bool:
        return self.entry(provider, account).enabled

    def allows_region(self, provider: str, account: str, region: str) -> bool:
        regions = self.entry(provider, account).regions
        return not regions or region in regions


class AccountsDocumentError(InvalidSpec):
    """The accounts document is refused; `violations` names every problem, by path."""


def parse_accounts_document(text: str) -> Accounts:
    """The document in `text` (YAML or JSON) validated whole; `AccountsDocumentError` otherwise."""
    return accounts_from_mapping(load_document(text, MAX_DOCUMENT_CHARS, AccountsDocumentError))


def accounts_from_mapping(data: Any) -> Accounts:
    """As `parse_accounts_document`, for a document already loaded."""
    check = Checker()
    top = check.fields(data, "", _TOP)
    version, description = check.header(top)
    entries: dict[AccountKey, AccountEntry] = {}
    providers = check.fields(top.get("accounts", {}), "accounts", None)
    for provider, accounts in providers.items():
        where = join_path("accounts", provider)
        if not IDENTIFIER_RE.fullmatch(provider):
            check.bad(where, f"provider must match {IDENTIFIER_RE.pattern}")
            continue
        for name, body in check.fields(accounts, where, None).items():
            path = join_path(where, name)
            if not IDENTIFIER_RE.fullmatch(name):
                check.bad(path, f"account name must match {IDENTIFIER_RE.pattern}")
                continue
            entries[AccountKey(provider, name)] = _entry(check, body, path)
    if len(entries) > MAX_ACCOUNTS:
        check.bad("accounts", f"at most {MAX_ACCOUNTS} accounts, got {len(entries)}")
    if check.found:
        raise AccountsDocumentError(check.found)
    return Accounts(version, MappingProxyType(entries), description)


def _entry(check: Checker, value: Any, path: str) -> AccountEntry:
    body = check.fields(value, path, _ENTRY)
    ref = ""
    if "credential_ref" not in body:
        if isinstance(value, Mapping):
            check.bad(join_path(path, "credential_ref"), "is required (where its secret lives)")
    else:
        ref = _credential_ref(check, body["credential_ref"], join_path(path, "credential_ref"))
    enabled = body.get("enabled", True)
    if not isinstance(enabled, bool):
        check.bad(join_path(path, "enabled"), f"must be true or false, got {enabled!r}")
        enabled = True
    regions: tuple[str, ...] = ()
    if "regions" in body:
        regions = _regions(check, body["regions"], join_path(path, "regions"))
    limits = AccountLimits()
    if "limits" in body:
        limits = _limits(check, body["limits"], join_path(path, "limits"), regions)
    return AccountEntry(ref, enabled, regions, limits)


def _credential_ref(check: Checker, value: Any, path: str) -> str:
    """A reference to where the secret lives; a value with a dev default (``env:X:-value``)
    would put a secret in the document, so it is refused here."""
    if not isinstance(value, str) or len(value) > 500:
        check.bad(path, "must be a string of at most 500 characters")
        return ""
    if not _REFERENCE.fullmatch(value):
        check.bad(
            path,
            "must be a reference: env:NAME, file:/path or a secret manager's URI (kms://...),"
            " never the secret",
        )
    elif ":-" in value:
        check.bad(path, "must not carry a default value: the document holds no secrets")
    return value


def _regions(check: Checker, value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        check.bad(path, f"must be a list of region names, got {type(value).__name__}")
        return ()
    if len(value) > MAX_KEYS:
        check.bad(path, f"at most {MAX_KEYS} regions")
    regions = tuple(check.identifier(r, f"{path}[{i}]") for i, r in enumerate(value))
    if len(set(regions)) != len(regions):
        check.bad(path, "lists a region twice")
    return regions


def _limits(check: Checker, value: Any, path: str, regions: tuple[str, ...]) -> AccountLimits:
    body = check.fields(value, path, _LIMITS)
    counts: dict[str, int | None] = dict.fromkeys(_COUNTS)
    for name, hi in _COUNTS.items():
        if name in body:
            counts[name] = check.integer(body[name], join_path(path, name), 1, hi)
    per_key: dict[str, Mapping[str, int]] = {}
    for name in _PER_KEY:
        where = join_path(path, name)
        raw = check.fields(body.get(name, {}), where, None)
        if len(raw) > MAX_KEYS:
            check.bad(where, f"at most {MAX_KEYS} entries, got {len(raw)}")
        out: dict[str, int] = {}
        for key, slots in raw.items():
            at = join_path(where, key)
            if not _known_key(check, name, key, at, regions):
                continue
            out[key] = check.integer(slots, at, 1, MAX_SLOTS)
        per_key[name] = MappingProxyType(out)
    return AccountLimits(
        max_concurrency=counts["max_concurrency"],
        model_concurrency=per_key["model_concurrency"],
        modality_concurrency=per_key["modality_concurrency"],
        region_concurrency=per_key["region_concurrency"],
        submits_per_minute=counts["submits_per_minute"],
        generations_per_day=counts["generations_per_day"],
        spend_per_month_micros=counts["spend_per_month_micros"],
    )


def _known_key(check: Checker, kind: str, key: str, at: str, regions: tuple[str, ...]) -> bool:
    if kind == "model_concurrency" and not MODEL_NAME_RE.fullmatch(key):
        check.bad(at, f"model id must match {MODEL_NAME_RE.pattern}")
        return False
    if kind == "modality_concurrency" and key not in _MODES:
        check.bad(at, f"unknown modality (known: {', '.join(sorted(_MODES))})")
        return False
    if kind == "region_concurrency":
        if not IDENTIFIER_RE.fullmatch(key):
            check.bad(at, f"region must match {IDENTIFIER_RE.pattern}")
            return False
        if regions and key not in regions:
            check.bad(at, f"region {key} is not in the account's regions")
            return False
    return True


# Before any publication: no account listed, so every account keeps today's behaviour.
BUILTIN_DOCUMENT = """\
# Built in: in use until an accounts document is published (vidroute accounts publish FILE).
version: accounts-builtin
description: every account enabled in every region, no limits beyond the capability caps
accounts: {}
"""
BUILTIN = parse_accounts_document(BUILTIN_DOCUMENT)


def ensure_publishable(accounts: Accounts) -> None:
    """A published document may not take the built-in one's version name."""
    if accounts.version == BUILTIN_VERSION:
        raise AccountsDocumentError(
            [FieldViolation("version", f"{BUILTIN_VERSION!r} names the built-in configuration")]
        )
