"""Fuzzing every SchedulerService RPC over a real gRPC channel: bad input is a clear error.

An in-process server (the production `start_server`, with its interceptors) on SQLite takes
hypothesis-built requests for CreateTask and every other RPC, plus raw bytes that are not the
request message at all. Every answer must be OK or a deliberate code: never INTERNAL or UNKNOWN,
and never RESOURCE_EXHAUSTED (a BadRequest trailer past the client's metadata limit). Invalid
input must reach nothing behind the API: no task row for a rejected CreateTask (so no dispatcher
could send it to a provider), no call to the canceller (the engine that talks to providers) for
a rejected CancelTask, no forced breaker for a rejected ForceBreaker.

Each hypothesis example is a batch of calls sent concurrently, so the default ~10,000 calls take
well under half a minute; ``VIDROUTE_FUZZ_EXAMPLES`` (total calls) scales the run.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from controlplane.api.servicer import SchedulerServicer
from controlplane.domain.breaker import BreakerConfig, BreakerKey, BreakerRegistry, BreakerState
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.scheduling.health import BreakerStatus, HealthMonitor
from controlplane.server import ControlPlaneServer, start_server
from controlplane.service.providers import ProviderAdminService
from controlplane.service.tasks import MAX_CANCEL_REASON, TaskService, text_violations
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.common.v1 import money_pb2
from vidroute.scheduler.v1 import scheduler_service_pb2 as api
from vidroute.scheduler.v1 import scheduler_service_pb2_grpc as api_grpc

TOTAL_CALLS = int(os.environ.get("VIDROUTE_FUZZ_EXAMPLES", "10500"))
BATCH = 25  # calls per hypothesis example, sent concurrently
# Shares of the total: CreateTask is the widest surface, the rest split the remainder.
SHARES = {"create": 0.45, "ids": 0.2, "list": 0.1, "admin": 0.1, "raw": 0.15}
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED}
SERVICE = "vidroute.scheduler.v1.SchedulerService"
METHODS = [m.name for m in api.DESCRIPTOR.services_by_name["SchedulerService"].methods]


def _examples(share: str) -> int:
    return max(1, round(TOTAL_CALLS * SHARES[share] / BATCH))


class CountingCanceller:
    """Stands in for the execution engine: counts what would have reached a provider."""

    def __init__(self) -> None:
        self.calls = 0
        self.invalid = 0

    async def cancel(self, task_id: int, reason: str = "") -> object:
        self.calls += 1
        if text_violations("reason", reason, MAX_CANCEL_REASON) or not 0 < task_id < 2**63:
            self.invalid += 1
        return None


class CountingMonitor(HealthMonitor):
    def __init__(self, db: Database) -> None:
        super().__init__(BreakerRegistry(BreakerConfig(), clock=__import__("time").time), db=db)
        self.forced = 0

    async def force(
        self, key: BreakerKey, state: BreakerState | None, reason: str
    ) -> BreakerStatus:
        self.forced += 1
        return await super().force(key, state, reason)


@dataclass
class Harness:
    """The server on its own event loop thread, and a blocking client channel to it."""

    channel: grpc.aio.Channel
    stub: api_grpc.SchedulerServiceAsyncStub
    canceller: CountingCanceller
    monitor: CountingMonitor
    db: Database
    loop: asyncio.AbstractEventLoop
    codes: Counter[str] = field(default_factory=Counter)
    rejected_keys: set[str] = field(default_factory=set)
    cancels_passed: int = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 60))


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    # On tmpfs when there is one: thousands of accepted tasks, each a committed transaction,
    # would otherwise spend the time budget in fsync.
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp_path_factory.mktemp("fuzz")
    path = root / "vidroute.db"
    url = f"sqlite+aiosqlite:///{path}"
    # Server and client share one loop, driven by each example's `run`: a client on another
    # thread costs ~3 ms a call in GIL hand-offs, this ~1 ms.
    loop = asyncio.new_event_loop()
    on_loop = loop.run_until_complete

    on_loop(upgrade(url))
    db = Database.from_url(url)
    canceller = CountingCanceller()

    async def build() -> tuple[ControlPlaneServer, CountingMonitor]:
        monitor = CountingMonitor(db)

        async def probe() -> bool:
            await db.ping()
            return True

        admin = ProviderAdminService(CatalogQueries(db), monitor)
        servicer = SchedulerServicer(TaskService(db, canceller=canceller), admin)
        running = await start_server(servicer, listen="127.0.0.1:0", probe=probe, cleanup=[])
        return running, monitor

    running, monitor = on_loop(build())

    async def open_channel() -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")

    channel = on_loop(open_channel())
    try:
        yield Harness(channel, api_grpc.SchedulerServiceStub(channel), canceller, monitor, db, loop)
    finally:
        on_loop(channel.close())
        on_loop(running.stop(grace=1))
        on_loop(db.dispose())
        loop.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _current_loop(harness: Harness) -> Iterator[None]:
    """grpc.aio calls are created outside `run` and look up the current loop; another module's
    asyncio tests may have left none (or a closed one) current."""
    asyncio.set_event_loop(harness.loop)
    yield
    asyncio.set_event_loop(None)


def _check(h: Harness, rpc: str, calls: Sequence[Any]) -> list[grpc.StatusCode]:
    """Run the calls concurrently; their codes, after asserting none is forbidden."""

    async def gather() -> list[Any]:
        return await asyncio.gather(*calls, return_exceptions=True)

    codes = []
    for outcome in h.run(gather()):
        code, details = grpc.StatusCode.OK, cast("str | None", "")
        if isinstance(outcome, grpc.aio.AioRpcError):
            code, details = outcome.code(), outcome.details()
        elif isinstance(outcome, BaseException):
            raise outcome
        assert code not in FORBIDDEN, f"{rpc}: {code} {details!r}"
        h.codes[f"{rpc}:{code.name}"] += 1
        codes.append(code)
    return codes


# ---- strategies ------------------------------------------------------------------------------

# Text that breaks things: NUL and other controls, lone-surrogate-free non-ASCII, digits from
# other scripts, long runs.
nasty = st.text(
    alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FFF, exclude_categories=["Cs"]),
    max_size=40,
)
identifierish = st.one_of(
    st.sampled_from(["", "acme", "runway", "veo", "us-east-1", "a" * 64, "a" * 65, "x\x00y"]),
    nasty,
)
uint32 = st.one_of(st.integers(0, 10_000), st.integers(0, 2**32 - 1))
int64 = st.integers(-(2**63), 2**63 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
enum_number = st.one_of(st.integers(-3, 12), int32)

asset = st.builds(
    gen.AssetRef,
    asset_id=identifierish,
    object_uri=st.one_of(
        st.sampled_from(["https://cdn.example/a.png", "s3://b/a.mp4", "file:///etc/passwd"]),
        nasty,
    ),
    mime_type=st.sampled_from(["", "image/png", "video/mp4", "text/html", "image"]),
    size_bytes=int64,
    checksum_sha256=st.sampled_from(["", "0" * 64, "Z" * 64]),
)


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


@st.composite
def specs(draw: st.DrawFn) -> gen.GenerationSpec:
    msg = gen.GenerationSpec(
        tenant_id=draw(identifierish),
        user_id=draw(identifierish),
        project_id=draw(identifierish),
        prompt=draw(st.one_of(st.just("a red kite over a hill"), nasty)),
        negative_prompt=draw(st.one_of(st.just(""), nasty)),
        mode=gen.Mode.ValueType(draw(st.one_of(st.just(int(gen.MODE_TEXT_TO_VIDEO)), enum_number))),
        safety_profile=draw(identifierish),
        service_class=gen.ServiceClass.ValueType(draw(enum_number)),
        priority=draw(st.one_of(st.integers(-101, 101), int32)),
    )
    for slot in ("first_frame", "last_frame", "source_video"):
        ref = draw(_maybe(asset))
        if ref is not None:
            getattr(msg, slot).CopyFrom(ref)
    # Oversize repeated fields: up to 300 references (the limit is 8).
    count = draw(st.one_of(st.integers(0, 3), st.integers(0, 300)))
    if count:
        one = draw(asset)
        msg.references.extend([one] * count)
    if draw(st.integers(0, 9)):  # mostly present: a missing output block is one violation
        msg.output.CopyFrom(
            gen.OutputSpec(
                width=draw(st.one_of(st.just(1280), uint32)),
                height=draw(st.one_of(st.just(720), uint32)),
                duration_ms=draw(st.one_of(st.just(4000), uint32)),
                fps=draw(uint32),
                with_audio=draw(st.booleans()),
                sample_count=draw(uint32),
            )
        )
    if draw(st.booleans()):
        msg.seed = draw(int64)
    msg.routing.CopyFrom(
        gen.RoutingPolicy(
            mode=gen.RoutingMode.ValueType(draw(enum_number)),
            required_provider=draw(identifierish),
            required_model=draw(identifierish),
            preferred_providers=draw(
                st.one_of(
                    st.lists(identifierish, max_size=4), st.lists(identifierish, max_size=200)
                )
            ),
            max_estimated_cost=money_pb2.Money(
                amount_micros=draw(int64), currency_code=draw(st.sampled_from(["", "USD", "us$"]))
            ),
            max_queue_delay_ms=draw(uint32),
            allow_semantic_degrade=draw(st.booleans()),
            region=draw(identifierish),
        )
    )
    return msg


keys = st.one_of(st.just(""), st.just("k" * 129), nasty, st.just("has space"))
task_ids = st.one_of(
    st.sampled_from(["", "0", "1", "2", "-1", "²", "٣", "1\x00", " 1", "9" * 30, str(2**63)]),
    st.integers(-(2**70), 2**70).map(str),
    nasty,
)
page_tokens = st.one_of(
    st.just(""),
    nasty,
    st.sampled_from(
        ["eyJ2IjoxLCJiZWZvcmUiOjk5OTk5OTk5OTk5OTk5OTk5OTk5OTk5LCJmIjoiIn0", "====", "x" * 600]
    ),
    st.binary(max_size=60).map(lambda b: __import__("base64").urlsafe_b64encode(b).decode()),
)
_key_counter = itertools.count()


# ---- the fuzz tests --------------------------------------------------------------------------

fuzz = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


_STRING_FIELDS = (
    "tenant_id",
    "user_id",
    "project_id",
    "prompt",
    "negative_prompt",
    "safety_profile",
    "routing.required_provider",
    "routing.required_model",
    "routing.region",
    "routing.max_estimated_cost.currency_code",
)
_UINT32_FIELDS = ("output.width", "output.height", "output.duration_ms", "output.fps")
_ENUM_FIELDS = ("mode", "service_class", "routing.mode")
_EDGE_INTS = (-1, 0, 1, 3, 99, 2**31 - 1, -(2**31))


VALID = gen.GenerationSpec(
    tenant_id="acme",
    prompt="a red kite over a green hill",
    mode=gen.MODE_TEXT_TO_VIDEO,
    output=gen.OutputSpec(width=1280, height=720, duration_ms=4000),
)


def _ref_flood(msg: gen.GenerationSpec) -> None:
    msg.references.extend([gen.AssetRef(object_uri="file:///x")] * 300)


_SURELY_BAD: tuple[Any, ...] = (
    lambda m: setattr(m, "tenant_id", "acme\x00"),
    lambda m: setattr(m, "prompt", "\x00"),
    lambda m: setattr(m, "mode", 99),
    lambda m: setattr(m.routing, "mode", -1),
    lambda m: setattr(m.output, "width", 2**32 - 1),
    lambda m: setattr(m, "priority", 2**31 - 1),
    lambda m: m.ClearField("output"),
    lambda m: m.routing.preferred_providers.extend(["p"] * 60),
    _ref_flood,
)


def _target(msg: Any, path: str) -> tuple[Any, str]:
    *parents, name = path.split(".")
    for part in parents:
        msg = getattr(msg, part)
    return msg, name


def mutate(base: gen.GenerationSpec, rnd: Any, pool: Sequence[str]) -> gen.GenerationSpec:
    """A cheap variant of `base`: a few fields set to edge values (drawing a whole spec from
    hypothesis per call costs ~10 ms; this keeps 10,000 calls inside the time budget)."""
    msg = gen.GenerationSpec()
    # One call in twelve is a valid spec, accepted and written (the rejected-writes check needs
    # both kinds; more would spend the budget on SQLite commits); a few more start from the
    # valid spec with one to three fields broken, the rest from hypothesis' `base`.
    if rnd.random() < 0.08:
        msg.CopyFrom(VALID)
        return msg
    msg.CopyFrom(VALID if rnd.random() < 0.25 else base)
    rnd.choice(_SURELY_BAD)(msg)  # every other call is invalid for at least this reason
    for _ in range(rnd.randint(0, 2)):
        kind = rnd.randrange(7)
        if kind == 0:
            holder, name = _target(msg, rnd.choice(_STRING_FIELDS))
            setattr(holder, name, rnd.choice(pool))
        elif kind == 1:
            holder, name = _target(msg, rnd.choice(_UINT32_FIELDS))
            setattr(holder, name, rnd.choice((0, 1, 2**32 - 1, rnd.randrange(2**32))))
        elif kind == 2:
            holder, name = _target(msg, rnd.choice(_ENUM_FIELDS))
            setattr(holder, name, rnd.choice(_EDGE_INTS))
        elif kind == 3:
            del msg.references[:]
            ref = gen.AssetRef(object_uri=rnd.choice(pool), checksum_sha256=rnd.choice(pool))
            msg.references.extend([ref] * rnd.choice((1, 9, 300)))
        elif kind == 4:
            del msg.routing.preferred_providers[:]
            msg.routing.preferred_providers.extend(rnd.choices(pool, k=rnd.choice((1, 17, 60))))
        elif kind == 5:
            msg.priority = rnd.choice(_EDGE_INTS)
            msg.seed = rnd.choice((-1, 0, 2**32, 2**63 - 1))
        else:
            msg.ClearField(rnd.choice(("output", "routing", "first_frame")))
    return msg


@settings(fuzz, max_examples=_examples("create"))
@given(
    base=specs(),
    pool=st.lists(st.one_of(identifierish, nasty), min_size=1, max_size=8),
    seed=st.integers(0, 2**32),
    bad_keys=st.lists(keys, max_size=3),
)
def test_create_task_fuzz(
    harness: Harness,
    base: gen.GenerationSpec,
    pool: list[str],
    seed: int,
    bad_keys: list[str],
) -> None:
    """Any spec and key: OK, INVALID_ARGUMENT or FAILED_PRECONDITION (safety), never a crash."""
    # A seeded PRNG, not st.randoms(): hypothesis steers its randoms towards 0.0, which would
    # make every call the valid one.
    rnd = random.Random(seed)
    requests = []
    for i in range(BATCH):
        # Mostly unique keys, so a rejected request can be traced to "no row written".
        key = bad_keys[i] if i < len(bad_keys) else f"fz-{next(_key_counter)}"
        requests.append(api.CreateTaskRequest(spec=mutate(base, rnd, pool), idempotency_key=key))
    futures = [harness.stub.CreateTask(r, timeout=30) for r in requests]
    codes = _check(harness, "CreateTask", futures)
    for request, code in zip(requests, codes, strict=True):
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            harness.rejected_keys.add(request.idempotency_key)


@settings(fuzz, max_examples=_examples("ids"))
@given(
    batch=st.lists(
        st.tuples(
            st.sampled_from(["GetTask", "CancelTask", "ExplainRoute", "WatchTask"]), task_ids, nasty
        ),
        min_size=BATCH,
        max_size=BATCH,
    )
)
def test_task_id_rpcs_fuzz(harness: Harness, batch: list[tuple[str, str, str]]) -> None:
    """Task ids that are not decimal, overflow int64 or hold NUL; bad cursors and reasons."""
    stub = harness.stub
    futures: dict[str, list[Any]] = {}
    for rpc, task_id, extra in batch:
        fut: Any
        if rpc == "GetTask":
            fut = stub.GetTask(api.GetTaskRequest(task_id=task_id), timeout=30)
        elif rpc == "ExplainRoute":
            fut = stub.ExplainRoute(api.ExplainRouteRequest(task_id=task_id), timeout=30)
        elif rpc == "CancelTask":
            fut = stub.CancelTask(api.CancelTaskRequest(task_id=task_id, reason=extra), timeout=30)
        else:
            fut = _drain(
                stub.WatchTask(
                    api.WatchTaskRequest(task_id=task_id, after_cursor=extra), timeout=30
                )
            )
        futures.setdefault(rpc, []).append(fut)
    for rpc, group in futures.items():
        codes = _check(harness, rpc, group)
        if rpc == "CancelTask":
            # Only a CancelTask that passed validation may reach the canceller (checked last).
            harness.cancels_passed += sum(c is not grpc.StatusCode.INVALID_ARGUMENT for c in codes)


async def _drain(call: Any) -> None:
    """A server stream's first answer: an error status is raised as for a unary call; a live
    task's stream (it never ends while the task is queued) is cancelled after its first event."""
    try:
        async for _ in call:
            break
    finally:
        call.cancel()


