"""Writing capability releases, transport-neutral (design 9.19.2, 9.25.5): apply a checked
release now, at a scheduled time, or keep it staged; activate a staged one; roll back to any
earlier release; read the history.

One unit per activation: the catalog rows (`SqlUnitOfWork.publish` with ``reopen``, so the
release's versions become the current ones, an earlier one re-opened as a new interval), the
release row and its activation (who, when, from when, what it replaced per model, the force
reason) land together, serialised with every other release (`capability_releases.lock`). A
release's rows carry its ``effective_from``: a scheduled one takes effect by itself when its
time comes, since the catalog reads the versions effective *now*. While one is scheduled, no
other activation may be written (FAILED_PRECONDITION naming it): the catalog's intervals
would no longer say which came first.

A rollback to release R restores, per model, the versions in effect just after R took effect
(read from the intervals, which are never rewritten), through the same checks as a publish: a
serving model the target catalog lacks would be removed, and is refused unless forced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane.capabilities.publish import PRICE_UNIT, Publication, canonical_document
from controlplane.capabilities.release import Key, ModelChange
from controlplane.persistence.capability_releases import ActivationRow, ReleaseRow
from controlplane.persistence.catalog import (
    AccountSpec,
    CapabilityRecord,
    CapabilityVersion,
    CatalogConflict,
    PriceVersion,
    PublishCounts,
)
from controlplane.persistence.database import Database
from controlplane.persistence.unit import SqlUnitOfWork
from vidroute_core.exceptions import InvalidSpec, NotFound, PreconditionFailed
from vidroute_core.validation import FieldViolation

PUBLISHED, SCHEDULED, ACTIVATED, ROLLED_BACK = "PUBLISHED", "SCHEDULED", "ACTIVATED", "ROLLED_BACK"


class DryRun(Exception):
    """Rolls a dry run's unit back, carrying its counts out."""

    def __init__(self, counts: PublishCounts) -> None:
        super().__init__("dry run")
        self.counts = counts


@dataclass(frozen=True, slots=True)
class Activation:
    """One activation to write: the release, what it replaces, who, when, why."""

    version: str
    action: str
    actor: str
    now: datetime
    effective_from: datetime
    changes: Sequence[ModelChange]
    reason: str | None = None


def replaced(changes: Sequence[ModelChange]) -> list[dict[str, Any]]:
    """Per model that changes, the versions it had and gets (the audit's "what it replaced")."""
    return [c.to_json() for c in changes if c.kind != "UNCHANGED"]


async def _ensure_nothing_pending(u: SqlUnitOfWork) -> None:
    waiting = await u.pending_capability_release()
    if waiting is not None:
        raise PreconditionFailed(
            f"release {waiting.version!r} is scheduled for {waiting.effective_from.isoformat()};"
            " no other release may be activated before it takes effect",
            {},
            reason="CAPABILITY_RELEASE_SCHEDULED",
            labels={"version": waiting.version},
        )


async def write_activation(
    db: Database,
    activation: Activation,
    plan: Publication,
    *,
    release: ReleaseRow | None = None,
    staged_version: str = "",
    removed: Sequence[tuple[int, str]] = (),
    dry_run: bool = False,
) -> PublishCounts:
    """Write one activation in one unit (module docstring): the catalog rows of `plan`, the
    new `release` row or the `staged_version` marked applied, the closed `removed` models
    (account id, model) and the activation row. `dry_run` rolls the unit back."""
    a = activation
    try:
        async with db.unit(a.now) as u:
            await u.lock_capability_releases()
            await _ensure_nothing_pending(u)
            previous = await u.capability_release_active_at(a.effective_from)
            counts = await u.publish(
                plan.accounts,
                plan.capabilities,
                plan.prices,
                reopen=True,
                canon=canonical_document,
            )
            await u.put_unit_rates(plan.unit_rates)
            for account_id, model in removed:
                await u.close_versions(account_id, model, a.effective_from)
            if release is not None:
                await u.insert_capability_release(release)
            if staged_version:
                await u.mark_capability_release_applied(staged_version, a.effective_from, a.reason)
            await u.record_capability_activation(
                ActivationRow(
                    a.version,
                    None if previous is None else previous.version,
                    a.action,
                    a.actor,
                    a.now,
                    a.effective_from,
                    a.reason,
                    tuple(replaced(a.changes)),
                ),
            )
            if dry_run:
                raise DryRun(counts)
            return counts
    except CatalogConflict as exc:
        raise InvalidSpec([FieldViolation("document", str(exc))]) from exc
    except DryRun as rolled_back:
        return rolled_back.counts


