"""What a capability release changes and whether it breaks service (design 9.25.5); pure.

`diff` compares the catalog a release would leave against the one in effect: per model on an
account, ADDED / CHANGED (which capability fields, which price) / UNCHANGED / REMOVED (only a
rollback to a catalog without the model removes one). `breaking` names the models that serve
today and would not afterwards: retired (``status: sunset``), removed, or with a sample that
no longer compiles. Both read `Entry`s, the catalog's rows and a release's rows alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.domain.price_floor import price_flags

ADDED, CHANGED, UNCHANGED, REMOVED = "ADDED", "CHANGED", "UNCHANGED", "REMOVED"
RETIRED_LIFECYCLES = frozenset({"sunset"})
Key = tuple[str, str, str]  # provider, account, model


@dataclass(frozen=True, slots=True)
class Entry:
    """One model on one account as a catalog holds it: its canonical document and price."""

    provider: str
    account: str
    model: str
    capability_version: str
    lifecycle: str
    document: Mapping[str, Any]  # canonical (as Describe carries it), price included
    price_version: str
    price_micros: int | None
    #: The entry as it was published, when known: a file's entry keeps the unit rate and the
    #: per-generation units Describe drops (`canonical_document`), which the price floor needs
    #: (`controlplane.domain.price_floor`). None: read the price floor off `document`.
    published: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def key(self) -> Key:
        return (self.provider, self.account, self.model)

    @property
    def serves(self) -> bool:
        return self.lifecycle not in RETIRED_LIFECYCLES


@dataclass(frozen=True, slots=True)
class ModelChange:
    """What a release does to one model on one account."""

    provider: str
    account: str
    model: str
    kind: str  # ADDED, CHANGED, UNCHANGED or REMOVED
    fields: tuple[str, ...] = ()  # the capability fields that changed (dotted paths)
    old_capability_version: str = ""
    new_capability_version: str = ""
    old_price_version: str = ""
    new_price_version: str = ""
    old_price_micros: int | None = None
    new_price_micros: int | None = None
    #: Durations whose estimate is below a delivery's expected provider cost under the new
    #: entry (`controlplane.domain.price_floor`): flagged, not refused.
    price_flags: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.model}@{self.account}"

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "account": self.account,
            "model": self.model,
            "kind": self.kind,
            "fields": list(self.fields),
            "old_capability_version": self.old_capability_version,
            "new_capability_version": self.new_capability_version,
            "old_price_version": self.old_price_version,
            "new_price_version": self.new_price_version,
            "old_price_micros": self.old_price_micros,
            "new_price_micros": self.new_price_micros,
            "price_flags": list(self.price_flags),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ModelChange:
        return cls(
            **{
                **raw,
                "fields": tuple(raw.get("fields", ())),
                "price_flags": tuple(raw.get("price_flags", ())),
            }
        )


def release_version(text: str) -> str:
    """The name of a release published without one: its text's digest, so publishing the same
    text again names the same release (a retry)."""
    return "cap-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _paths(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_paths(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[str, ...]:
    """The dotted paths whose values differ (a list compares whole)."""
    a, b = _paths(old), _paths(new)
    return tuple(sorted(p for p in a.keys() | b.keys() if a.get(p) != b.get(p)))


def diff(
    current: Iterable[Entry], after: Iterable[Entry], *, complete: bool = False
) -> list[ModelChange]:
    """Per model of `after` (and, when `after` is a `complete` catalog, per model of `current`
    it lacks) what changes, in key order."""
    before = {e.key: e for e in current}
    later = {e.key: e for e in after}
    keys = sorted(later.keys() | (before.keys() if complete else set()))
    out = []
    for key in keys:
        old, new = before.get(key), later.get(key)
        if new is None:
            assert old is not None
            out.append(
                ModelChange(
                    *key,
                    REMOVED,
                    old_capability_version=old.capability_version,
                    old_price_version=old.price_version,
                    old_price_micros=old.price_micros,
                )
            )
            continue
        fields = () if old is None else changed_fields(old.document, new.document)
        same = old is not None and not fields and old.price_version == new.price_version
        out.append(
            ModelChange(
                *key,
                ADDED if old is None else UNCHANGED if same else CHANGED,
                fields,
                "" if old is None else old.capability_version,
                new.capability_version,
                "" if old is None else old.price_version,
                new.price_version,
                None if old is None else old.price_micros,
                new.price_micros,
                price_flags(new.document if new.published is None else new.published),
            )
        )
    return out


def breaking(
    current: Iterable[Entry],
    after: Mapping[Key, Entry | None],
    failures: Mapping[Key, Sequence[str]],
) -> list[str]:
    """The models serving in `current` that `after` would leave unservable, each with why:
    `after` maps a touched model to its new entry (None: removed); `failures` are the failed
    samples of the new entries."""
    out = []
    for old in current:
        if not old.serves or old.key not in after:
            continue
        name = f"{old.provider}/{old.model}@{old.account}"
        new = after[old.key]
        if new is None:
            out.append(f"{name}: removed from the catalog")
        elif not new.serves:
            out.append(f"{name}: retired (status {new.lifecycle})")
        elif failures.get(old.key):
            out.append(f"{name}: sample compile fails ({'; '.join(failures[old.key])})")
    return sorted(out)
