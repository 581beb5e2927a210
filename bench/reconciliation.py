"""Reconciliation matcher benchmark (not a test): ``python -m bench.reconciliation [--records N]``.

One provider account's day: `--records` usage lines against as many attempts (5 models, one in
ten an ABANDONED unknown submit whose line carries an id the platform never learned, so rule 4,
account + model + window + amount, must find it; the rest named by job id). Wall clock of
`controlplane.domain.reconciliation.reconcile`, the pure part of a run (the SQL around it is one
import insert and one attempts query per account), median of `--rounds`, on whatever load the
machine carries.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

from controlplane.domain.reconciliation import Billed, Expectation, reconcile

T0 = datetime(2026, 11, 30, 1, tzinfo=UTC)


def day(n: int) -> tuple[list[Billed], list[Expectation]]:
    exps = [
        Expectation(
            attempt_id=i,
            task_id=i,
            provider="google",
            account="main",
            model=f"m{i % 5}",
            state="ABANDONED" if i % 10 == 0 else "SUCCEEDED",
            submitted_at=T0 + timedelta(seconds=i % 80_000),
            expected_micros=1_000_000 + i,
            currency="USD",
            provider_job_id="" if i % 10 == 0 else f"op{i}",
            client_request_key=f"k{i}",
        )
        for i in range(n)
    ]
    records = [
        Billed(
            record_id=i,
            provider="google",
            account="main",
            model=f"m{i % 5}",
            usage_time=T0 + timedelta(seconds=i % 80_000 + 60),
            milliunits=4000,
            unit="billed_seconds",
            cost_micros=1_000_000 + i,
            currency="USD",
            provider_job_id=f"lost{i}" if i % 10 == 0 else f"op{i}",
        )
        for i in range(n)
    ]
    return records, exps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    records, exps = day(args.records)
    times = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        outcome = reconcile(records, exps)
        times.append(time.perf_counter() - start)
    rows = len(outcome.discrepancies)
    print(
        f"reconcile: {args.records} records x {len(exps)} attempts: median "
        f"{statistics.median(times):.2f} s over {args.rounds} rounds; {rows} rows "
        f"(the {args.records // 10} unknown submits)"
    )


if __name__ == "__main__":
    main()
