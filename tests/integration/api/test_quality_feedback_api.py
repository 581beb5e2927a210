"""RoutingService.SubmitFeedback and GetQuality over a real gRPC server with bearer tokens, on
SQLite and PostgreSQL: validation (every field violation at once, nothing written), tenant
scoping (another tenant's task is NOT_FOUND), the SUCCEEDED precondition, idempotency per
(task, verdict) with a changed verdict moving the counters, and GetQuality's admin role."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from sqlalchemy import select

from controlplane.api.auth import Authenticator, hash_token, new_token, parse_entries
from controlplane.api.routing_servicer import RoutingServicer
from controlplane.api.servicer import SchedulerServicer
from controlplane.domain.quality import bucket_key
from controlplane.domain.states import TaskState
from controlplane.metrics import ControlPlaneMetrics
from controlplane.persistence import quality as store
from controlplane.persistence.database import Database
from controlplane.persistence.models import quality_aggregates
from controlplane.scheduling.quality_book import QualityBook
from controlplane.server import ROUTING_SERVICE, ControlPlaneServer, start_server
from controlplane.service.quality import QualityService
from controlplane.service.tasks import TaskService
from tests.support.quality_tasks import task_in
from vidroute.scheduler.v1 import routing_pb2 as rpb
from vidroute.scheduler.v1 import routing_service_pb2 as api
from vidroute.scheduler.v1 import routing_service_pb2_grpc
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

pytestmark = pytest.mark.timeout(120)
CLOCK = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ACCEPTED, REJECTED = rpb.FEEDBACK_VERDICT_ACCEPTED, rpb.FEEDBACK_VERDICT_REJECTED


def spec(tenant: str) -> GenerationSpec:
    return GenerationSpec(
        tenant_id=tenant,
        prompt="a fox",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=4000),
    )


@dataclass
class Api:
    stub: Any
    tokens: dict[str, str]
    db: Database
    account: int

    def md(self, who: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.tokens[who]}"),)

    async def feedback(self, who: str, task_id: str, verdict: int, **kw: Any) -> bool:
        answer = await self.stub.SubmitFeedback(
            api.SubmitFeedbackRequest(task_id=task_id, verdict=verdict, **kw),  # type: ignore[arg-type]  # kw are the request's other fields, typed Any
            metadata=self.md(who),
        )
        return bool(answer.recorded)

    async def task(self, tenant: str, key: str, state: TaskState = TaskState.SUCCEEDED) -> str:
        record = await task_in(
            self.db, spec(tenant), key, CLOCK, account=self.account, model="gen4.5", state=state
        )
        return str(record.id)

    async def counts(self) -> dict[str, tuple[int, int, int]]:
        async with self.db.reading() as conn:
            rows = await store.aggregates(conn)
        return {k[3]: (c.accepted, c.rejected, c.regenerated) for k, c in rows.items()}


@pytest.fixture
async def routing(db: Database) -> AsyncIterator[Api]:
    tokens = {"alpha": new_token(), "beta": new_token(), "admin": new_token()}
    entries = parse_entries(
        [
            f"{hash_token(tokens['alpha'])}=tenant:alpha",
            f"{hash_token(tokens['beta'])}=tenant:beta",
            f"{hash_token(tokens['admin'])}=admin",
        ]
    )

    async def probe() -> bool:
        await db.ping()
        return True

    async with db.unit(CLOCK) as u:
        account = await u.create_provider_account(
            provider="runway", account_name="prod-us", region="us", credential_ref="kms://r"
        )
    running: ControlPlaneServer = await start_server(
        SchedulerServicer(TaskService(db)),
        listen="127.0.0.1:0",
        probe=probe,
        auth=Authenticator(entries),
        routing=RoutingServicer(quality=QualityService(db, clock=lambda: CLOCK)),
    )
    assert ROUTING_SERVICE in running.services
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield Api(routing_service_pb2_grpc.RoutingServiceStub(channel), tokens, db, account)
    await running.stop(grace=1)


async def _error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def _details(exc: grpc.aio.AioRpcError) -> status_pb2.Status:
    raw = dict(exc.trailing_metadata() or ())["grpc-status-details-bin"]
    return status_pb2.Status.FromString(raw)


def _violations(exc: grpc.aio.AioRpcError) -> dict[str, str]:
    bad = error_details_pb2.BadRequest()
    assert _details(exc).details[0].Unpack(bad)
    return {v.field: v.description for v in bad.field_violations}


async def test_bad_feedback_names_every_field_and_writes_nothing(routing: Api) -> None:
    """A missing verdict, a bad task id, 17 tags, an empty and a 65-character tag and a long
    comment are one INVALID_ARGUMENT listing each field; so is a NUL in a tag, the comment or
    GetQuality's model (never a database error); nothing is counted."""
    request = api.SubmitFeedbackRequest(
        task_id="12x", tags=["ok"] * 15 + ["", "t" * 65], comment="c" * 1001
    )
    exc = await _error(routing.stub.SubmitFeedback(request, metadata=routing.md("alpha")))
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(_violations(exc)) == {
        "task_id",
        "verdict",
        "tags",
        "tags[15]",
        "tags[16]",
        "comment",
    }
    # Text the database cannot store (NUL) names its field too, never a database error.
    task = await routing.task("alpha", "n-1")
    request = api.SubmitFeedbackRequest(
        task_id=task, verdict=ACCEPTED, tags=["a\x00b"], comment="\x00"
    )
    exc = await _error(routing.stub.SubmitFeedback(request, metadata=routing.md("alpha")))
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(_violations(exc)) == {"tags[0]", "comment"}
    exc = await _error(
        routing.stub.GetQuality(api.GetQualityRequest(model="m\x00"), metadata=routing.md("admin"))
    )
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(_violations(exc)) == {"model"}
    assert await routing.counts() == {}


