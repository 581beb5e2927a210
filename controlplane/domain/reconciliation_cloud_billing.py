"""Google's bill for Veo: rows of a Cloud Billing export file, read as usage records (design
9.23.3 step 1, "the provider's usage API or bill file"; issue 23 "a bill for every provider").

Neither Veo surface has a usage API (provider-apis.md §5): Google's bill is the Cloud Billing
export a finance team takes from BigQuery (the standard usage cost table,
``gcp_billing_export_v1_<BILLING_ACCOUNT_ID>``). `parse_export` reads it in the shapes that
table leaves BigQuery in, with the table's own column names:

* newline-delimited JSON (``bq extract --destination_format NEWLINE_DELIMITED_JSON``, or
  ``EXPORT DATA ... format='JSON'``) or a JSON array (``bq query --format=json``): one object
  per row, nested as in the schema (``service.description``, ``sku.description``,
  ``usage.amount``, ``usage.unit``, ``labels: [{key, value}]``, ``credits: [...]``);
* CSV from a query that flattens the records (CSV cannot hold them): headers are the column
  paths, dotted (``sku.description``) or with underscores (``sku_description``), and
  ``labels`` is ``TO_JSON_STRING(labels)``.

Used columns: ``service.description``, ``sku.id``, ``sku.description``, ``usage_start_time``,
``usage_end_time``, ``usage.amount``, ``usage.unit``, ``cost``, ``currency``, ``cost_type``,
``labels``, ``project.id``; every other column stays in the row's raw JSON. Numbers are read as
decimals from their text (never floats) and made integers: cost in micros (a finer cost is
rounded half-even to the micro), usage in thousandths.

`usage_records` turns one UTC day of rows (by ``usage_start_time``; Google puts usage in the
hour it happened) into the records reconciliation matches:

* a row labelled ``ATTEMPT_LABEL`` (Vertex requests carry ``labels``; the Vertex adapter sends
  the attempt's client request key under this key) names its attempt: the day's rows of one
  label make one record (an hour-straddling job is two rows of Google's, one charge of ours),
  matched by client request key, i.e. per job;
* a row without the label (the Gemini API takes no labels) is an aggregate: reconciliation
  compares its model's day as a sum (`controlplane.domain.reconciliation_aggregates`).

Only rows that are Veo generation count: a SKU description the SKU map (`SkuMap`; defaults
`DEFAULT_SKUS`, regular expressions matched case-insensitively, the first match wins) names a
model for, or a row carrying the label. Other rows (storage, Gemini text tokens of the same
project) and rows whose ``cost_type`` is not ``regular`` (tax, rounding error, adjustment) are
kept in the raw file and counted by `Summary`, never reconciled. Usage in seconds becomes the
Veo ledger's unit ``billed_seconds``; ``cost`` is the gross cost at Google's price, the credits
(free tier, discounts) are not subtracted: the platform's expected costs are list prices.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from vidroute_core.adapter import UsageRecord

# The label key whose value is our attempt's client request key on a Vertex request (and so on
# its Cloud Billing rows); the Vertex adapter sends it (`vidroute_core.cloud_labels`).
from vidroute_core.cloud_labels import ATTEMPT_LABEL

__all__ = [
    "ATTEMPT_LABEL",
    "DEFAULT_SKUS",
    "SECONDS_UNITS",
    "ExportError",
    "ExportRow",
    "SkuMap",
    "Summary",
    "parse_export",
    "summarize",
    "usage_records",
]

#: ``usage.unit`` values that count seconds of output (the Veo ledger's ``billed_seconds``).
SECONDS_UNITS = frozenset({"seconds", "second", "s"})
VEO_UNIT = "billed_seconds"
#: SKU description patterns -> model, per service: Vertex AI bills the GA ids, the Gemini API
#: (``Generative Language API``) the preview ids the shipped capabilities route to. Google's SKU
#: descriptions are not a contract: check them against the first real export and override with
#: ``vidroute usage import --sku PATTERN=MODEL``.
DEFAULT_SKUS: tuple[tuple[str, str, str], ...] = (
    ("vertex ai", r"\bveo[ -]?3\.1[ -]fast\b", "veo-3.1-fast-generate-001"),
    ("vertex ai", r"\bveo[ -]?3\.1[ -]lite\b", "veo-3.1-lite-generate-001"),
    ("vertex ai", r"\bveo[ -]?3\.1\b", "veo-3.1-generate-001"),
    ("vertex ai", r"\bveo[ -]?3(\.0)?[ -]fast\b", "veo-3.0-fast-generate-001"),
    ("vertex ai", r"\bveo[ -]?3(\.0)?\b", "veo-3.0-generate-001"),
    ("vertex ai", r"\bveo[ -]?2(\.0)?\b", "veo-2.0-generate-001"),
    ("", r"\bveo[ -]?3\.1[ -]fast\b", "veo-3.1-fast-generate-preview"),
    ("", r"\bveo[ -]?3\.1[ -]lite\b", "veo-3.1-lite-generate-preview"),
    ("", r"\bveo[ -]?3\.1\b", "veo-3.1-generate-preview"),
    ("", r"\bveo[ -]?3(\.0)?[ -]fast\b", "veo-3.0-fast-generate-001"),
    ("", r"\bveo[ -]?3(\.0)?\b", "veo-3.0-generate-001"),
    ("", r"\bveo[ -]?2(\.0)?\b", "veo-2.0-generate-001"),
)
MICROS = Decimal(1_000_000)
MILLI = Decimal(1000)


class ExportError(ValueError):
    """The file is not a Cloud Billing export this module reads: the line (1-based; for CSV
    the header is line 1) and the column say where."""

    def __init__(self, line: int, column: str, message: str) -> None:
        super().__init__(
            f"line {line}: {column}: {message}" if column else f"line {line}: {message}"
        )
        self.line = line
        self.column = column


@dataclass(frozen=True, slots=True)
class SkuMap:
    """SKU description -> model: ``(service substring, pattern, model)``, first match wins; an
    empty service matches any service. Extra entries (``--sku``) come before the defaults."""

    entries: tuple[tuple[str, str, str], ...] = DEFAULT_SKUS

    @classmethod
    def with_overrides(cls, overrides: Iterable[str]) -> SkuMap:
        """``PATTERN=MODEL`` texts (any service) ahead of the defaults; a bad one raises
        ValueError naming it."""
        extra = []
        for text in overrides:
            pattern, sep, model = text.rpartition("=")
            if not sep or not pattern.strip() or not model.strip():
                raise ValueError(f"--sku {text!r}: expected PATTERN=MODEL")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"--sku {text!r}: not a regular expression: {exc}") from None
            extra.append(("", pattern.strip(), model.strip()))
        return cls((*extra, *DEFAULT_SKUS))

    def model_of(self, service: str, sku: str) -> str:
        svc = service.lower()
        for want, pattern, model in self.entries:
            if want in svc and re.search(pattern, sku, re.IGNORECASE):
                return model
        return ""

    def to_json(self) -> list[list[str]]:
        return [list(e) for e in self.entries]

    @classmethod
    def from_json(cls, data: Sequence[Sequence[str]]) -> SkuMap:
        return cls(tuple((str(a), str(b), str(c)) for a, b, c in data))


@dataclass(frozen=True, slots=True)
class ExportRow:
    """One row of the export, its money and usage as integers."""

    line: int
    service: str
    sku_id: str
    sku: str
    start: datetime
    end: datetime | None
    usage_milli: int
    usage_unit: str
    cost_micros: int
    currency: str
    cost_type: str
    labels: Mapping[str, str]
    project_id: str
    raw_json: str

    @property
    def attempt_key(self) -> str:
        return self.labels.get(ATTEMPT_LABEL, "")

    @property
    def regular(self) -> bool:
        return self.cost_type in ("", "regular")


@dataclass(frozen=True, slots=True)
class Summary:
    """What an import holds: rows in all, Veo rows (ours) by model and labelled, the others by
    SKU description, the UTC days the rows' usage starts on, and the total of our cost."""

    rows: int
    ours: int
    labelled: int
    by_model: Mapping[str, int]
    others: Mapping[str, int]
    days: tuple[date, ...]
    cost_micros: int
    currency: str
    unmapped_labelled: int = 0
    not_regular: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)


