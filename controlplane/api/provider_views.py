"""Provider admin results -> scheduler API messages (ListProviders, GetProviderHealth)."""

from __future__ import annotations

from controlplane.api.views import timestamp
from controlplane.capabilities.loader import Capability
from controlplane.domain.breaker import BreakerState
from controlplane.scheduling.health import BreakerStatus
from controlplane.service.providers import ProviderAccountView
from vidroute.adapter.v1 import adapter_pb2
from vidroute.common.v1 import generation_pb2, money_pb2
from vidroute.scheduler.v1 import scheduler_pb2 as pb


def breaker_state(state: BreakerState) -> pb.BreakerState.ValueType:
    return pb.BreakerState.Value(f"BREAKER_STATE_{state.value}")


def breaker_state_from_proto(value: int) -> BreakerState | None:
    """UNSPECIFIED (0) is None: release the override."""
    if value == pb.BREAKER_STATE_UNSPECIFIED:
        return None
    return BreakerState(pb.BreakerState.Name(value).removeprefix("BREAKER_STATE_"))  # type: ignore[arg-type]


def breaker(status: BreakerStatus) -> pb.BreakerStatus:
    k = status.key
    return pb.BreakerStatus(
        provider=k.provider,
        account=k.account,
        region=k.region,
        model=k.model,
        operation=k.operation.value,
        state=breaker_state(status.state),
        forced=status.forced,
        open_until=timestamp(status.open_until),
    )


def _money(micros: int, currency: str) -> money_pb2.Money:
    return money_pb2.Money(amount_micros=micros, currency_code=currency)


def capability(cap: Capability) -> adapter_pb2.CapabilityEntry:
    com = cap.commercial
    price = adapter_pb2.Price(
        price_version=com.price_version,
        per_output_second=_money(com.price_micros_per_output_second, com.currency),
        provider_unit=com.provider_unit,
        provider_milliunits_per_output_second=com.provider_milliunits_per_output_second,
    )
    if com.price_micros_per_output_second_with_audio is not None:
        price.per_output_second_with_audio.CopyFrom(
            _money(com.price_micros_per_output_second_with_audio, com.currency)
        )
    return adapter_pb2.CapabilityEntry(
        provider=cap.provider,
        account=cap.account,
        region=cap.region,
        model=cap.model,
        model_version=cap.model_version,
        capability_version=cap.capability_version,
        lifecycle=adapter_pb2.Lifecycle.Value(f"LIFECYCLE_{cap.lifecycle.upper()}"),
        sunset_at=timestamp(cap.sunset_at),
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
            adapter_pb2.CapabilityConstraint(when=c.when, require=c.require, message=c.message)
            for c in cap.constraints
        ],
        operations=adapter_pb2.OperationSupport(
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


def provider(view: ProviderAccountView) -> pb.ProviderInfo:
    return pb.ProviderInfo(
        provider=view.provider,
        account=view.account,
        region=view.region,
        adapter_address=view.adapter_address,
        capabilities=[capability(c) for c in view.capabilities],
    )
