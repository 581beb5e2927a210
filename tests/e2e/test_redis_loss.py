"""Redis loses every lease under load, twice: a FLUSHALL, then a SIGKILL and restart of a Redis
without persistence. In flight never exceeds capacity and capacity comes back within one
reconcile period.

    pytest tests/e2e/test_redis_loss.py                      # make test: 12 tasks, then 8 more
    VIDROUTE_E2E_REDIS_LOSS_TASKS=60 pytest tests/e2e/test_redis_loss.py -s  # a bigger run by hand

The test starts its own ``redis-server`` (``--save '' --appendonly no``: a restart comes back
empty, like a failover to an empty replica) and runs the control plane process against it and
PostgreSQL, with the Runway and self-hosted emulators behind their sidecars. A sampler thread reads,
every few milliseconds until the end, the attempts PostgreSQL has in flight (9.11.2) and the jobs
the emulators have queued or running, per account and model; neither may ever pass the model's
``max_concurrency``. "Capacity is back" means every account's lease store is live again (the
rebuild from PostgreSQL ran) and new attempts are admitted; it must happen within one
reconcile period.

"Within one period" is counted in reconcile passes, not read off a wall clock: a pass starts at
least once per `UpkeepConfig.interval_s` (a lost account also starts one at once), and the claim
is that the first pass to start after the loss brings every account back -- so once the
control plane's ``provider_lease_reconcile_passes_total`` has grown by two past its value at the
end of the loss (the pass in progress then, and the first that began after it), every account
must be live. The seconds are printed for the reader: on a machine at load 40 a pass's own CPU
work (not scaled by the time factor) takes seconds, so a wall bound of 0.75 s would measure the
machine, not the rebuild.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from controlplane.domain.states import IN_FLIGHT_ATTEMPT_STATES
from controlplane.persistence.db import create_engine
from controlplane.persistence.models import provider_accounts, task_attempts
from controlplane.scheduling.upkeep import UpkeepConfig
from tests.support.evidence import audit
from tests.support.stack import (
    PROVIDERS,
    ROOT,
    ControlPlane,
    ProviderFarm,
    free_port,
    logged_metrics_port,
    wait_for,
)
from tests.support.workload import assert_truth
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute_core.capabilities.loader import load_file

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]
# A hang guard for each wait, not a speed claim: the run's CPU work is not scaled by the time
# factor and a machine at load 40 stretches it twenty-fold (about 200 s at load 18 on two cores).
HANG_GUARD_S = 300.0

USED_PROVIDERS = ("runway", "self_hosted")
TASKS = int(os.environ.get("VIDROUTE_E2E_REDIS_LOSS_TASKS") or 12)
# Slower than the suite's default factor so that one reconcile period (15 s in production) is
# 0.75 s here: long next to a dispatcher round, short next to a job (65 s -> 3.25 s).
TIME_SCALE = 0.05
RECONCILE_PERIOD_S = UpkeepConfig().interval_s * TIME_SCALE
IN_FLIGHT = sorted(s.value for s in IN_FLIGHT_ATTEMPT_STATES)
LIVE_KEYS = "vidroute:live:*"  # the control plane's lease namespace is the default one


def _capacity() -> dict[tuple[str, str], int]:
    """(provider, model) -> max_concurrency from the shipped capability files."""
    out: dict[tuple[str, str], int] = {}
    for path in sorted(ROOT.glob("adapter_sidecars/*/capabilities/*.yaml")):
        for cap in load_file(path):
            out[(cap.provider, cap.model)] = cap.max_concurrency
    return out


class PrivateRedis:
    """A redis-server of this test's own, without persistence, on a free port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not on PATH"
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / f"redis-{self.starts}.log").open("ab")
        self.starts += 1
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_for(self._pong, timeout_s=10, interval_s=0.02, what="private redis-server up")

    def _pong(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=1)

    def kill(self) -> None:
        """SIGKILL: the data is gone with the process (no RDB, no AOF)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.workdir.glob("*.log")))


@dataclass
class Sampler:
    """Samples in-flight attempts (PostgreSQL) and live jobs (emulators) until stopped."""

    database_url: str
    farm: ProviderFarm
    samples: int = 0
    max_db: Counter[tuple[str, str]] = field(default_factory=Counter)
    max_truth: Counter[tuple[str, str]] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)

    async def _run(self) -> None:
        engine = create_engine(self.database_url)
        query = (
            select(provider_accounts.c.provider, task_attempts.c.provider_model)
            .select_from(
                task_attempts.join(
                    provider_accounts,
                    provider_accounts.c.id == task_attempts.c.provider_account_id,
                )
            )
            .where(task_attempts.c.status.in_(IN_FLIGHT))
        )
        try:
            while not self._stop.is_set():
                async with engine.connect() as conn:
                    rows = (await conn.execute(query)).all()
                self._keep(self.max_db, Counter((p, m) for p, m in rows))
                self._keep(self.max_truth, self._live_jobs())
                self.samples += 1
                # An attempt admitted over capacity stays in flight for a whole job (seconds).
                await asyncio.sleep(0.02)
        except Exception as exc:  # reported by the test, never swallowed
            self.errors.append(repr(exc))
        finally:
            await engine.dispose()

    def _live_jobs(self) -> Counter[tuple[str, str]]:
        live: Counter[tuple[str, str]] = Counter()
        for provider in USED_PROVIDERS:
            for _ in range(5):  # the emulator thread may add a job while we copy
                try:
                    jobs = self.farm.truth(provider)
                    break
                except RuntimeError:
                    continue
            else:
                raise RuntimeError(f"could not read {provider} truth")
            for job in jobs:
                if job["phase"] in ("queued", "running"):
                    live[(provider, PROVIDERS[provider].model)] += 1
        return live

    @staticmethod
    def _keep(maxima: Counter[tuple[str, str]], now: Counter[tuple[str, str]]) -> None:
        for key, value in now.items():
            maxima[key] = max(maxima[key], value)


def _submit(cp: ControlPlane, prompts: dict[str, str], count: int) -> None:
    """`count` more tasks, alternating providers, into `prompts` (task id -> prompt)."""
    for _ in range(count):
        i = len(prompts)
        provider = USED_PROVIDERS[i % len(USED_PROVIDERS)]
        prompts[cp.create_task(provider, prompt=f"fox {i}")] = f"fox {i}"


def _admitted_since(cp: ControlPlane, task_ids: Iterable[str], since: datetime) -> bool:
    """Whether any attempt of the tasks was created (admitted) after `since`."""
    return any(
        a.created_at.ToDatetime(tzinfo=UTC) > since
        for t in task_ids
        for a in cp.get_task(t).attempts
    )


def _live_markers(client: redis.Redis) -> set[bytes]:
    try:
        return set(client.scan_iter(match=LIVE_KEYS))
    except redis.RedisError:
        return set()


def _reconcile_passes(metrics_port: int) -> float:
    """The control plane's completed lease reconciliation passes (its /metrics)."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=HANG_GUARD_S).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "provider_lease_reconcile_passes_total"
    )