# -- reading -----------------------------------------------------------------------------------
def _lookup(row: Mapping[str, Any], path: str) -> Any:
    """The value at `path` (``usage.amount``): nested objects, a flat dotted key, or the
    underscore alias (``usage_amount``)."""
    node: Any = row
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            node = None
            break
        node = node[part]
    if node is not None:
        return node
    if path in row:
        return row[path]
    return row.get(path.replace(".", "_"))


def _text(row: Mapping[str, Any], path: str) -> str:
    value = _lookup(row, path)
    return "" if value is None else str(value).strip()


def _decimal(value: Any, line: int, column: str) -> Decimal:
    if value is None or (isinstance(value, str) and not value.strip()):
        return Decimal(0)
    if isinstance(value, bool) or not isinstance(value, (int, str, Decimal)):
        raise ExportError(line, column, f"not a number: {value!r}")
    try:
        out = Decimal(value.strip()) if isinstance(value, str) else Decimal(value)
    except InvalidOperation:
        raise ExportError(line, column, f"not a number: {value!r}") from None
    if not out.is_finite():
        raise ExportError(line, column, f"not a finite number: {value!r}")
    return out


def _scaled(value: Decimal, scale: Decimal) -> int:
    return int((value * scale).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def _time(value: Any, line: int, column: str, *, required: bool) -> datetime | None:
    text = "" if value is None else str(value).strip()
    if not text:
        if required:
            raise ExportError(line, column, "missing")
        return None
    cleaned = re.sub(r"\s*UTC$", "", text).replace("Z", "+00:00")
    try:
        moment = datetime.fromisoformat(cleaned)
    except ValueError:
        raise ExportError(line, column, f"not a timestamp: {text!r}") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _labels(value: Any, line: int) -> dict[str, str]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value, parse_float=Decimal)
        except json.JSONDecodeError:
            raise ExportError(line, "labels", "not JSON (use TO_JSON_STRING(labels))") from None
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, list):
        out = {}
        for item in value:
            if not isinstance(item, Mapping) or "key" not in item:
                raise ExportError(line, "labels", f"not a {{key, value}} pair: {item!r}")
            out[str(item["key"])] = "" if item.get("value") is None else str(item["value"])
        return out
    raise ExportError(line, "labels", f"not a list of {{key, value}}: {value!r}")


