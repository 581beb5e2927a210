"""A provider answering 5xx gets no more submits after its breaker opens than the probe budget
(issue 20, design 9.15.2-9.15.3), counted by the emulator, on the shipped configuration.

Runway answers every create with 503 (a refused submit: the attempt may be retried on the same
candidate). Twelve tasks pinned to Runway trip the SUBMIT breaker; from then on every send, the
attempts' first sends and their same-candidate retries alike, asks the breaker. So over a window
after the breaker opened the emulator sees, per HALF_OPEN phase the cooldown ladder fits into
the window, ``half_open_max_probes`` creates, and nothing else: each probe fails, the breaker
reopens for the next (longer) cooldown, and the retries queued behind it stay parked.

The window ends half the first cooldown before the earliest instant a third phase could begin:
each cooldown starts only once the previous phase's probe has failed, so no probe can reach the
provider before the ladder's sum, and the time a probe takes to leave (a dispatcher round, a
wake-up, seconds on a machine at load 35) has almost a whole third cooldown of slack before it
could drop a probe out of the window. It starts half the first cooldown after the opening:
creates already on the wire when the breaker opened (admitted while it was CLOSED) land within
milliseconds. Every duration is the control plane's default times `TIME_SCALE` (0.2, so the
cooldowns are long next to a loaded machine's latencies).
"""

from __future__ import annotations

import bisect
import fnmatch
import threading
import time
from collections.abc import Iterator

import pytest

from controlplane.domain.breaker import BreakerConfig
from tests.conftest import PostgresServer
from tests.support.module_stack import module_database, started_platform
from tests.support.stack import ControlPlane, ProviderFarm, wait_for
from tests.support.workload import SUBMIT_ROUTE
from vidroute.scheduler.v1 import scheduler_pb2 as sp
from vidroute.scheduler.v1 import scheduler_service_pb2 as api

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(400)]

TIME_SCALE = 0.2
PROVIDER = "runway"
TASKS = 12


def probes_expected(window_s: float, cooldowns_s: tuple[float, ...], probes: int) -> int:
    """Sends a failing endpoint gets within `window_s` of its breaker opening: `probes` per
    HALF_OPEN phase whose cooldown (the ladder summed up to it) ends inside the window."""
    ended, phases = 0.0, 0
    for n in range(100):
        ended += cooldowns_s[min(n, len(cooldowns_s) - 1)]
        if ended > window_s:
            break
        phases += 1
    return phases * probes


class CreateCounter:
    """Samples the emulator's count of create requests every few milliseconds on a thread, so a
    test can ask how many arrived between two instants (wall clock, as the breaker's)."""

    def __init__(self, farm: ProviderFarm, provider: str) -> None:
        self._emulator = farm.emulator(provider)
        method, _, pattern = SUBMIT_ROUTE[provider].partition(" ")
        self._route = f"{method} {pattern}"
        self.times: list[float] = []
        self.counts: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int:
        counters = self._emulator.call(lambda: dict(self._emulator.emulator.counters))
        return sum(n for key, n in counters.items() if fnmatch.fnmatch(key, self._route))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.counts.append(self.count())
            self.times.append(time.time())
            self._stop.wait(0.005)

    def __enter__(self) -> CreateCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def at(self, instant: float) -> int:
        """Creates counted by the last sample taken at or before `instant`."""
        i = bisect.bisect_right(self.times, instant)
        return self.counts[i - 1] if i else 0

    def between(self, start: float, end: float) -> int:
        return self.at(end) - self.at(start)


@pytest.fixture(scope="module")
def platform(
    postgres_server: PostgresServer, redis_server_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProviderFarm, ControlPlane]]:
    """The Runway emulator and shipped sidecar, a control plane on its defaults."""
    workdir = tmp_path_factory.mktemp("breaker-probes")
    with (
        module_database(postgres_server, "postgresql", workdir) as url,
        started_platform(
            workdir, url, redis_server_url, time_scale=TIME_SCALE, providers=(PROVIDER,)
        ) as (farm, cp, _redis),
    ):
        yield farm, cp


def _submit_breaker(cp: ControlPlane) -> sp.BreakerStatus | None:
    reply = cp._call(
        lambda s: s.GetProviderHealth(api.GetProviderHealthRequest(provider=PROVIDER), timeout=10)
    )
    return next(
        (b for b in reply.breakers if b.operation == "SUBMIT" and b.model != ""),
        None,
    )


def test_an_open_breaker_lets_only_its_probe_budget_reach_a_failing_provider(
    platform: tuple[ProviderFarm, ControlPlane],
) -> None:
    """After the SUBMIT breaker opens on a provider answering 503, the provider receives exactly
    the probes the cooldown ladder allows within the window, not the queued retries."""
    farm, cp = platform
    shipped = BreakerConfig()
    cooldowns = tuple(farm.seconds(c) for c in shipped.cooldowns_s)
    window_s = sum(cooldowns[:3]) - cooldowns[0] / 2
    expected = probes_expected(window_s, cooldowns, shipped.half_open_max_probes)
    assert expected == 2 * shipped.half_open_max_probes  # the ladder's first two phases
    farm.emulator(PROVIDER).add_faults(
        {"route": SUBMIT_ROUTE[PROVIDER], "action": "status", "code": 503, "times": 1_000_000}
    )
    with CreateCounter(farm, PROVIDER) as creates:
        tasks = [cp.create_task(PROVIDER, prompt=f"a failing kite {n}") for n in range(TASKS)]

        def open_breaker() -> sp.BreakerStatus | None:
            status = _submit_breaker(cp)
            return status if status is not None and status.state == sp.BREAKER_STATE_OPEN else None

        opened = wait_for(
            open_breaker, timeout_s=60, interval_s=0.02, what="runway's SUBMIT breaker OPEN"
        )
        seen_at = time.time()
        opened_at = opened.open_until.ToNanoseconds() / 1e9 - cooldowns[0]
        # Seen within its first cooldown: this OPEN is the first (level 0), not a reopening.
        assert opened_at <= seen_at < opened_at + cooldowns[0], (opened_at, seen_at)
        start, end = opened_at + cooldowns[0] / 2, opened_at + window_s
        wait_for(lambda: time.time() > end + 0.5, timeout_s=window_s + 30, what="window over")
        before = creates.at(opened_at)
        sent = creates.between(start, end)
    assert before >= shipped.consecutive_failures, "the breaker opened on fewer failures"
    states = [cp.get_task(t).state for t in tasks]
    assert sent == expected, (
        f"{sent} creates reached {PROVIDER} within {window_s:.1f} s after its breaker opened"
        f" (from +{cooldowns[0] / 2:.1f} s); the ladder {cooldowns} allows {expected}"
        f"\n{cp.logs(80)}"
    )
    assert sp.TASK_STATE_SUCCEEDED not in states