async def stage(db: Database, release: ReleaseRow) -> None:
    """Keep a checked release without writing a catalog row."""
    async with db.unit(release.published_at) as u:
        await u.lock_capability_releases()
        await u.insert_capability_release(release)


@dataclass(frozen=True, slots=True)
class RollbackPlan:
    """The rows that restore an earlier catalog, and the serving models it would drop."""

    plan: Publication
    removed: tuple[tuple[int, str], ...]
    removed_keys: tuple[Key, ...]


def _same(a: CapabilityRecord, b: CapabilityRecord) -> bool:
    return (a.capability_version, a.price_version, a.price_micros_per_unit) == (
        b.capability_version,
        b.price_version,
        b.price_micros_per_unit,
    ) and canonical_document(a.document) == canonical_document(b.document)


def rollback_plan(
    target: Sequence[CapabilityRecord], current: Sequence[CapabilityRecord], now: datetime
) -> RollbackPlan:
    """Re-open, from `now`, every model's versions of `target` that differ from `current`;
    the models of `current` that `target` lacks are removed."""

    def key(r: CapabilityRecord) -> tuple[int, str]:
        return (r.account.id, r.model)

    live = {key(r): r for r in current}
    wanted = {key(r): r for r in target}
    accounts: dict[int, AccountSpec] = {}
    caps, prices = [], []
    for k, r in wanted.items():
        if k in live and _same(live[k], r):
            continue
        a = r.account
        accounts[a.id] = AccountSpec(
            a.provider, a.account_name, a.region, a.credential_ref, a.status, a.config
        )
        caps.append(
            CapabilityVersion(
                a.provider,
                a.account_name,
                a.region,
                r.model,
                r.model_version,
                r.capability_version,
                r.lifecycle,
                r.document,
                now,
            )
        )
        if r.price_version is not None and r.price_micros_per_unit is not None:
            prices.append(
                PriceVersion(
                    a.provider,
                    a.account_name,
                    a.region,
                    r.model,
                    r.price_version,
                    PRICE_UNIT,
                    r.price_micros_per_unit,
                    r.currency or "USD",
                    now,
                )
            )
    gone = [live[k] for k in live.keys() - wanted.keys()]
    return RollbackPlan(
        Publication(tuple(accounts.values()), tuple(caps), tuple(prices)),
        tuple(key(r) for r in gone),
        tuple((r.account.provider, r.account.account_name, r.model) for r in gone),
    )


async def rollback_target(
    db: Database, version: str, now: datetime
) -> tuple[ActivationRow | None, ReleaseRow, datetime]:
    """The activation in effect now, the release to return to (`version`, else the one the
    current activation replaced) and the instant whose catalog it restores."""
    async with db.reads() as reads:
        current = await reads.release_active_at(now)
        name = version or (current.previous_version if current else None)
        if not name:
            raise PreconditionFailed(
                "no earlier capability release to roll back to",
                {"activations": 0 if current is None else 1},
                reason="NO_EARLIER_CAPABILITY_RELEASE",
            )
        target = await reads.release(name)
        if target is None:
            raise NotFound("capability release", name)
        took_effect = [
            a.effective_from
            for a in await reads.release_activations()
            if a.version == name and a.effective_from <= now
        ]
    if not took_effect:
        raise PreconditionFailed(
            f"release {name!r} never took effect ({target.state}); activate it instead",
            {},
            reason="CAPABILITY_RELEASE_NEVER_ACTIVE",
            labels={"version": name},
        )
    return current, target, max(took_effect)
