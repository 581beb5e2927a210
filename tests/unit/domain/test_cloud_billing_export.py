"""Google's Cloud Billing export read as Veo usage records (issue 23: a bill for every provider)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import pytest

from controlplane.domain.reconciliation_cloud_billing import (
    ATTEMPT_LABEL,
    ExportError,
    SkuMap,
    parse_export,
    summarize,
    usage_records,
)

DAY = date(2026, 12, 5)
GEMINI = "Generative Language API"


def nested(
    sku: str,
    hour: int,
    seconds: str,
    cost: str,
    *,
    service: str = GEMINI,
    labels: list[dict[str, str]] | None = None,
    cost_type: str = "regular",
) -> dict[str, object]:
    """One row as BigQuery's JSON export writes it: nested records, numbers as JSON numbers."""
    return {
        "billing_account_id": "01ABCD-234567-89EF01",
        "service": {"id": "AEE7-CE0B-1234", "description": service},
        "sku": {"id": "1A2B-3C4D-5E6F", "description": sku},
        "usage_start_time": f"2026-12-05 {hour:02d}:00:00 UTC",
        "usage_end_time": f"2026-12-05 {hour + 1:02d}:00:00 UTC",
        "project": {"id": "vidroute-prod", "number": "1234567890"},
        "labels": labels or [],
        "cost": cost,
        "currency": "USD",
        "currency_conversion_rate": 1,
        "usage": {
            "amount": seconds,
            "unit": "seconds",
            "amount_in_pricing_units": seconds,
            "pricing_unit": "second",
        },
        "credits": [],
        "invoice": {"month": "202612"},
        "cost_type": cost_type,
    }


def ndjson(*rows: dict[str, object]) -> str:
    # Numbers as BigQuery writes them: bare JSON numbers, never through a Python float.
    return "\n".join(
        json.dumps(r).replace('"cost": "', '"cost": ').replace('", "currency"', ', "currency"')
        for r in rows
    )


def test_unlabelled_gemini_rows_are_model_day_aggregates_in_exact_micros() -> None:
    """Gemini API rows carry no label: each row is an aggregate of its SKU's model; a cost with
    more than six decimals is rounded half-even to the micro, seconds become thousandths."""
    text = ndjson(
        nested("Veo 3.1 video generation with audio", 10, "8", "3.2000000000000002"),
        nested("Veo 3.1 Fast video generation", 11, "4", "0.6"),
        nested("Gemini 2.5 Flash input tokens", 11, "1000", "0.0003"),
    )
    fmt, rows = parse_export(text)
    assert fmt == "ndjson"
    records = usage_records(rows, DAY, SkuMap())
    assert [
        (r.model, r.provider_milliunits, r.cost_micros, r.client_request_key) for r in records
    ] == [
        ("veo-3.1-generate-preview", 8000, 3_200_000, ""),
        ("veo-3.1-fast-generate-preview", 4000, 600_000, ""),
    ]
    assert all(r.provider_unit == "billed_seconds" and r.provider_job_id == "" for r in records)
    summary = summarize(rows, SkuMap())
    assert summary.others == {"Gemini 2.5 Flash input tokens": 1}
    assert summary.cost_micros == 3_800_000


def test_labelled_rows_are_one_record_per_attempt_across_hours() -> None:
    """A Vertex job straddling an hour is two rows of Google's with one label: one record, its
    seconds and cost summed, keyed by the attempt's client request key."""
    label = [{"key": ATTEMPT_LABEL, "value": "41-1-0a1b2c3d4e5f"}, {"key": "team", "value": "x"}]
    text = ndjson(
        nested("Veo 3.1 Video Generation", 10, "3", "1.2", service="Vertex AI", labels=label),
        nested("Veo 3.1 Video Generation", 11, "5", "2.0", service="Vertex AI", labels=label),
    )
    _, rows = parse_export(text)
    [record] = usage_records(rows, DAY, SkuMap())
    assert record.client_request_key == "41-1-0a1b2c3d4e5f"
    assert (record.model, record.provider_milliunits, record.cost_micros) == (
        "veo-3.1-generate-001",
        8000,
        3_200_000,
    )
    assert record.usage_time == datetime(2026, 12, 5, 10, tzinfo=UTC)


def test_flattened_csv_reads_like_the_json() -> None:
    """A CSV of the flattened columns (labels as TO_JSON_STRING) gives the same records."""
    labels = json.dumps([{"key": ATTEMPT_LABEL, "value": "7-1-abcdefabcdef"}]).replace('"', '""')
    text = (
        "service.description,sku.id,sku.description,usage_start_time,usage_end_time,"
        "usage.amount,usage.unit,cost,currency,labels,cost_type\n"
        f"Vertex AI,X,Veo 3.1 Fast Video Generation,2026-12-05T09:00:00Z,2026-12-05T10:00:00Z,"
        f'4,seconds,0.60,USD,"{labels}",regular\n'
        "Vertex AI,X,Veo 3.1 Fast Video Generation,2026-12-05 09:00:00 UTC,,4,seconds,"
        "0.60,USD,,tax\n"
    )
    fmt, rows = parse_export(text)
    assert fmt == "csv"
    [record] = usage_records(rows, DAY, SkuMap())
    assert (record.client_request_key, record.model, record.cost_micros) == (
        "7-1-abcdefabcdef",
        "veo-3.1-fast-generate-001",
        600_000,
    )
    assert summarize(rows, SkuMap()).not_regular == 1


def test_other_days_and_overrides() -> None:
    """Only the day's rows count; an ``--sku`` override comes before the shipped map."""
    row = nested("Veo Next video", 10, "4", "1")
    other_day = {**row, "usage_start_time": "2026-12-04 23:00:00 UTC"}
    _, rows = parse_export(ndjson(row, other_day))
    assert usage_records(rows, DAY, SkuMap()) == []
    skus = SkuMap.with_overrides([r"veo next=veo-next-001"])
    [record] = usage_records(rows, DAY, skus)
    assert record.model == "veo-next-001"
    assert SkuMap.from_json(skus.to_json()) == skus


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("", "line 1"),
        ('{"sku": {"description": "Veo 3.1"}, "cost": 1, "currency": "USD"}', "usage_start_time"),
        (
            '{"sku": {"description": "Veo 3.1"}, "usage_start_time": "2026-12-05", '
            '"cost": "abc", "currency": "USD"}',
            "cost",
        ),
        ("a,b\n1,2\n", "sku.description"),
        (
            '{"sku": {"description": "Veo"}, "usage_start_time": "2026-12-05", "cost": 1, '
            '"currency": "USD", "labels": "k=v"}',
            "labels",
        ),
    ],
)
def test_an_unreadable_row_names_its_line_and_column(text: str, where: str) -> None:
    """Nothing is half-read: the first bad row raises with where it is."""
    with pytest.raises(ExportError) as caught:
        parse_export(text)
    assert where in str(caught.value)


def test_a_bad_override_is_refused() -> None:
    """``--sku`` without ``=`` or with a broken pattern is an error naming it."""
    for bad in ("veo", "(=m"):
        with pytest.raises(ValueError, match="--sku"):
            SkuMap.with_overrides([bad])
