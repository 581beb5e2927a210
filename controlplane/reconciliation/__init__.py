"""Daily reconciliation of provider bills (design 9.23.3, 9.23.4, 9.17.5).

`run_day` reads each configured provider account's bill for a UTC day: the latest bill file
imported for that day (`controlplane.reconciliation.bills`: Google's Cloud Billing export, the
only bill Veo has), else its usage through the adapter sidecar that serves it (matched by the
accounts its Describe names, whatever the adapter's key; an account no reachable adapter serves
is reported, never taken for an empty bill; no adapter or no account at all raises
`NothingToReconcile`) via ListUsage, stores it raw and immutable,
normalizes it, matches it against the local attempts and provider usage ledger
(`controlplane.domain.reconciliation`, pure, under each price version's billing rules) and
stores one run per (day, provider, account) with its discrepancy rows; the tenant side (a task
settled twice on the credit ledger) is the run of provider ``credit_ledger``. `read_report`
reads a day's current runs back (for the RPC and the CLI), `delta_by_provider` gives the
billed-minus-expected micros of the latest day per provider (for
``provider_reconciliation_delta_micros{provider}``) and `discrepancy_counts` the rows written
per (provider, kind) (for ``provider_reconciliation_discrepancies_total``).

Idempotency: a re-run of a day with the same import and the same local facts finds the same
result digest and writes nothing (same run id, same rows). A re-run whose import or local facts
changed (a late usage line, a job that ended since) writes a new run that supersedes the old one
(``reconciliation_runs.superseded_by``), so the change is visible and the old report stays
readable; the report always shows the current run.
"""

from controlplane.reconciliation.service import (
    AccountError,
    DiscrepancyCounter,
    NothingToReconcile,
    ReconciliationReport,
    RunReport,
    UsageSource,
    delta_by_provider,
    read_report,
    run_day,
)

__all__ = [
    "AccountError",
    "DiscrepancyCounter",
    "NothingToReconcile",
    "ReconciliationReport",
    "RunReport",
    "UsageSource",
    "delta_by_provider",
    "read_report",
    "run_day",
]