@settings(fuzz, max_examples=_examples("list"))
@given(
    batch=st.lists(
        st.builds(
            api.ListTasksRequest,
            tenant_id=identifierish,
            state=enum_number,
            page_size=uint32,
            page_token=page_tokens,
        ),
        min_size=BATCH,
        max_size=BATCH,
    )
)
def test_list_tasks_fuzz(harness: Harness, batch: list[api.ListTasksRequest]) -> None:
    """Unknown states (99, -1), bad page tokens, NUL in the tenant: INVALID_ARGUMENT."""
    _check(harness, "ListTasks", [harness.stub.ListTasks(r, timeout=30) for r in batch])


@settings(fuzz, max_examples=_examples("admin"))
@given(
    batch=st.lists(
        st.builds(
            api.ForceBreakerRequest,
            provider=identifierish,
            account=identifierish,
            region=identifierish,
            model=identifierish,
            operation=st.one_of(st.sampled_from(["", "SUBMIT", "POLL", "submit"]), nasty),
            state=enum_number,
            reason=st.one_of(st.just("drill"), nasty),
        ),
        min_size=BATCH - 2,
        max_size=BATCH - 2,
    ),
    provider=identifierish,
)
def test_admin_rpcs_fuzz(
    harness: Harness, batch: list[api.ForceBreakerRequest], provider: str
) -> None:
    """ForceBreaker, GetProviderHealth and ListProviders with anything in their fields."""
    stub = harness.stub
    before = harness.monitor.forced
    forced = _check(harness, "ForceBreaker", [stub.ForceBreaker(r, timeout=30) for r in batch])
    # Only a request that passed validation may move a breaker.
    assert harness.monitor.forced - before == sum(c is grpc.StatusCode.OK for c in forced)
    health = stub.GetProviderHealth(api.GetProviderHealthRequest(provider=provider), timeout=30)
    _check(harness, "GetProviderHealth", [health])
    _check(
        harness,
        "ListProviders",
        [stub.ListProviders(api.ListProvidersRequest(), timeout=30)],
    )


