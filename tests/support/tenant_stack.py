"""A platform whose callers are tenants: tenant tokens, the tenants document published through
the `vidroute tenants publish` CLI as an operator would, and the measures the tenants e2e tests
take (dispatch order from the tasks' first attempts, Jain's index, CreateTask latencies).

    with tenant_platform(workdir, db_url, redis_url, tenants=("a", "b"), time_scale=0.01) as ts:
        ts.publish({"version": "v1", "default": {...}, "tenants": {...}})
        task_id = ts.create("a", provider="google")            # a's token, a's tenant id
        ts.hold("google"); ...; ts.release("google")           # operator breaker on SUBMIT
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from clients import auth as client_auth
from controlplane.api.auth import hash_token, new_token
from tests.support.stack import (
    PROVIDERS,
    RPC_GUARD_S,
    ControlPlane,
    ProviderFarm,
    RedisDb,
    shipped_sidecar_config,
)
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc

VIDROUTE = Path(sys.executable).with_name("vidroute")


def tenant_spec(
    tenant: str,
    *,
    prompt: str,
    provider: str = "",
    service_class: int = gen.SERVICE_CLASS_STANDARD,
    duration_s: int = 4,
) -> gen.GenerationSpec:
    """A 720p text-to-video spec of `tenant`: pinned to `provider`'s model, or AUTO if none."""
    routing = (
        gen.RoutingPolicy(
            mode=gen.ROUTING_MODE_STRICT_MODEL,
            required_provider=provider,
            required_model=PROVIDERS[provider].model,
        )
        if provider
        else gen.RoutingPolicy(mode=gen.ROUTING_MODE_AUTO)
    )
    return gen.GenerationSpec(
        tenant_id=tenant,
        prompt=prompt,
        mode=gen.MODE_TEXT_TO_VIDEO,
        output=gen.OutputSpec(width=1280, height=720, duration_ms=duration_s * 1000),
        routing=routing,
        service_class=service_class,  # type: ignore[arg-type]  # proto enums are ints at runtime
    )


@dataclass
class TenantPlatform:
    """A started platform with one bearer token per tenant (and the admin's)."""

    farm: ProviderFarm
    cp: ControlPlane
    workdir: Path
    tokens: Mapping[str, str]
    _channels: dict[str, grpc.Channel] = field(default_factory=dict)

    def stub(self, tenant: str) -> scheduler_service_pb2_grpc.SchedulerServiceStub:
        """The public API as `tenant`'s client sees it (its own token)."""
        if tenant not in self._channels:
            assert self.cp.proc is not None
            self._channels[tenant] = client_auth.channel(self.cp.proc.address, self.tokens[tenant])
        return scheduler_service_pb2_grpc.SchedulerServiceStub(self._channels[tenant])

    def close(self) -> None:
        for chan in self._channels.values():
            chan.close()
        self._channels.clear()

    def create(self, tenant: str, **spec: Any) -> str:
        """CreateTask with `tenant`'s token; returns the task id (errors raise grpc.RpcError)."""
        request = api.CreateTaskRequest(
            spec=tenant_spec(tenant, **spec), idempotency_key=uuid.uuid4().hex
        )
        return str(self.stub(tenant).CreateTask(request, timeout=RPC_GUARD_S).task.task_id)

    def get(self, tenant: str, task_id: str) -> sp.Task:
        request = api.GetTaskRequest(task_id=task_id)
        return self.stub(tenant).GetTask(request, timeout=RPC_GUARD_S).task

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`vidroute ARGS` as the operator runs it: the admin token and target exported."""
        assert self.cp.proc is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIDROUTE_")}
        env.update(
            VIDROUTE_TARGET=self.cp.proc.address,
            VIDROUTE_TOKEN=self.cp.token,
            XDG_CONFIG_HOME=str(self.workdir),  # never the user's own ~/.config
        )
        return subprocess.run(
            [str(VIDROUTE), *args],
            cwd=self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=RPC_GUARD_S,
            check=False,
        )

    def publish(self, document: Mapping[str, Any]) -> None:
        """Publish `document` with `vidroute tenants publish FILE`; it is active on return."""
        path = self.workdir / f"{document['version']}.yaml"
        path.write_text(yaml.safe_dump(dict(document), sort_keys=False), encoding="utf-8")
        done = self.cli("tenants", "publish", str(path))
        assert done.returncode == 0, done.stdout + done.stderr

    def _breaker(self, provider: str, state: int) -> None:
        config = shipped_sidecar_config(provider, base_url="http://unused")
        account = config["accounts"][0]
        request = api.ForceBreakerRequest(
            provider=provider,
            account=account["name"],
            region=account["region"],
            model=PROVIDERS[provider].model,
            operation="SUBMIT",
            state=state,  # type: ignore[arg-type]  # proto enums are ints at runtime
            reason="tenants e2e: hold the queue until the whole backlog is in",
        )
        self.cp._call(lambda s: s.ForceBreaker(request, timeout=RPC_GUARD_S))

    def hold(self, provider: str) -> None:
        """An operator opens the SUBMIT breaker of `provider`'s pinned model: tasks queue."""
        self._breaker(provider, sp.BREAKER_STATE_OPEN)

    def release(self, provider: str) -> None:
        """The operator forces the breaker CLOSED, so the whole backlog meets free slots at
        once (letting go of the override would go through HALF_OPEN's one-at-a-time probes)."""
        self._breaker(provider, sp.BREAKER_STATE_CLOSED)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when all values are equal, 1/n when one has everything."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def percentile(samples: Sequence[float], q: float) -> float:
    """The `q` quantile (0..1) of `samples`, nearest rank."""
    ordered = sorted(samples)
    rank = max(1, round(q * len(ordered) + 0.5)) if q < 1 else len(ordered)
    return ordered[min(rank, len(ordered)) - 1]


@contextmanager
def tenant_platform(
    workdir: Path,
    database_url: str,
    redis_server_url: str,
    *,
    tenants: Iterable[str],
    time_scale: float,
    providers: Iterable[str] = PROVIDERS,
) -> Iterator[TenantPlatform]:
    """Emulators, sidecars, Redis and a control plane that knows a token for each of
    `tenants` (``tenant:<id>``) besides the admin's; everything stopped on exit."""
    tokens = {tenant: new_token() for tenant in tenants}
    with ExitStack() as stack:
        farm = stack.enter_context(
            ProviderFarm(workdir / "farm", time_scale=time_scale, providers=providers)
        )
        redis = stack.enter_context(RedisDb(redis_server_url))
        (workdir / "cp").mkdir()
        cp = ControlPlane(workdir / "cp", farm, database_url=database_url, redis_url=redis.url)
        grants = [f"{hash_token(cp.token)}=admin"]
        grants += [f"{hash_token(token)}=tenant:{tenant}" for tenant, token in tokens.items()]
        cp.extra_env["VIDROUTE_AUTH_TOKENS"] = ",".join(grants)
        stack.callback(cp.kill)
        cp.start()
        platform = TenantPlatform(farm, cp, workdir, tokens)
        stack.callback(platform.close)
        yield platform