async def test_feedback_is_scoped_to_the_callers_tenant(routing: Api) -> None:
    """beta's verdict on alpha's task is NOT_FOUND, exactly as an id that does not exist;
    alpha's own verdict is recorded against the model in the task's bucket and the whole mode."""
    task = await routing.task("alpha", "a-1")
    for task_id in (task, "999999"):
        exc = await _error(routing.stub.SubmitFeedback(
            api.SubmitFeedbackRequest(task_id=task_id, verdict=REJECTED),
            metadata=routing.md("beta"),
        ))  # fmt: skip
        assert exc.code() == grpc.StatusCode.NOT_FOUND
    assert await routing.counts() == {}
    assert await routing.feedback("alpha", task, REJECTED, tags=["motion"]) is True
    assert await routing.counts() == {bucket_key(spec("alpha")): (0, 1, 0), "": (0, 1, 0)}


async def test_feedback_needs_a_succeeded_task(routing: Api) -> None:
    """A task still running or queued is FAILED_PRECONDITION TASK_NOT_SUCCEEDED with its state."""
    for key, state in (("r-1", TaskState.SUBMITTING), ("q-1", TaskState.QUEUED)):
        task = await routing.task("alpha", key, state)
        exc = await _error(routing.stub.SubmitFeedback(
            api.SubmitFeedbackRequest(task_id=task, verdict=ACCEPTED),
            metadata=routing.md("alpha"),
        ))  # fmt: skip
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
        info = error_details_pb2.ErrorInfo()
        assert _details(exc).details[0].Unpack(info)
        assert (info.reason, info.metadata["state"]) == ("TASK_NOT_SUCCEEDED", state.value)
    assert await routing.counts() == {}


async def test_feedback_is_idempotent_per_task_and_verdict(routing: Api) -> None:
    """The same verdict twice counts once (recorded false the second time); a changed verdict
    replaces the first, moving its count, and the admin reads it back with ratios."""
    task = await routing.task("alpha", "i-1")
    other = await routing.task("alpha", "i-2")
    bucket = bucket_key(spec("alpha"))
    assert await routing.feedback("alpha", task, REJECTED) is True
    assert await routing.feedback("alpha", task, REJECTED, comment="again") is False
    assert (await routing.counts())[bucket] == (0, 1, 0)
    assert await routing.feedback("alpha", task, ACCEPTED) is True
    assert await routing.feedback("alpha", other, rpb.FEEDBACK_VERDICT_REGENERATED) is True
    assert (await routing.counts())[bucket] == (1, 0, 1)
    exc = await _error(
        routing.stub.GetQuality(api.GetQualityRequest(), metadata=routing.md("alpha"))
    )
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
    answer = await routing.stub.GetQuality(
        api.GetQualityRequest(model="gen4.5"), metadata=routing.md("admin")
    )
    rows = {b.bucket: b for b in answer.buckets}
    assert set(rows) == {"", bucket}
    row = rows[bucket]
    assert (row.provider, row.model, row.mode) == ("runway", "gen4.5", "TEXT_TO_VIDEO")
    assert (row.accepted, row.rejected, row.regenerated) == (1, 0, 1)
    assert (row.user_acceptance_ratio, row.regeneration_ratio) == (0.5, 0.5)
    # One acceptance of two verdicts against a 0.5 prior: the score stays the prior.
    assert row.score == pytest.approx(0.5)
    assert row.score_low < row.score < row.score_high
    none = await routing.stub.GetQuality(
        api.GetQualityRequest(model="other"), metadata=routing.md("admin")
    )
    assert list(none.buckets) == []


