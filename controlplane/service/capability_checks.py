"""The checks every capability release passes before a row is written (design 9.25.5).

After the schema, constraint and price checks (`capabilities.publish`), a release is compiled
against the live sidecars on every sample of every entry it writes (`SampleCompile`), diffed
against the catalog in effect, and refused when it would leave a model that serves today
unservable, unless forced with a recorded reason:

* a sample that does not compile for a model that does not serve yet (a new model, a typo) is
  a field violation of its entry (INVALID_ARGUMENT, ``document[i]``): the document is wrong;
* a serving model retired, removed, or with a sample that no longer compiles is
  FAILED_PRECONDITION ``SERVING_MODEL_UNSERVABLE`` naming each model and why;
* a replica without sidecars (API only) cannot compile: FAILED_PRECONDITION
  ``SAMPLE_COMPILE_UNAVAILABLE``, forceable like the above.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from controlplane.capabilities.publish import Publication, canonical_document
from controlplane.capabilities.release import Entry, Key, ModelChange, breaking, diff
from controlplane.capabilities.samples import sample_specs
from controlplane.persistence.catalog import CapabilityRecord, CapabilityVersion, PriceVersion
from vidroute_core.capabilities.loader import Capability, parse_entry
from vidroute_core.exceptions import InvalidSpec, PreconditionFailed
from vidroute_core.validation import FieldViolation

#: Per entry, the failed samples (``<sample>: <why>``); raises `Unavailable` on no answer.
SampleCompile = Callable[[Sequence[Capability]], Awaitable[list[list[str]]]]


@dataclass(frozen=True, slots=True)
class Force:
    """An operator's override of the serving check; `reason` is required and recorded."""

    force: bool = False
    reason: str = ""

    def recorded(self) -> str | None:
        return self.reason.strip() if self.force else None


@dataclass(frozen=True, slots=True)
class Checked:
    """A release that passed: what it changes, how many samples compiled, what was forced."""

    changes: tuple[ModelChange, ...]
    samples: int
    forced: tuple[str, ...] = ()  # the breaking reasons the force overrode


def entry_of_record(r: CapabilityRecord) -> Entry:
    return Entry(
        r.account.provider,
        r.account.account_name,
        r.model,
        r.capability_version,
        r.lifecycle,
        canonical_document(r.document),
        r.price_version or "",
        r.price_micros_per_unit,
        r.document,
    )


def entry_of_version(cap: CapabilityVersion, price: PriceVersion | None) -> Entry:
    return Entry(
        cap.provider,
        cap.account_name,
        cap.model,
        cap.capability_version,
        cap.lifecycle,
        canonical_document(cap.document),
        price.price_version if price else "",
        price.price_micros_per_unit if price else None,
        cap.document,
    )


def entries_of(plan: Publication) -> list[Entry]:
    prices = {(p.provider, p.account_name, p.model): p for p in plan.prices}
    return [
        entry_of_version(c, prices.get((c.provider, c.account_name, c.model)))
        for c in plan.capabilities
    ]


def check_force(force: Force) -> None:
    if force.force and not force.reason.strip():
        raise InvalidSpec([FieldViolation("reason", "is required with force (it is recorded)")])


async def check_release(
    current: Sequence[CapabilityRecord],
    writes: Sequence[tuple[int | None, CapabilityVersion, PriceVersion | None]],
    removed: Sequence[Key],
    samples: SampleCompile | None,
    force: Force,
) -> Checked:
    """Sample-compile `writes` (each with the document index that names it, None for a
    rollback's), diff them (and `removed`) against `current`, and refuse what breaks service
    (module docstring)."""
    check_force(force)
    now_entries = [entry_of_record(r) for r in current]
    after = [entry_of_version(c, p) for _, c, p in writes]
    after_by_key: dict[Key, Entry | None] = {e.key: e for e in after}
    after_by_key.update(dict.fromkeys(removed))
    serving = {e.key for e in now_entries if e.serves}
    changes = diff(now_entries, after)
    gone = set(removed)
    changes += [
        c for c in diff(now_entries, [], complete=True) if (c.provider, c.account, c.model) in gone
    ]
    failures: dict[Key, list[str]] = {}
    reasons: list[str] = []
    count = 0
    if samples is None:
        reasons.append("this replica has no adapter sidecars to sample-compile against")
    else:
        caps = [parse_entry(c.document, c.capability_version) for _, c, _ in writes]
        answers = await samples(caps)
        count = sum(len(sample_specs(c)) for c in caps)
        violations = []
        for (index, cap, _), failed in zip(writes, answers, strict=True):
            key = (cap.provider, cap.account_name, cap.model)
            where = "document" if index is None else f"document[{index}]"
            if failed and key not in serving:
                violations.append(
                    FieldViolation(
                        where,
                        f"{cap.provider}/{cap.model}@{cap.account_name}: the sample compile"
                        f" against the live sidecar fails: {'; '.join(failed)}",
                    )
                )
            elif failed:
                failures[key] = [f"{where} {f}" for f in failed]
        if violations:
            raise InvalidSpec(violations)
    broken = breaking(now_entries, after_by_key, failures)
    reasons += broken
    if reasons and not force.force:
        unavailable = samples is None
        raise PreconditionFailed(
            (
                "the release cannot be sample-compiled here"
                if unavailable
                else "the release would leave serving models unservable"
            )
            + ": "
            + "; ".join(reasons)
            + " (publish with force and a reason to override)",
            {"unservable_models": len(broken)},
            reason="SAMPLE_COMPILE_UNAVAILABLE" if unavailable else "SERVING_MODEL_UNSERVABLE",
            labels={"models": "; ".join(reasons)[:1000]},
        )
    return Checked(tuple(changes), count, tuple(reasons))
