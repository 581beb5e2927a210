"""The provider usage ledger as the execution engine writes it (design 9.23.1).

* `record_expected`: a provider accepted the attempt's job: its estimated cost, priced by the
  attempt's price version, with the native units it stands for (``expected:<attempt_id>``).
* `record_actual`: the job ended and its cost is known (`controlplane.domain.money.actual_cost`):
  the amount, and the provider-native units it stands for under the conversion rate published
  with the attempt's price version (``actual:<attempt_id>``, with ``conversion_rate_version``).

Both are written in the transaction of the move that justifies them, once per key.
"""

from __future__ import annotations

from controlplane.domain.money import UsageKind, units_for
from controlplane.persistence.ledger import NewUsage
from controlplane.persistence.ports import UnitOfWork
from controlplane.persistence.records import AccountInfo, AttemptRecord

__all__ = ["record_actual", "record_expected"]


async def record_expected(
    u: UnitOfWork, attempt: AttemptRecord, provider_job_id: str, account: AccountInfo
) -> None:
    """The EXPECTED entry of an accepted attempt (`account`: the attempt's), once."""
    amount = attempt.estimated_cost_micros
    rate = await u.unit_rate(account.provider, attempt.price_version)
    units = None if rate is None else units_for(amount, rate.micros_per_unit, rate.unit_divisor)
    await u.record_usage(
        NewUsage(
            attempt_id=attempt.id,
            task_id=attempt.task_id,
            provider=account.provider,
            provider_account_id=attempt.provider_account_id,
            model=attempt.provider_model,
            kind=UsageKind.EXPECTED,
            amount_micros=amount,
            currency=attempt.currency,
            price_version=attempt.price_version,
            idempotency_key=f"expected:{attempt.id}",
            provider_job_id=provider_job_id or None,
            provider_units=units,
            provider_unit_name=rate.unit_name if rate is not None and units is not None else None,
            conversion_rate_version=rate.rate_version if rate is not None else None,
            evidence={"client_request_key": attempt.client_request_key},
        )
    )


async def record_actual(
    u: UnitOfWork,
    attempt: AttemptRecord,
    provider_job_id: str,
    provider: str,
    amount_micros: int,
    *,
    raw_status: str = "",
) -> None:
    """The ACTUAL entry of an ended job, once."""
    rate = await u.unit_rate(provider, attempt.price_version)
    units = (
        None if rate is None else units_for(amount_micros, rate.micros_per_unit, rate.unit_divisor)
    )
    await u.record_usage(
        NewUsage(
            attempt_id=attempt.id,
            task_id=attempt.task_id,
            provider=provider,
            provider_account_id=attempt.provider_account_id,
            model=attempt.provider_model,
            kind=UsageKind.ACTUAL,
            amount_micros=amount_micros,
            currency=attempt.currency,
            price_version=attempt.price_version,
            idempotency_key=f"actual:{attempt.id}",
            provider_job_id=provider_job_id or None,
            provider_units=units,
            provider_unit_name=rate.unit_name if rate is not None and units is not None else None,
            conversion_rate_version=rate.rate_version if rate is not None else None,
            evidence={"raw_status": raw_status, "source": "job"},
        )
    )
