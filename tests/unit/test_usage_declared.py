"""Recovery reads usage records only where the candidate's capability declares them
(`operations.usage_records`, from Describe): `scheduling.relet.usage_declared` answers from the
dispatcher's catalog, per (account, model), for the shipped capability documents."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.domain.routing.candidates import Candidate, Price
from controlplane.persistence.records import AttemptRecord
from controlplane.scheduling.dispatcher import Dispatcher
from controlplane.scheduling.relet import usage_declared
from vidroute_core.capabilities.loader import load_file

ROOT = Path(__file__).resolve().parents[2] / "adapter_sidecars"
SHIPPED = {
    "runway": (ROOT / "runway/capabilities/runway-2026-06.yaml", True),
    "self_hosted": (ROOT / "selfhosted/capabilities/selfhosted-2026-06.yaml", True),
    "google": (ROOT / "veo/capabilities/veo-2026-06.yaml", False),
    "vertex": (ROOT / "veo/vertex_capabilities/vertex-2026-12.yaml", False),
}


class _Dispatcher:
    def __init__(self, catalog: CapabilityCatalog) -> None:
        self._catalog = catalog

    async def catalog(self) -> CapabilityCatalog:
        return self._catalog


def _candidates() -> tuple[list[Candidate], dict[str, tuple[int, str]]]:
    candidates: list[Candidate] = []
    first: dict[str, tuple[int, str]] = {}
    for n, (name, (path, _)) in enumerate(SHIPPED.items(), start=1):
        for cap in load_file(path):
            candidates.append(
                Candidate(
                    provider=cap.provider,
                    account=f"{name}-account",
                    account_id=n,
                    region="us",
                    model=cap.model,
                    model_version=cap.model_version,
                    capability_version=cap.capability_version,
                    lifecycle="stable",
                    sunset_at=None,
                    capability=cap,
                    price=Price("p", "USD", 1),
                )
            )
            first.setdefault(name, (n, cap.model))
    return candidates, first


def _attempt(account_id: int, model: str) -> AttemptRecord:
    fields: dict[str, Any] = {"provider_account_id": account_id, "provider_model": model}
    return cast(AttemptRecord, SimpleNamespace(**fields))


@pytest.mark.parametrize("name", sorted(SHIPPED))
async def test_the_shipped_documents_declare_usage_where_the_provider_has_a_route(
    name: str,
) -> None:
    """Runway (daily usage) and the self-hosted server (GPU seconds) list usage; Veo on the
    Gemini API and on Vertex have no usage route (Cloud Billing export), so recovery never asks."""
    candidates, first = _candidates()
    dispatcher = cast(
        Dispatcher, _Dispatcher(CapabilityCatalog(tuple(candidates), datetime.now(UTC)))
    )
    declared = usage_declared(dispatcher)
    assert await declared(_attempt(*first[name])) is SHIPPED[name][1]


async def test_a_candidate_that_left_the_catalog_declares_nothing() -> None:
    candidates, first = _candidates()
    dispatcher = cast(
        Dispatcher, _Dispatcher(CapabilityCatalog(tuple(candidates), datetime.now(UTC)))
    )
    account_id, _ = first["runway"]
    assert await usage_declared(dispatcher)(_attempt(account_id, "no-such-model")) is False