async def test_quality_book_sets_the_ratio_gauges_from_the_aggregates(routing: Api) -> None:
    """One read of the aggregates sets model_user_acceptance_ratio and model_regeneration_ratio
    per provider/model/mode from the whole-mode verdicts; reads within the interval are cached."""
    for n, verdict in enumerate((ACCEPTED, ACCEPTED, REJECTED, rpb.FEEDBACK_VERDICT_REGENERATED)):
        assert await routing.feedback("alpha", await routing.task("alpha", f"g-{n}"), verdict)
    metrics = ControlPlaneMetrics()
    book = QualityBook(routing.db, refresh_s=60.0, sink=metrics.quality_ratios)
    table = await book.table()
    assert await book.table() is table
    assert book.reads == 1
    labels = {"provider": "runway", "model": "gen4.5", "mode": "TEXT_TO_VIDEO"}
    sample = metrics.registry.get_sample_value
    assert sample("model_user_acceptance_ratio", labels) == 0.5
    assert sample("model_regeneration_ratio", labels) == 0.25


NASTY = [
    "", "1", "0", "-1", "9" * 30, "a" * 64, "a" * 65, "x\x00y", "é", " ", "\u202e",
    "ﷺ" * 50, "motion", "x" * 1001,
]  # fmt: skip
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED}


async def test_random_feedback_never_fails_internally(routing: Api) -> None:
    """300 seeded random SubmitFeedback / GetQuality calls (real and forged task ids, unknown
    verdict numbers, nasty tags and comments, tenants and the admin) answer OK or a deliberate
    code, never INTERNAL or UNKNOWN; the counters hold exactly one verdict per task answered OK."""
    rng = random.Random(14)
    tasks = [await routing.task("alpha", f"f-{n}") for n in range(4)]
    last: dict[str, int] = {}
    codes: set[grpc.StatusCode] = set()
    for _ in range(300):
        who = rng.choice(["alpha", "beta", "admin"])
        feedback = rng.random() >= 0.15
        if not feedback:
            call = routing.stub.GetQuality(
                api.GetQualityRequest(model=rng.choice(NASTY)), metadata=routing.md(who)
            )
        else:
            task_id = rng.choice([*tasks, *NASTY])
            verdict = rng.choice([0, 1, 2, 3, 4, 99, -5])
            tags = [rng.choice(NASTY) for _ in range(rng.choice([0, 1, 3, 17]))]
            call = routing.stub.SubmitFeedback(
                api.SubmitFeedbackRequest(
                    task_id=task_id,
                    verdict=verdict,  # type: ignore[arg-type]  # unknown numbers on purpose
                    tags=tags,
                    comment=rng.choice(NASTY),
                ),
                metadata=routing.md(who),
            )
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            codes.add(exc.code())
            continue
        if feedback and task_id in tasks and verdict in {1, 2, 3}:
            last[task_id] = verdict
    assert not codes & FORBIDDEN
    assert last  # some calls were answered OK and counted
    assert grpc.StatusCode.INVALID_ARGUMENT in codes
    assert grpc.StatusCode.NOT_FOUND in codes
    whole = (await routing.counts()).get("", (0, 0, 0))
    assert sum(whole) == len(last)
    assert whole == tuple(sum(1 for v in last.values() if v == n) for n in (1, 2, 3))


async def test_only_bucket_rows_are_stored_and_the_whole_mode_is_their_sum(routing: Api) -> None:
    """Verdicts on tasks of two tag buckets write one counter row per bucket and none shared
    by the model's whole mode; the aggregates (and GetQuality) report the whole mode as the
    sum of the buckets."""
    short = spec("alpha")
    long = GenerationSpec(
        tenant_id="alpha",
        prompt="a fox",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1920, height=1080, duration_ms=12_000),
    )
    verdicts = [(short, ACCEPTED), (short, REJECTED), (long, ACCEPTED)]
    for n, (task_spec, verdict) in enumerate(verdicts):
        made = await task_in(
            routing.db, task_spec, f"w-{n}", CLOCK, account=routing.account, model="gen4.5"
        )
        assert await routing.feedback("alpha", str(made.id), verdict)
    async with routing.db.reading() as conn:
        stored = {r.bucket for r in await conn.execute(select(quality_aggregates.c.bucket))}
    assert stored == {bucket_key(short), bucket_key(long)}
    assert (await routing.counts())[""] == (2, 1, 0)
    answer = await routing.stub.GetQuality(
        api.GetQualityRequest(model="gen4.5"), metadata=routing.md("admin")
    )
    whole = next(b for b in answer.buckets if b.bucket == "")
    assert (whole.accepted, whole.rejected, whole.user_acceptance_ratio) == (2, 1, 2 / 3)
