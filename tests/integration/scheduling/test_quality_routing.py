"""Routing learns from quality (design 9.14), through the real dispatcher on SQLite and PostgreSQL.

A catalog of two comparable self-hosted models (the shipped wan2.2-t2v entry twice: "wan-a" at
its price, "wan-b" 25% dearer, so A wins on cost alone). Callers reject 60 of A's outputs in one
tag bucket (X: 720p, 4 s) through `QualityService.submit_feedback`; once the dispatcher's quality
book has re-read the aggregates, a task in X routes to B, while a task in bucket Y (720p, 8 s)
still routes to A, whose quality there is still the prior. The explain snapshot shows the
quality component that moved.

The same holds for the caller's content tags (a bucket dimension): rejections of A's anime
clips move anime tasks to B and leave untagged tasks of the same output on A. And a model's
capability document may give it a quality prior, which routes before any evidence exists.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controlplane.capabilities.publish import (
    AccountConfig,
    documents_from_directory,
    publish_documents,
)
from controlplane.domain.quality import Verdict, bucket_key
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import example_policy
from controlplane.domain.states import TaskState
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig, DispatchOutcome
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LocalLock
from controlplane.scheduling.quality_book import QualityBook
from controlplane.service.access import Caller
from controlplane.service.quality import FeedbackInput, QualityService
from tests.integration.scheduling.support import NOW, ROOT, CompilingAdapter, dispatch_one
from tests.support.quality_tasks import account_id, task_in
from vidroute_core.capabilities.loader import expand_for_accounts, parse_entry
from vidroute_core.hashing import normalized_spec_hash
from vidroute_core.spec import NO_TAGS, ContentTags, GenerationSpec, Mode, OutputSpec, Style

pytestmark = pytest.mark.timeout(120)
ACCOUNT = AccountConfig("self_hosted", "gpu-a", "us", "kms://gpu/a", "127.0.0.1:7003")
A, B = "self_hosted/wan-a/gpu-a", "self_hosted/wan-b/gpu-a"
REFRESH_S = 5.0


def _documents(priors: dict[str, float] | None = None) -> list[dict[str, Any]]:
    shipped = documents_from_directory(ROOT / "adapter_sidecars/selfhosted/capabilities")
    base = next(d for d in shipped if d["model"] == "wan2.2-t2v")
    out = []
    # wan-b at 1.5x the price: wan-a wins by cost beyond the hysteresis band until rejected
    for name, micros in (("wan-a", 2800), ("wan-b", 4200)):
        doc = copy.deepcopy(base)
        doc["model"] = name
        doc["capability_version"] = f"self_hosted/{name}/2026-06-01"
        doc["commercial"]["price_version"] = f"gpu-{name}"
        doc["commercial"]["price_micros_per_output_second"] = micros
        doc["max_concurrency"] = 1000  # capacity stays ~1 for both: only quality may move
        doc["native"]["model"] = name
        if priors and name in priors:
            doc["quality_prior"] = priors[name]
        out.append(doc)
    return out


def spec(tenant: str, seconds: int, content: ContentTags = NO_TAGS) -> GenerationSpec:
    return GenerationSpec(
        tenant_id=tenant,
        prompt="a red fox in snow",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=seconds * 1000),
        content=content,
    )


class Ticks:
    """A monotonic clock the test moves past the book's refresh interval."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _route(dispatcher: Dispatcher, db: Database, s: GenerationSpec) -> dict[str, Any]:
    """Dispatch one new task of `s`; the selected id and each candidate's quality component."""
    async with db.unit(NOW) as u:
        task, _ = await u.create_task(
            s, idempotency_key=f"route-{s.tenant_id}", spec_hash=normalized_spec_hash(s)
        )
    result = await dispatch_one(dispatcher, task)
    assert result.outcome is DispatchOutcome.SELECTED
    assert result.decision is not None
    snapshot = result.decision.to_json()
    quality = {c["id"]: c["components"]["quality"] for c in snapshot["candidates"]}
    return {"selected": result.decision.selected, "quality": quality}


async def _dispatcher(
    db: Database,
    catalogs: CatalogQueries,
    monitor: HealthMonitor,
    docs: list[dict[str, Any]],
) -> tuple[Dispatcher, QualityBook, Ticks]:
    """A dispatcher over `docs` published for the one GPU account, with its quality book."""
    await publish_documents(db, docs, [ACCOUNT], now=NOW, source="test")
    caps = expand_for_accounts([parse_entry(d) for d in docs], [("gpu-a", "us")])
    ticks = Ticks()
    book = QualityBook(db, refresh_s=REFRESH_S, monotonic=ticks)
    dispatcher = Dispatcher(
        db=db,
        catalogs=catalogs,
        leases=MemoryLeaseStore(),
        adapters=CompilingAdapter(capabilities=caps).for_providers(["self_hosted"]),  # type: ignore[arg-type]  # a compile-only double of AdapterClient
        monitor=monitor,
        router=RouterConfig(policy=example_policy("router-v17")),
        leader=LocalLock("quality-routing"),
        config=DispatcherConfig(),
        clock=lambda: NOW,
        quality=book,
    )
    return dispatcher, book, ticks


