"""Provider admin results -> scheduler API messages (ListProviders, GetProviderHealth)."""

from __future__ import annotations

from controlplane.api.views import timestamp
from controlplane.domain.breaker import BreakerState
from controlplane.scheduling.health import BreakerStatus
from controlplane.service.providers import ProviderAccountView
from vidroute.scheduler.v1 import scheduler_pb2 as pb
from vidroute_core.wire.capability import capability_to_proto


def breaker_state(state: BreakerState) -> pb.BreakerState.ValueType:
    return pb.BreakerState.Value(f"BREAKER_STATE_{state.value}")


def breaker_state_from_proto(value: int) -> BreakerState | None:
    """UNSPECIFIED (0) is None: release the override."""
    if value == pb.BREAKER_STATE_UNSPECIFIED:
        return None
    return BreakerState(pb.BreakerState.Name(value).removeprefix("BREAKER_STATE_"))  # type: ignore[arg-type]  # Name() is str; BreakerState takes its Literal values


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


def provider(view: ProviderAccountView) -> pb.ProviderInfo:
    return pb.ProviderInfo(
        provider=view.provider,
        account=view.account,
        region=view.region,
        adapter_address=view.adapter_address,
        capabilities=[capability_to_proto(c) for c in view.capabilities],
    )
