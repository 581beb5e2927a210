"""Unit cost of successful delivery (design 9.23), from provider usage ledger facts. Pure.

    unit cost = (generation + retry + fetch + post-processing + platform loss) / successes

The provider usage ledger (`provider_usage_ledger`) holds, per attempt (one provider job each),
EXPECTED (the provider accepted), ACTUAL (the job or the usage export said what it cost) and
PLATFORM_LOSS (provider cost no tenant is charged) entries. The rules that turn one attempt's
entries into the formula's terms are in one place (`job_terms`); the SQL aggregate in
`controlplane.persistence.cost_reads` must agree with them, and a test checks it does:

- the attempt's cost is its ACTUAL entries when it has any (the provider said so, 0 included),
  else its EXPECTED entries (an accepted job is assumed billed until the provider says
  otherwise), else its PLATFORM_LOSS entries (an unknown submit that may have been billed);
- generation: the attempt delivered the task's output (the task SUCCEEDED with it adopted);
- retry: the attempt ended FAILED or CANCELLED: the price of trying again. The credit ledger
  does not charge it to the tenant, so the usage ledger books it as PLATFORM_LOSS too; here it
  is retry, so each micro is counted in exactly one term;
- platform loss: any other attempt with a PLATFORM_LOSS entry: a second job whose result was not
  adopted (a duplicate), an ABANDONED or SUBMIT_UNKNOWN submit the provider may have billed;
- a loss the bill confirmed (a ``confirmed-loss:`` PLATFORM_LOSS entry, booked from a
  reconciliation row: the provider billed the attempt more than a correct bill charges, e.g.
  its job twice, or a failed job it should have refunded) is money beyond the attempt's cost,
  so it is platform loss on top of whichever term the attempt's own cost is (9.16.4, 9.23.4:
  "the extra provider cost goes to platform loss"); the other PLATFORM_LOSS entries are
  settlement's view of the attempt's own cost and never add to it;
- anything else is still in flight and waits for its outcome (its row shows, with 0);
- fetch and post-processing: no provider bills downloads and the platform runs no paid
  post-processing, so both are 0 today; the field is kept so the formula stays whole.

Integers only. The per-success figure is rounded half up to a whole micro (`per_success`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

RETRY_STATES = frozenset({"FAILED", "CANCELLED"})


@dataclass(frozen=True, slots=True)
class JobUsage:
    """One attempt's usage ledger entries summed by kind (None: no entry of that kind)."""

    provider: str
    model: str
    currency: str
    delivered: bool
    attempt_state: str
    expected_micros: int | None = None
    actual_micros: int | None = None
    #: Settlement's PLATFORM_LOSS entries (``loss:``, ``underpriced:``): the attempt's own cost.
    platform_loss_micros: int | None = None
    #: Bill-confirmed losses (``confirmed-loss:`` PLATFORM_LOSS entries): beyond its cost.
    confirmed_loss_micros: int | None = None


@dataclass(frozen=True, slots=True)
class JobTerms:
    """One job's contribution to the formula."""

    generation_micros: int
    retry_micros: int
    platform_loss_micros: int
    success: bool


@dataclass(frozen=True, slots=True)
class UnitCost:
    """One provider/model/currency row of the unit-cost table."""

    provider: str
    model: str
    currency: str
    successes: int
    generation_micros: int
    retry_micros: int
    fetch_micros: int
    platform_loss_micros: int

    @property
    def total_micros(self) -> int:
        return (
            self.generation_micros
            + self.retry_micros
            + self.fetch_micros
            + self.platform_loss_micros
        )

    @property
    def cost_per_success_micros(self) -> int:
        return per_success(self.total_micros, self.successes)


def per_success(total_micros: int, successes: int) -> int:
    """`total_micros / successes` rounded half up; 0 without a success (the total still shows)."""
    if successes <= 0:
        return 0
    return (2 * total_micros + successes) // (2 * successes)


def observed_cost(actual_micros: int | None, estimated_micros: int) -> int:
    """What a finished job cost, as the routing health windows count it: the provider's figure
    when it gave one (0 included), else the estimate, as the usage ledger assumes an accepted
    job billed until the provider says otherwise (never 0 for a provider that reports none)."""
    return estimated_micros if actual_micros is None else actual_micros


def job_terms(job: JobUsage) -> JobTerms | None:
    """The rules of the module docstring for one attempt; None while it is in flight."""
    if job.actual_micros is not None:
        cost = job.actual_micros
    elif job.expected_micros is not None:
        cost = job.expected_micros
    else:
        cost = job.platform_loss_micros or 0
    cost = max(0, cost)
    extra = job.confirmed_loss_micros or 0
    if job.delivered:
        return JobTerms(cost, 0, extra, True)
    if job.attempt_state in RETRY_STATES:
        return JobTerms(0, cost, extra, False)
    if job.platform_loss_micros is not None or job.confirmed_loss_micros is not None:
        return JobTerms(0, 0, cost + extra, False)
    return None


@dataclass
class _Sums:
    successes: int = 0
    generation: int = 0
    retry: int = 0
    fetch: int = 0
    loss: int = 0


def add_up(
    rows: Iterable[tuple[str, str, str, int, int, int, int, int]],
) -> list[UnitCost]:
    """Partial sums ``(provider, model, currency, successes, generation, retry, fetch, loss)``
    (several rows per key allowed) -> one `UnitCost` per key, sorted by the key."""
    sums: dict[tuple[str, str, str], _Sums] = {}
    for provider, model, currency, successes, generation, retry, fetch, loss in rows:
        s = sums.setdefault((provider, model, currency), _Sums())
        s.successes += successes
        s.generation += generation
        s.retry += retry
        s.fetch += fetch
        s.loss += loss
    return [
        UnitCost(p, m, c, s.successes, s.generation, s.retry, s.fetch, s.loss)
        for (p, m, c), s in sorted(sums.items())
    ]


def unit_costs(jobs: Iterable[JobUsage]) -> list[UnitCost]:
    """The unit-cost table of a set of jobs, one row per provider/model/currency."""
    partial = []
    for job in jobs:
        t = job_terms(job) or JobTerms(0, 0, 0, False)  # in flight: a row, nothing counted
        partial.append(
            (
                job.provider,
                job.model,
                job.currency,
                int(t.success),
                t.generation_micros,
                t.retry_micros,
                0,
                t.platform_loss_micros,
            )
        )
    return add_up(partial)


def gauge_figures(rows: Iterable[UnitCost]) -> dict[tuple[str, str], tuple[int, int]]:
    """``(provider, model) -> (cost per success, retry cost)`` micros for the 9.24 gauges, whose
    labels carry no currency: a model priced in two currencies reports the row with the most
    successes (then the larger total), not a sum across currencies."""
    best: dict[tuple[str, str], UnitCost] = {}
    for row in rows:
        key = (row.provider, row.model)
        held = best.get(key)
        if held is None or (row.successes, row.total_micros) > (held.successes, held.total_micros):
            best[key] = row
    return {k: (r.cost_per_success_micros, r.retry_micros) for k, r in sorted(best.items())}