async def _reject(db: Database, s: GenerationSpec, model: str, n: int) -> None:
    """`n` SUCCEEDED tasks of `s` made by `model`, each rejected by its caller."""
    service = QualityService(db, clock=lambda: NOW)
    gpu = await account_id(db, "self_hosted", "gpu-a")
    for i in range(n):
        done = await task_in(db, s, f"feed-{model}-{i}", NOW, account=gpu, model=model)
        assert done.state is TaskState.SUCCEEDED
        feedback = FeedbackInput(str(done.id), verdict=Verdict.REJECTED)
        assert await service.submit_feedback(feedback, Caller.tenant(s.tenant_id))


async def test_rejections_in_one_bucket_move_routing_away_in_that_bucket_only(
    db: Database, catalogs: CatalogQueries, monitor: HealthMonitor
) -> None:
    """After 60 rejections of wan-a in bucket X, X routes to wan-b; bucket Y stays on wan-a."""
    dispatcher, book, ticks = await _dispatcher(db, catalogs, monitor, _documents())
    x, y = spec("base-x", 4), spec("base-y", 8)
    assert bucket_key(x) != bucket_key(y)
    before_x, before_y = await _route(dispatcher, db, x), await _route(dispatcher, db, y)
    assert before_x["selected"] == before_y["selected"] == A
    assert before_x["quality"] == {A: 0.5, B: 0.5}

    await _reject(db, spec("feed", 4), "wan-a", 60)
    # Within the refresh interval the round still reads the aggregates it had.
    stale = await _route(dispatcher, db, spec("stale-x", 4))
    assert stale["selected"] == A
    reads = book.reads
    ticks.now += REFRESH_S
    after_x = await _route(dispatcher, db, spec("after-x", 4))
    after_y = await _route(dispatcher, db, spec("after-y", 8))
    assert book.reads == reads + 1  # the second round is within the interval: no new read
    assert after_x["selected"] == B
    assert after_x["quality"][A] < 0.25
    assert after_x["quality"][B] == 0.5
    assert after_y["selected"] == A
    assert after_y["quality"] == {A: 0.5, B: 0.5}


ANIME = ContentTags(style=Style.ANIME)


async def test_rejections_in_one_tag_bucket_move_routing_in_that_tag_only(
    db: Database, catalogs: CatalogQueries, monitor: HealthMonitor
) -> None:
    """After 60 rejections of wan-a's anime clips, anime tasks route to wan-b while untagged
    tasks of the same output (and photorealistic ones) stay on wan-a at the prior."""
    dispatcher, _, ticks = await _dispatcher(db, catalogs, monitor, _documents())
    anime, untagged = spec("anime", 4, ANIME), spec("plain", 4)
    photo = spec("photo", 4, ContentTags(style=Style.PHOTOREALISTIC))
    assert len({bucket_key(anime), bucket_key(untagged), bucket_key(photo)}) == 3
    before = await _route(dispatcher, db, anime)
    assert before["selected"] == A
    assert before["quality"] == {A: 0.5, B: 0.5}

    await _reject(db, spec("feed", 4, ANIME), "wan-a", 60)
    ticks.now += REFRESH_S
    after_anime = await _route(dispatcher, db, spec("after-anime", 4, ANIME))
    after_plain = await _route(dispatcher, db, spec("after-plain", 4))
    after_photo = await _route(
        dispatcher, db, spec("after-photo", 4, ContentTags(style=Style.PHOTOREALISTIC))
    )
    assert after_anime["selected"] == B
    assert after_anime["quality"][A] < 0.25
    assert after_plain["selected"] == after_photo["selected"] == A
    assert after_plain["quality"] == after_photo["quality"] == {A: 0.5, B: 0.5}


async def test_the_capability_prior_routes_before_evidence_and_evidence_overrides_it(
    db: Database, catalogs: CatalogQueries, monitor: HealthMonitor
) -> None:
    """wan-b's document gives it a 0.9 quality prior: with no evidence at all it outranks the
    cheaper wan-a (default prior 0.5); rejections of wan-b in one bucket pull it below its prior
    there and routing returns to wan-a in that bucket only."""
    docs = _documents({"wan-b": 0.9})
    dispatcher, book, ticks = await _dispatcher(db, catalogs, monitor, docs)
    first = await _route(dispatcher, db, spec("prior-x", 4))
    assert book.reads == 1
    assert first["quality"] == {A: 0.5, B: 0.9}
    assert first["selected"] == B

    await _reject(db, spec("feed", 4), "wan-b", 60)
    ticks.now += REFRESH_S
    x = await _route(dispatcher, db, spec("evidence-x", 4))
    y = await _route(dispatcher, db, spec("evidence-y", 8))
    assert x["quality"][B] < 0.5
    assert x["selected"] == A
    assert y["quality"] == {A: 0.5, B: 0.9}
    assert y["selected"] == B
    # The admin's GetQuality scores the same evidence against the same prior.
    rows = await QualityService(db, clock=lambda: NOW).get_quality("wan-b", Caller.admin())
    in_x = next(r for r in rows if r.bucket == bucket_key(spec("any", 4)))
    assert in_x.estimate.score == pytest.approx(x["quality"][B])
