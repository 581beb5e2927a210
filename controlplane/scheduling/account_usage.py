"""Each provider account's concurrency limits against its current use (design 9.11), for the
operators' surfaces: `AccountService.GetAccountUsage`, ``vidroute accounts usage``, the console's
accounts page and the per-account gauges.

The dimensions are the ones the dispatcher leases (`gather.candidate_dimensions`, for every
modality the account's document limits) over the catalog's candidates; the use is the lease
store's counter of each. An account's total that the document does not set is the largest its
candidates ask for (as the lease rebuild reads it). The rate and budget windows the document
sets follow as ``window:<name>`` rows (`scheduling.windows`): their limit and the store's use.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.domain.accounts import AccountLimits
from controlplane.domain.routing.candidates import Candidate
from controlplane.leases.base import LeaseError, LeaseStore
from controlplane.leases.windows import DAY, MINUTE, MONTH
from controlplane.scheduling.gather import candidate_dimensions
from controlplane.scheduling.windows import LimitsFor

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AccountUsage:
    """One lease dimension of one account: its limit and the slots held in it now."""

    provider: str
    account: str
    # "account", "model:<id>", "modality:<mode>", "region:<region>", "window:<name>"
    dimension: str
    limit: int
    used: int
    configured: bool  # the accounts document sets this limit (else a capability or default)


async def account_usage(
    leases: LeaseStore,
    candidates: Sequence[Candidate],
    default_concurrency: int,
    limits_for: LimitsFor,
) -> list[AccountUsage]:
    """Every (account, dimension) of the candidates, sorted; a counter the store cannot read
    is reported as -1 used (unknown), never as free."""
    found: dict[tuple[str, str, str], tuple[int, bool]] = {}
    for c in candidates:
        limits = limits_for(c.provider, c.account)
        for mode in ("", *limits.modality_concurrency):
            for d in candidate_dimensions(c, default_concurrency, limits_for, mode):
                ref = (c.provider, c.account, d.key)
                if _configured(d.key, limits, c):
                    found[ref] = (d.capacity, True)
                else:  # a capability's or the default: the largest any candidate asks for
                    found[ref] = (max(found.get(ref, (0, False))[0], d.capacity), False)
    out = []
    for (provider, account, key), (limit, configured) in sorted(found.items()):
        try:
            used = await leases.used(f"{provider}:{account}", key)
        except LeaseError as exc:
            log.warning("usage of %s:%s %s unknown: %r", provider, account, key, exc)
            used = -1
        out.append(AccountUsage(provider, account, key, limit, used, configured))
    accounts = sorted({(c.provider, c.account) for c in candidates})
    for provider, account in accounts:
        out.extend(await _windows(leases, provider, account, limits_for(provider, account)))
    return out


async def _windows(
    leases: LeaseStore, provider: str, account: str, limits: AccountLimits
) -> list[AccountUsage]:
    """The account's configured windows with their use now (-1: the store was unreadable)."""
    configured = {
        MINUTE: limits.submits_per_minute,
        DAY: limits.generations_per_day,
        MONTH: limits.spend_per_month_micros,
    }
    if all(v is None for v in configured.values()):
        return []
    try:
        use = {w.window: w.used for w in await leases.window_usage(f"{provider}:{account}")}
    except LeaseError as exc:
        log.warning("window use of %s:%s unknown: %r", provider, account, exc)
        use = dict.fromkeys(configured, -1)
    return [
        AccountUsage(provider, account, f"window:{name}", limit, use.get(name, 0), True)
        for name, limit in configured.items()
        if limit is not None
    ]


def _configured(key: str, limits: AccountLimits, c: Candidate) -> bool:
    """Whether the accounts document sets the dimension `key` (else a capability, a default)."""
    kind, _, name = key.partition(":")
    if kind == "account":
        return limits.max_concurrency is not None
    if kind == "model":
        return name in limits.model_concurrency
    if kind == "modality":
        return name in limits.modality_concurrency
    return name in limits.region_concurrency
