"""Helpers for the scheduling suite: configured accounts and an adapter that really compiles."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapter_sidecars.common.compiling import finish, resolve
from controlplane.capabilities.publish import AccountConfig, documents_from_directory
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import example_policy
from vidroute_core.adapter import CompiledPlan, Transformation, TransformationKind
from vidroute_core.capabilities.loader import Capability, expand_for_accounts, load_file
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec, RoutingMode, RoutingPolicy

if TYPE_CHECKING:
    from controlplane.domain.requeue import RequeueFacts
    from controlplane.persistence.database import Database
    from controlplane.persistence.records import TaskRecord
    from controlplane.scheduling.dispatcher import Dispatcher, DispatchResult

ROOT = Path(__file__).resolve().parents[3]
CAPABILITY_DIRS = sorted(ROOT.glob("adapter_sidecars/*/capabilities"))
NOW = datetime(2026, 6, 24, 10, 0, tzinfo=UTC)
ACCOUNTS = (
    AccountConfig("runway", "prod-us", "us", "kms://runway/prod-us", "127.0.0.1:7001"),
    AccountConfig(
        "google", "veo-prod-apac", "asia-northeast1", "kms://google/apac", "127.0.0.1:7002"
    ),
    AccountConfig("google", "veo-prod-us", "us", "kms://google/us", "127.0.0.1:7002"),
    AccountConfig("self_hosted", "gpu-a", "us", "kms://gpu/a", "127.0.0.1:7003"),
)


def catalog_capabilities() -> list[Capability]:
    """Every YAML entry expanded over `ACCOUNTS`, as the adapters would serve them."""
    out: list[Capability] = []
    for directory in CAPABILITY_DIRS:
        for path in sorted(directory.glob("*.yaml")):
            entries = load_file(path)
            mine = [
                (a.account_name, a.region) for a in ACCOUNTS if a.provider == entries[0].provider
            ]
            out.extend(expand_for_accounts(entries, mine))
    return out


def make_spec(
    tenant: str = "tenant-a",
    *,
    gen: Mode = Mode.TEXT_TO_VIDEO,
    seconds: int = 8,
    size: tuple[int, int] = (1280, 720),
    **routing: object,
) -> GenerationSpec:
    return GenerationSpec(
        tenant_id=tenant,
        prompt="a red fox in snow",
        mode=gen,
        user_id="u1",
        project_id="p1",
        output=OutputSpec(width=size[0], height=size[1], duration_ms=seconds * 1000),
        routing=RoutingPolicy(**routing),  # type: ignore[arg-type]  # keyword overrides from a plain dict; the constructor checks them
    )


async def dispatch_one(
    dispatcher: Dispatcher, task: TaskRecord, facts: RequeueFacts | None = None
) -> DispatchResult:
    """One task through the one dispatch path: `dispatch_batch` with a batch of one."""
    (result,) = await dispatcher.dispatch_batch([task], {task.id: facts} if facts else {})
    return result


def strict(model: str) -> dict[str, Any]:  # Any: spread into make_spec's keywords
    return {"mode": RoutingMode.STRICT_MODEL, "required_model": model}


@dataclass
class CompilingAdapter:
    """An `AdapterClient` whose Compile uses the sidecars' real, pure compile rules."""

    capabilities: list[Capability] = field(default_factory=catalog_capabilities)
    compile_calls: list[tuple[str, str]] = field(default_factory=list)
    fail_models: set[str] = field(default_factory=set)

    def _find(self, account: str, model: str) -> Capability:
        return next(c for c in self.capabilities if c.account == account and c.model == model)

    async def compile(
        self,
        spec: GenerationSpec,
        *,
        account: str,
        model: str,
        model_version: str = "",
        capability: Capability | None = None,
    ) -> CompiledPlan:
        self.compile_calls.append((account, model))
        if model in self.fail_models:
            raise ConnectionError("adapter unreachable")
        cap = self._find(account, model)
        resolved, draft = resolve(spec, cap)
        plan = finish(draft, resolved, endpoint="POST /fake", native_request={"model": model})
        return CompiledPlan(
            provider=plan.provider,
            account=plan.account,
            model=plan.model,
            model_version=plan.model_version,
            capability_version=plan.capability_version,
            price_version=plan.price_version,
            request_hash=plan.request_hash,
            estimated_cost_micros=plan.estimated_cost_micros,
            currency=plan.currency,
            submittable=plan.submittable,
            transformations=tuple(
                Transformation(t.field, TransformationKind(t.kind.value), t.detail)
                for t in plan.transformations
            ),
            plan_json={
                "provider": plan.provider,
                "account": plan.account,
                "model": plan.model,
                "native_request_json": plan.native_request_json,
            },
        )

    def for_providers(self, providers: Iterable[str]) -> dict[str, CompilingAdapter]:
        return {p: self for p in providers}


# -- two equal self-hosted models behind one sidecar (the load-aware routing tests) ---------

LOAD_ROUTER = RouterConfig(
    policy=example_policy("router-load"), latency_good_s=0.0, latency_bad_s=2.0
)
LOAD_MODELS = ("wan-a", "wan-b")


def two_model_documents() -> list[dict[str, Any]]:
    """The shipped wan2.2-t2v entry twice, as wan-a and wan-b at the same price: only the load
    the sidecar reports can tell them apart."""
    shipped = documents_from_directory(ROOT / "adapter_sidecars/selfhosted/capabilities")
    base = next(d for d in shipped if d["model"] == "wan2.2-t2v")
    out = []
    for name in LOAD_MODELS:
        doc = copy.deepcopy(base)
        doc["model"] = name
        doc["capability_version"] = f"self_hosted/{name}/2026-06-01"
        doc["commercial"]["price_version"] = f"gpu-{name}"
        doc["max_concurrency"] = 1000  # lease capacity ~1 for both: only the load differs
        doc["native"]["model"] = name
        out.append(doc)
    return out


def fox_spec(tenant: str) -> GenerationSpec:
    return GenerationSpec(
        tenant_id=tenant,
        prompt="a red fox in snow",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=4000),
    )


async def route_new_task(dispatcher: Dispatcher, db: Database, tenant: str) -> dict[str, Any]:
    """Create one task of `tenant`, dispatch it alone, return its decision's explain JSON."""
    from controlplane.scheduling.dispatcher import DispatchOutcome

    s = fox_spec(tenant)
    async with db.unit(NOW) as u:
        task, _ = await u.create_task(
            s, idempotency_key=f"load-{tenant}", spec_hash=normalized_spec_hash(s)
        )
    result = await dispatch_one(dispatcher, task)
    assert result.outcome is DispatchOutcome.SELECTED
    assert result.decision is not None
    return result.decision.to_json()
