"""The contract suite's fixtures and hooks: targets, capability selection, goldens, summary.

Registered by the ``vidroute_contract`` pytest plugin (`plugin`) when ``--vidroute-adapter`` is
given, or bound in a conftest that runs adapters itself or adds tests of its own::

    from adapter_sidecars.contract.fixtures import *  # noqa: F403

Every test that uses an adapter fixture is parametrized over the targets
(``pytest_contract_targets``). A test marked ``@pytest.mark.contract_requires("flag", other=False)``
is *deselected* for a target whose profile does not have those flag values, and the terminal
summary says which flag deselected what: tests that do not apply are never run and skipped.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapter_sidecars.contract.driver import AdapterDriver
from adapter_sidecars.contract.emulator_admin import EmulatorAdmin, EmulatorAdminError
from adapter_sidecars.contract.golden import GoldenBook, goldens_root
from adapter_sidecars.contract.plugin import MARKER, option
from adapter_sidecars.contract.profile import AdapterProfile, ProfileError, load_profile
from adapter_sidecars.contract.target import ContractTarget, Endpoints
from adapter_sidecars.contract.timings import TimingsError, with_adapter_config
from vidroute.adapter.v1 import adapter_service_pb2_grpc

__all__ = [
    "adapter",
    "adapter_channel",
    "adapter_profile",
    "adapter_stub",
    "contract_endpoints",
    "contract_target",
    "emulator",
    "golden_book",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_contract_targets",
    "pytest_generate_tests",
    "pytest_terminal_summary",
    "targets_from_options",
    "unresolvable_adapter_stub",
]

_TARGETS = pytest.StashKey[list[ContractTarget]]()
_DESELECTED = pytest.StashKey[Counter[str]]()
_GOLDENS_WRITTEN = pytest.StashKey[list[Path]]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_DESELECTED] = Counter()
    config.stash[_GOLDENS_WRITTEN] = []


@pytest.hookimpl(trylast=True)
def pytest_contract_targets(config: pytest.Config) -> list[ContractTarget] | None:
    """Default: the one adapter named on the command line."""
    return targets_from_options(config)


def targets_from_options(config: pytest.Config) -> list[ContractTarget]:
    """The one target of ``--vidroute-adapter/-emulator/-profile`` (UsageError if incomplete).

    With ``--vidroute-adapter-config FILE`` the profile's timings (``submit_read_timeout_s``,
    ``recovery_settle_s``) are read from the adapter's own configuration file, scaled by
    ``VIDROUTE_TIME_SCALE`` exactly as the sidecar scales them.
    """
    adapter, emulator, profile = (option(config, o) for o in ("adapter", "emulator", "profile"))
    if not (adapter and emulator and profile):
        raise pytest.UsageError(
            "the adapter contract suite needs --vidroute-adapter HOST:PORT, --vidroute-emulator "
            "URL and --vidroute-profile NAME|FILE (or a conftest implementing "
            "pytest_contract_targets)"
        )
    try:
        loaded = load_profile(profile)
        adapter_config = option(config, "adapter_config")
        if adapter_config:
            loaded = with_adapter_config(loaded, Path(adapter_config))
    except (ProfileError, TimingsError) as exc:
        raise pytest.UsageError(str(exc)) from exc
    features = {"unresolvable_adapter"} if option(config, "unresolvable_adapter") else set()
    return [ContractTarget(loaded, frozenset(features))]


def _targets(config: pytest.Config) -> list[ContractTarget]:
    if _TARGETS not in config.stash:
        config.stash[_TARGETS] = list(config.hook.pytest_contract_targets(config=config) or [])
    return config.stash[_TARGETS]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "contract_target" not in metafunc.fixturenames:
        return
    targets = _targets(metafunc.config)
    metafunc.parametrize(
        "contract_target", targets, ids=[t.id for t in targets], indirect=True, scope="session"
    )


def _unmet(item: pytest.Item, target: ContractTarget) -> str | None:
    for mark in item.iter_markers(MARKER):
        for flag in mark.args:
            if not target.has(flag):
                return f"{flag}=False"
        for flag, wanted in mark.kwargs.items():
            if target.has(flag) != wanted:
                return f"{flag}={not wanted}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    reasons = config.stash.setdefault(_DESELECTED, Counter())
    for item in items:
        callspec = getattr(item, "callspec", None)
        target = callspec.params.get("contract_target") if callspec is not None else None
        reason = _unmet(item, target) if isinstance(target, ContractTarget) else None
        if reason is None:
            keep.append(item)
        else:
            dropped.append(item)
            reasons[f"{target.id}: {reason}"] += 1  # type: ignore[union-attr]  # reason is set only when target is a ContractTarget
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    reasons = config.stash.get(_DESELECTED, Counter())
    if reasons:
        terminalreporter.section("adapter contract: deselected by capability flags")
        for reason, count in sorted(reasons.items()):
            terminalreporter.write_line(f"{reason}: {count} test(s) do not apply")
    written = config.stash.get(_GOLDENS_WRITTEN, [])
    if written:
        terminalreporter.section("adapter contract: golden files written")
        for path in written:
            terminalreporter.write_line(str(path))


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def contract_target(request: pytest.FixtureRequest) -> ContractTarget:
    """The adapter under test (parametrized over every target)."""
    return request.param  # type: ignore[no-any-return]  # request.param is Any; pytest parametrizes it with targets


@pytest.fixture(scope="session")
def adapter_profile(contract_target: ContractTarget) -> AdapterProfile:
    """The profile of the adapter under test: models, routes and capability flags."""
    return contract_target.profile


#: How long the suite waits for an adapter and emulator started just before it (``&``).
READY_DEADLINE_S = 30.0


def _adapter_status(address: str) -> str:
    """SERVING / NOT_SERVING / ... of the adapter's gRPC health, "no answer" when it is not up;
    an adapter without the health service counts as SERVING once it answers at all."""
    with _channel(address) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return "SERVING"
            return "no answer"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def wait_ready(endpoints: Endpoints, deadline_s: float = READY_DEADLINE_S) -> None:
    """Block until the adapter's gRPC health is SERVING and the emulator's admin API answers,
    so the suite can follow ``python -m ... &`` directly; a clear error after `deadline_s`."""
    try:
        with EmulatorAdmin(endpoints.emulator) as admin:
            admin.wait_reachable(deadline_s)
    except EmulatorAdminError as exc:
        pytest.exit(
            f"emulator {endpoints.emulator} not reachable after {deadline_s:g} s: {exc}",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
    deadline = time.monotonic() + deadline_s
    last = _adapter_status(endpoints.adapter)
    while last != "SERVING" and time.monotonic() < deadline:
        time.sleep(0.1)
        last = _adapter_status(endpoints.adapter)
    if last != "SERVING":
        pytest.exit(
            f"adapter {endpoints.adapter} not SERVING after {deadline_s:g} s (last: {last}); "
            "is the sidecar running and its provider (the emulator) reachable?",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


@pytest.fixture(scope="session")
def contract_endpoints(
    request: pytest.FixtureRequest, contract_target: ContractTarget
) -> Endpoints:
    """Addresses from the command line, once both answer; a harness conftest overrides this to
    start processes."""
    config = request.config
    endpoints = Endpoints(
        adapter=str(option(config, "adapter")),
        emulator=str(option(config, "emulator")),
        unresolvable_adapter=option(config, "unresolvable_adapter"),
    )
    wait_ready(endpoints, float(option(config, "ready_timeout") or READY_DEADLINE_S))
    return endpoints


def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[("grpc.enable_retries", 0)])


@pytest.fixture(scope="session")
def adapter_channel(contract_endpoints: Endpoints) -> Iterator[grpc.Channel]:
    with _channel(contract_endpoints.adapter) as channel:
        yield channel


@pytest.fixture(scope="session")
def adapter_stub(
    adapter_channel: grpc.Channel,
) -> adapter_service_pb2_grpc.ProviderAdapterServiceStub:
    """A ProviderAdapterService stub on the adapter under test."""
    return adapter_service_pb2_grpc.ProviderAdapterServiceStub(adapter_channel)


@pytest.fixture(scope="session")
def unresolvable_adapter_stub(
    contract_endpoints: Endpoints,
) -> Iterator[adapter_service_pb2_grpc.ProviderAdapterServiceStub]:
    """A stub on the same adapter configured with an unresolvable provider host."""
    if contract_endpoints.unresolvable_adapter is None:
        raise pytest.UsageError("test needs contract_requires('unresolvable_adapter')")
    with _channel(contract_endpoints.unresolvable_adapter) as channel:
        yield adapter_service_pb2_grpc.ProviderAdapterServiceStub(channel)


@pytest.fixture
def adapter(
    adapter_stub: adapter_service_pb2_grpc.ProviderAdapterServiceStub,
    adapter_profile: AdapterProfile,
    emulator: EmulatorAdmin,
) -> AdapterDriver:
    """The adapter under test, driven the way the control plane drives it.

    It depends on `emulator` so every test starts against a provider with no jobs and no
    faults: a job left running by an earlier test could otherwise count against the
    provider's concurrency limit and change this test's states.
    """
    return AdapterDriver(adapter_stub, adapter_profile)


@pytest.fixture
def emulator(contract_endpoints: Endpoints) -> Iterator[EmulatorAdmin]:
    """The emulator's admin API, reset before the test so its truth holds only this test's jobs."""
    with EmulatorAdmin(contract_endpoints.emulator) as admin:
        admin.reset()
        yield admin
        admin.wait_reachable()  # a refuse_connection fault must be over before the next test
        admin.clear_faults()


@pytest.fixture
def golden_book(request: pytest.FixtureRequest, adapter: AdapterDriver) -> GoldenBook:
    """Golden files of the adapter under test (rewritten with --update-goldens)."""
    config = request.config
    root = goldens_root(option(config, "goldens_dir"), Path(config.rootpath), adapter.profile)
    written = config.stash.setdefault(_GOLDENS_WRITTEN, [])
    return GoldenBook(
        adapter, root / adapter.profile.name, bool(option(config, "update_goldens")), written
    )