def _row(obj: Mapping[str, Any], line: int) -> ExportRow:
    sku = _text(obj, "sku.description")
    if not sku:
        raise ExportError(line, "sku.description", "missing")
    currency = _text(obj, "currency").upper()
    if not re.fullmatch(r"[A-Z]{3}", currency):
        raise ExportError(line, "currency", f"not an ISO 4217 code: {currency!r}")
    if _lookup(obj, "cost") in (None, ""):
        raise ExportError(line, "cost", "missing")
    start = _time(_lookup(obj, "usage_start_time"), line, "usage_start_time", required=True)
    assert start is not None
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return ExportRow(
        line=line,
        service=_text(obj, "service.description"),
        sku_id=_text(obj, "sku.id"),
        sku=sku,
        start=start,
        end=_time(_lookup(obj, "usage_end_time"), line, "usage_end_time", required=False),
        usage_milli=_scaled(_decimal(_lookup(obj, "usage.amount"), line, "usage.amount"), MILLI),
        usage_unit=_text(obj, "usage.unit").lower(),
        cost_micros=_scaled(_decimal(_lookup(obj, "cost"), line, "cost"), MICROS),
        currency=currency,
        cost_type=_text(obj, "cost_type").lower(),
        labels=_labels(_lookup(obj, "labels"), line),
        project_id=_text(obj, "project.id"),
        raw_json=raw,
    )