def _lose_and_measure(
    lose: Callable[[], object],
    client_of: Callable[[], redis.Redis],
    markers: set[bytes],
    metrics_port: int,
) -> tuple[datetime, str]:
    """Run `lose`; wait until every lease account it had is live again, asserting that no
    reconcile pass begun after the loss ended without bringing them back; return when the loss
    ended (Redis serving, empty) and, for the figures, the seconds from then until every account
    was live and the passes that had ended meanwhile."""
    lose()
    lost_at = datetime.now(UTC)
    began = time.monotonic()
    at_loss = _reconcile_passes(metrics_port)
    assert at_loss > 0, "no reconcile pass reported: the count below would prove nothing"
    client = client_of()
    seen: list[float] = []

    def live_again() -> bool:
        # Passes first, markers second: a count read before the markers were found missing
        # means that many passes had ended while they were still missing.
        passes = _reconcile_passes(metrics_port)
        live = _live_markers(client) >= markers
        assert live or passes < at_loss + 2, (
            f"{passes - at_loss:.0f} reconcile passes ended after the loss, "
            "the accounts are still not live"
        )
        seen.append(passes - at_loss)
        return live

    wait_for(
        live_again,
        timeout_s=HANG_GUARD_S,
        interval_s=0.02,
        what="every lease account live again after the loss",
    )
    return lost_at, f"{time.monotonic() - began:.3f}s/{seen[-1]:.0f}passes"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.mark.timeout(1200)