@settings(fuzz, max_examples=_examples("raw"))
@given(
    batch=st.lists(
        st.tuples(st.sampled_from(METHODS), st.binary(max_size=64)), min_size=BATCH, max_size=BATCH
    )
)
def test_raw_bytes_fuzz(harness: Harness, batch: list[tuple[str, bytes]]) -> None:
    """Bytes that may not parse as the request message: INVALID_ARGUMENT, never UNKNOWN."""
    futures: list[Any] = []
    channel: Any = harness.channel  # no serializers: the request is the raw bytes
    for method, raw in batch:
        path = f"/{SERVICE}/{method}"
        if method == "WatchTask":
            futures.append(_drain(channel.unary_stream(path)(raw, timeout=30)))
        else:
            futures.append(channel.unary_unary(path)(raw, timeout=30))
    _check(harness, "raw", futures)


def test_malformed_bytes_are_invalid_argument(harness: Harness) -> None:
    """A truncated varint and a wrong wire type: INVALID_ARGUMENT, not UNKNOWN."""
    channel: Any = harness.channel
    for raw in (b"\x08", b"\x0a\xff\xff\xff\xff\x0f", b"\xff\xff"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            harness.run(channel.unary_unary(f"/{SERVICE}/CreateTask")(raw, timeout=10))
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid protobuf message" in (err.value.details() or "")


def test_after_the_fuzz_nothing_invalid_was_written(harness: Harness) -> None:
    """Runs last in the module: no rejected CreateTask left a row; totals are what was asked."""

    async def stored_keys() -> set[str]:
        async with harness.db.reading() as conn:
            rows = await conn.execute(text("SELECT idempotency_key FROM generation_tasks"))
            return {r[0] for r in rows}

    written = harness.run(stored_keys())
    assert not harness.rejected_keys & written
    assert harness.canceller.invalid == 0
    assert harness.canceller.calls <= harness.cancels_passed
    total = sum(harness.codes.values())
    assert total >= min(TOTAL_CALLS, 10_000) * 0.9, harness.codes
    assert harness.rejected_keys  # the fuzz did hit validation
