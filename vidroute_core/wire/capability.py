"""Capability entries as protobuf: the one conversion the sidecars' Describe and the control
plane's ListProviders share, and its way back into a schema document."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from vidroute.adapter.v1 import adapter_pb2 as pb
from vidroute.common.v1 import generation_pb2, money_pb2
from vidroute_core.capabilities.loader import Capability, parse_entry


def _timestamp(when: datetime | None) -> timestamp_pb2.Timestamp | None:
    if when is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when.astimezone(UTC))
    return ts


def _money(micros: int, currency: str) -> money_pb2.Money:
    return money_pb2.Money(amount_micros=micros, currency_code=currency)


def _lifecycle(name: str) -> pb.Lifecycle.ValueType:
    return pb.Lifecycle.Value(f"LIFECYCLE_{name.upper()}")


def _billing(block: Mapping[str, Any]) -> pb.BillingRules:
    """A schema ``billing`` block as the wire message (names upper-cased into enum values)."""
    return pb.BillingRules(
        failed=pb.FailureCharge.Value(f"FAILURE_CHARGE_{block.get('failed', 'nothing').upper()}"),
        cancelled=pb.FailureCharge.Value(
            f"FAILURE_CHARGE_{block.get('cancelled', 'nothing').upper()}"
        ),
        failed_fixed_micros=int(block.get("failed_fixed_micros", 0)),
        cancelled_fixed_micros=int(block.get("cancelled_fixed_micros", 0)),
        granularity=pb.BillingGranularity.Value(
            f"BILLING_GRANULARITY_{block.get('granularity', 'job').upper()}"
        ),
    )


def _billing_document(rules: pb.BillingRules) -> dict[str, Any]:
    """The wire message back as a schema block (an unset enum is its documented default)."""

    def charge(value: pb.FailureCharge.ValueType) -> str:
        if value == pb.FAILURE_CHARGE_UNSPECIFIED:
            return "nothing"
        return pb.FailureCharge.Name(value).removeprefix("FAILURE_CHARGE_").lower()

    block: dict[str, Any] = {
        "failed": charge(rules.failed),
        "cancelled": charge(rules.cancelled),
        "granularity": "job"
        if rules.granularity == pb.BILLING_GRANULARITY_UNSPECIFIED
        else pb.BillingGranularity.Name(rules.granularity)
        .removeprefix("BILLING_GRANULARITY_")
        .lower(),
    }
    if rules.failed_fixed_micros:
        block["failed_fixed_micros"] = rules.failed_fixed_micros
    if rules.cancelled_fixed_micros:
        block["cancelled_fixed_micros"] = rules.cancelled_fixed_micros
    return block


def capability_to_proto(cap: Capability) -> pb.CapabilityEntry:
    """A loaded capability entry as the Describe message."""
    com = cap.commercial
    price = pb.Price(
        price_version=com.price_version,
        per_output_second=_money(com.price_micros_per_output_second, com.currency),
        provider_unit=com.provider_unit,
        provider_milliunits_per_output_second=com.provider_milliunits_per_output_second,
    )
    if com.billing:
        price.billing.CopyFrom(_billing(com.billing))
    if com.price_micros_per_output_second_with_audio is not None:
        price.per_output_second_with_audio.CopyFrom(
            _money(com.price_micros_per_output_second_with_audio, com.currency)
        )
    entry = pb.CapabilityEntry(
        provider=cap.provider,
        account=cap.account,
        region=cap.region,
        model=cap.model,
        model_version=cap.model_version,
        capability_version=cap.capability_version,
        lifecycle=_lifecycle(cap.lifecycle),
        sunset_at=_timestamp(cap.sunset_at),
        modes=[generation_pb2.Mode.Value(f"MODE_{m.value}") for m in cap.modes],
        supports_last_frame=cap.supports_last_frame,
        max_reference_images=cap.max_reference_images,
        aspect_ratios=list(cap.aspect_ratios),
        durations_seconds=list(cap.durations_seconds),
        resolutions=list(cap.resolutions),
        native_audio=cap.native_audio,
        supports_seed=cap.supports_seed,
        supports_negative_prompt=cap.supports_negative_prompt,
        max_prompt_chars=cap.max_prompt_chars,
        max_sample_count=cap.max_sample_count,
        constraints=[
            pb.CapabilityConstraint(when=c.when, require=c.require, message=c.message)
            for c in cap.constraints
        ],
        operations=pb.OperationSupport(
            polling=cap.operations.polling,
            callback=cap.operations.callback,
            cancellation=cap.operations.cancellation,
            client_idempotency_key=cap.operations.client_idempotency_key,
            task_search=cap.operations.task_search,
            usage_records=cap.operations.usage_records,
        ),
        price=price,
        max_concurrency=cap.max_concurrency,
        output_url_ttl_seconds=cap.output_url_ttl_seconds,
        quality_prior=cap.quality_prior,
    )
    hosted = cap.self_hosted
    if hosted is not None:
        entry.self_hosted.CopyFrom(
            pb.SelfHostedProfile(
                required_gpu_type=hosted.required_gpu_type,
                estimated_vram_mb=hosted.estimated_vram_mb,
                estimated_gpu_ms_per_output_second=round(
                    hosted.estimated_gpu_seconds_per_output_second * 1000
                ),
                batchable=hosted.batchable,
                checkpoint_version=hosted.checkpoint_version,
                container_image_digest=hosted.container_image_digest,
                scheduler_queue=hosted.scheduler_queue,
                cold_start_seconds=hosted.cold_start_seconds,
            )
        )
    return entry


def capability_document(entry: pb.CapabilityEntry) -> dict[str, Any]:
    """A Describe entry as a capability schema document (the form of a capability file), so the
    control plane validates and publishes it exactly like a file entry."""
    data = json_format.MessageToDict(entry, preserving_proto_field_name=True)
    doc: dict[str, Any] = {
        "provider": entry.provider,
        "account": entry.account,
        "model": entry.model,
        "version": entry.model_version,
        "capability_version": entry.capability_version,
        "status": pb.Lifecycle.Name(entry.lifecycle).removeprefix("LIFECYCLE_").lower(),
        "modes": [m.removeprefix("MODE_") for m in data.get("modes", [])],
        "inputs": {
            "last_frame": entry.supports_last_frame,
            "max_reference_images": entry.max_reference_images,
            "seed": entry.supports_seed,
            "negative_prompt": entry.supports_negative_prompt,
            "max_prompt_chars": entry.max_prompt_chars,
        },
        "output": {
            "aspect_ratios": list(entry.aspect_ratios),
            "durations_seconds": list(entry.durations_seconds),
            "resolutions": list(entry.resolutions),
            "native_audio": entry.native_audio,
            "max_sample_count": max(1, entry.max_sample_count),
        },
        "constraints": [
            {"when": c.when, "require": c.require, "message": c.message} for c in entry.constraints
        ],
        "operations": {
            k: bool(data.get("operations", {}).get(k, False))
            for k in (
                "polling",
                "callback",
                "cancellation",
                "client_idempotency_key",
                "task_search",
                "usage_records",
            )
        },
        "max_concurrency": entry.max_concurrency,
        "output_url_ttl_seconds": entry.output_url_ttl_seconds,
    }
    if entry.HasField("quality_prior"):
        doc["quality_prior"] = entry.quality_prior
    if entry.region:
        doc["region"] = entry.region
    if entry.HasField("sunset_at"):
        doc["sunset"] = entry.sunset_at.ToDatetime().isoformat() + "Z"
    if entry.HasField("price"):
        p = entry.price
        commercial: dict[str, Any] = {
            "currency": p.per_output_second.currency_code or "USD",
            "price_version": p.price_version,
            "price_micros_per_output_second": p.per_output_second.amount_micros,
            "provider_unit": p.provider_unit,
            "provider_milliunits_per_output_second": p.provider_milliunits_per_output_second,
        }
        if p.HasField("per_output_second_with_audio"):
            commercial["price_micros_per_output_second_with_audio"] = (
                p.per_output_second_with_audio.amount_micros
            )
        if p.HasField("billing"):
            commercial["billing"] = _billing_document(p.billing)
        doc["commercial"] = commercial
    return doc


def capability_from_proto(entry: pb.CapabilityEntry, where: str = "capability") -> Capability:
    """A Describe-shaped entry back as a loaded capability, through the schema and constraint
    parser (`CapabilityLoadError` when it is not a valid entry)."""
    return parse_entry(capability_document(entry), where)