def test_leases_survive_redis_flush_and_restart_under_load(
    tmp_path: Path, fresh_postgres_url: str, private_redis: PrivateRedis
) -> None:
    """Across a FLUSHALL and a restart of an empty Redis under load, in flight never exceeds
    capacity (database and provider truth), and capacity is back within one reconcile period.

    Prints ``FIGURES redis-loss: ...`` with the tasks, the losses and the duplicates (must be 0).
    """
    capacity = _capacity()
    with ProviderFarm(tmp_path / "farm", time_scale=TIME_SCALE, providers=USED_PROVIDERS) as farm:
        cp = ControlPlane(
            tmp_path / "cp",
            farm,
            database_url=fresh_postgres_url,
            redis_url=private_redis.url,
            env={"VIDROUTE_METRICS_LISTEN": "127.0.0.1:0"},
        )
        (tmp_path / "cp").mkdir()
        cp.start()
        assert cp.proc is not None
        metrics_port = logged_metrics_port(cp.proc)
        try:
            with Sampler(fresh_postgres_url, farm) as sampler:
                prompts: dict[str, str] = {}  # task id -> prompt, for the truth check
                _submit(cp, prompts, TASKS)
                client = private_redis.client()
                full = {
                    (p, PROVIDERS[p].model): capacity[(p, PROVIDERS[p].model)]
                    for p in USED_PROVIDERS
                }
                wait_for(
                    lambda: any(sampler.max_db[k] >= cap for k, cap in full.items()),
                    timeout_s=HANG_GUARD_S,
                    interval_s=0.02,
                    what="a model at capacity before the loss",
                )
                markers = _live_markers(client)
                assert len(markers) >= len(USED_PROVIDERS), markers

                # "Capacity is back": an attempt created after the loss ended, not merely one more
                # than before it (which one admitted just before the loss would satisfy).
                lost_at, flush_s = _lose_and_measure(
                    client.flushall, lambda: client, markers, metrics_port
                )
                wait_for(
                    lambda: _admitted_since(cp, prompts, lost_at),
                    timeout_s=HANG_GUARD_S,
                    interval_s=0.05,
                    what="a new attempt admitted after the flush",
                )

                # Under load the first batch can drain while the flush is measured, and with no
                # queued task nothing can be admitted after the restart: queue more than the
                # models' combined capacity first (at load 36 all 12 were admitted before it).
                _submit(cp, prompts, 2 * sum(full.values()))

                def restart() -> None:
                    private_redis.kill()
                    private_redis.start()

                lost_at, restart_s = _lose_and_measure(
                    restart, private_redis.client, markers, metrics_port
                )
                wait_for(
                    lambda: _admitted_since(cp, prompts, lost_at),
                    timeout_s=HANG_GUARD_S,
                    interval_s=0.05,
                    what="a new attempt admitted after the restart",
                )
                tasks = {t: cp.wait_terminal(t, timeout_s=HANG_GUARD_S) for t in prompts}
            truth = assert_truth(farm, tasks, prompts)
            print(
                f"\nFIGURES redis-loss: time_scale={TIME_SCALE} tasks={len(prompts)} "
                f"losses=2 (FLUSHALL, SIGKILL+restart) samples={sampler.samples} "
                f"live_again={flush_s},{restart_s} period_s={RECONCILE_PERIOD_S} "
                f"max_in_flight_db={dict(sampler.max_db)} max_live_jobs={dict(sampler.max_truth)} "
                f"capacity={full} provider_jobs={truth.jobs} duplicates={truth.duplicates}"
            )
            assert not sampler.errors, sampler.errors
            assert sampler.samples > 100
            for key, cap in full.items():
                assert sampler.max_db[key] <= cap, f"{key}: {sampler.max_db[key]} in flight > {cap}"
                assert sampler.max_truth[key] <= cap, (
                    f"{key}: {sampler.max_truth[key]} provider jobs live > {cap}"
                )
            states = Counter(sp.TaskState.Name(t.state) for t in tasks.values())
            assert states == {"TASK_STATE_SUCCEEDED": len(prompts)}, states
            report = audit(fresh_postgres_url, private_redis.url)
            assert report.ok, report.render()
        except BaseException:
            print(cp.logs(), farm.logs(), private_redis.logs(), sep="\n")
            raise
        finally:
            cp.kill()