def parse_export(text: str) -> tuple[str, list[ExportRow]]:
    """(format, rows) of an export file's text: ``json`` (an array), ``ndjson`` or ``csv``
    (module doc); raises `ExportError` at the first row it cannot read (nothing half-read)."""
    body = text.lstrip("\ufeff").strip()
    if not body:
        raise ExportError(1, "", "the file is empty")
    if body.startswith("["):
        try:
            items = json.loads(body, parse_float=Decimal)
        except json.JSONDecodeError as exc:
            raise ExportError(exc.lineno, "", f"not JSON: {exc.msg}") from None
        objs = [(n + 1, o) for n, o in enumerate(items)]
        fmt = "json"
    elif body.startswith("{"):
        objs = []
        for n, line in enumerate(body.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                objs.append((n, json.loads(line, parse_float=Decimal)))
            except json.JSONDecodeError as exc:
                raise ExportError(n, "", f"not JSON: {exc.msg}") from None
        fmt = "ndjson"
    else:
        reader = csv.DictReader(io.StringIO(body))
        header = [h.strip() for h in reader.fieldnames or []]
        reader.fieldnames = header
        for need in ("sku.description", "usage_start_time", "cost", "currency"):
            if need not in header and need.replace(".", "_") not in header:
                raise ExportError(1, need, "no such column in the CSV header")
        objs = [(n, dict(r)) for n, r in enumerate(reader, start=2)]
        fmt = "csv"
    rows = []
    for n, obj in objs:
        if not isinstance(obj, Mapping):
            raise ExportError(n, "", "not an object")
        rows.append(_row(obj, n))
    return fmt, rows


# -- to usage records --------------------------------------------------------------------------
def _ours(row: ExportRow, skus: SkuMap) -> tuple[bool, str]:
    model = skus.model_of(row.service, row.sku)
    return (bool(model) or bool(row.attempt_key)), model


def summarize(rows: Sequence[ExportRow], skus: SkuMap) -> Summary:
    """What `rows` hold (the import's answer to the operator)."""
    by_model: Counter[str] = Counter()
    others: Counter[str] = Counter()
    ours = labelled = unmapped = not_regular = cost = 0
    currencies = Counter(r.currency for r in rows)
    for r in rows:
        mine, model = _ours(r, skus)
        if not mine:
            others[r.sku] += 1
            continue
        if not r.regular:
            not_regular += 1
            continue
        ours += 1
        cost += r.cost_micros
        by_model[model or "?"] += 1
        labelled += bool(r.attempt_key)
        unmapped += bool(r.attempt_key) and not model
    return Summary(
        rows=len(rows),
        ours=ours,
        labelled=labelled,
        by_model=dict(sorted(by_model.items())),
        others=dict(sorted(others.items())),
        days=tuple(sorted({r.start.date() for r in rows})),
        cost_micros=cost,
        currency=currencies.most_common(1)[0][0] if currencies else "USD",
        unmapped_labelled=unmapped,
        not_regular=not_regular,
    )


def usage_records(rows: Sequence[ExportRow], day: date, skus: SkuMap) -> list[UsageRecord]:
    """The usage records of `day` (UTC, by ``usage_start_time``): one per attempt label, one
    per unlabelled row (module doc); in file order, deterministic."""
    labelled: dict[str, list[ExportRow]] = defaultdict(list)
    out: list[UsageRecord] = []
    for r in rows:
        mine, model = _ours(r, skus)
        if not mine or not r.regular or r.start.date() != day:
            continue
        if r.attempt_key:
            labelled[r.attempt_key].append(r)
            continue
        out.append(_record([r], model))
    for key, group in labelled.items():
        models = {skus.model_of(r.service, r.sku) for r in group} - {""}
        out.append(_record(group, models.pop() if len(models) == 1 else "", key))
    return out


def _record(group: Sequence[ExportRow], model: str, key: str = "") -> UsageRecord:
    first = group[0]
    seconds = all(r.usage_unit in SECONDS_UNITS for r in group)
    raw = [json.loads(r.raw_json) for r in group]
    return UsageRecord(
        provider_job_id="",
        model=model,
        usage_time=min(r.start for r in group),
        provider_milliunits=sum(r.usage_milli for r in group),
        provider_unit=VEO_UNIT if seconds else first.usage_unit,
        cost_micros=sum(r.cost_micros for r in group),
        currency=first.currency,
        raw_json=json.dumps(
            {"lines": [r.line for r in group], "rows": raw}, sort_keys=True, separators=(",", ":")
        ),
        client_request_key=key,
    )
