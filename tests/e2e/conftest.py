"""Options and fixtures of the end-to-end tier: sizes of the soak and crash runs, the stack.

    pytest tests/e2e --soak-size 500 --soak-seed 1234      # a long soak, reproducible
    pytest tests/e2e/test_crash.py --crash-rounds 10 --crash-seed 7
    VIDROUTE_SOAK_SIZE=500 VIDROUTE_CRASH_ROUNDS=10 make test   # the same through make
    VIDROUTE_E2E_TIME_SCALE=0.05 pytest tests/e2e              # another (single) time factor

Seeds default to a fresh random value that the test prints (``-s`` or the failure report shows
it); pass it back with ``--soak-seed`` / ``--crash-seed`` to replay a run.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack import DEFAULT_TIME_SCALE, ControlPlane, ProviderFarm, RedisDb

_RUNNING: list[Any] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vidroute e2e")
    soak = int(os.environ.get("VIDROUTE_SOAK_SIZE") or 40)
    rounds = int(os.environ.get("VIDROUTE_CRASH_ROUNDS") or 3)
    group.addoption(
        "--soak-size", type=int, default=soak, help=f"tasks in the soak (default {soak})"
    )
    group.addoption("--soak-seed", type=int, default=None, help="replay a soak seed")
    group.addoption(
        "--crash-rounds",
        type=int,
        default=rounds,
        help=f"SIGKILLs of the control plane (default {rounds})",
    )
    group.addoption("--crash-seed", type=int, default=None, help="replay a crash seed")
    group.addoption(
        "--e2e-sqlite",
        action="store_true",
        help="also run the submit-boundary cases on SQLite (PostgreSQL always runs)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`e2e_backend`: PostgreSQL, plus SQLite with --e2e-sqlite; one stack per backend."""
    if "e2e_backend" in metafunc.fixturenames:
        backends = ["postgresql"]
        if metafunc.config.getoption("e2e_sqlite"):
            backends.append("sqlite")
        metafunc.parametrize("e2e_backend", backends, scope="module")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database of this test's own, once on each backend: SQLite under the test's
    ``var/`` (where a control plane started in `tmp_path` keeps it), or a throwaway PostgreSQL
    database dropped afterwards. Module-scoped stacks use tests.support.module_stack instead."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'var' / 'vidroute.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def redis_db(redis_server_url: str) -> Iterator[RedisDb]:
    """A Redis logical database of this test's own, flushed before and after."""
    with RedisDb(redis_server_url) as db:
        yield db


@pytest.fixture
def farm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProviderFarm]:
    """The three emulators and their sidecar processes, on the run's one time scale: the test
    module's ``TIME_SCALE`` if it has one, else the default; ``VIDROUTE_E2E_TIME_SCALE`` wins.
    """
    scale = getattr(request.module, "TIME_SCALE", DEFAULT_TIME_SCALE)
    if os.environ.get("VIDROUTE_E2E_TIME_SCALE"):
        scale = DEFAULT_TIME_SCALE
    with ProviderFarm(tmp_path / "farm", time_scale=scale) as started:
        _RUNNING.append(started)
        try:
            yield started
        finally:
            _RUNNING.remove(started)


@pytest.fixture
def make_control_plane(tmp_path: Path) -> Iterator[Any]:
    """Build (not start) control planes; every one built is killed at teardown."""
    built: list[ControlPlane] = []

    def make(farm: ProviderFarm, database_url: str, redis_url: str | None) -> ControlPlane:
        workdir = tmp_path / f"cp{len(built)}"
        workdir.mkdir()
        cp = ControlPlane(workdir, farm, database_url=database_url, redis_url=redis_url)
        built.append(cp)
        _RUNNING.append(cp)
        return cp

    yield make
    for cp in built:
        cp.kill()
        _RUNNING.remove(cp)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """This test's random seed (from --soak-seed / --crash-seed, else fresh), printed."""
    option = "--crash-seed" if "crash" in request.node.nodeid else "--soak-seed"
    chosen = request.config.getoption(option)
    value = int(chosen) if chosen is not None else secrets.randbelow(2**31)
    print(f"\n{request.node.nodeid}: seed {value} (replay with {option} {value})")
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """On failure, attach the tails of the control plane and sidecar logs."""
    report = yield
    if report.failed and report.when == "call":
        for thing in _RUNNING:
            report.sections.append((f"{type(thing).__name__} logs", thing.logs()))
    return report
