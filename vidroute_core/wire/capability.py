"""Capability entries as protobuf: the one conversion the sidecars' Describe and the control
plane's ListProviders share."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import timestamp_pb2

from vidroute.adapter.v1 import adapter_pb2 as pb
from vidroute.common.v1 import generation_pb2, money_pb2
from vidroute_core.capabilities.loader import Capability


def _timestamp(when: datetime | None) -> timestamp_pb2.Timestamp | None:
    if when is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when.astimezone(UTC))
    return ts


def _money(micros: int, currency: str) -> money_pb2.Money:
    return money_pb2.Money(amount_micros=micros, currency_code=currency)


def _lifecycle(name: str) -> int:
    return pb.Lifecycle.Value(f"LIFECYCLE_{name.upper()}")


def capability_to_proto(cap: Capability) -> pb.CapabilityEntry:
    """A loaded capability entry as the Describe message."""
    com = cap.commercial
    price = pb.Price(
        price_version=com.price_version,
        per_output_second=_money(com.price_micros_per_output_second, com.currency),
        provider_unit=com.provider_unit,
        provider_milliunits_per_output_second=com.provider_milliunits_per_output_second,
    )
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
        lifecycle=_lifecycle(cap.lifecycle),  # type: ignore[arg-type]
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
        ),
        price=price,
        max_concurrency=cap.max_concurrency,
        output_url_ttl_seconds=cap.output_url_ttl_seconds,
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
