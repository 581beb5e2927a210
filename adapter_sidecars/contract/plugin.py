"""pytest plugin of the adapter contract suite: options, targets, capability selection, fixtures.

Load it with ``-p adapter_sidecars.contract.plugin`` (the ``vidroute-contract`` command does)
or re-export it from a conftest (``from adapter_sidecars.contract.plugin import *``).

Options: ``--adapter HOST:PORT``, ``--emulator URL``, ``--profile NAME|FILE.yaml``,
``--unresolvable-adapter HOST:PORT`` (enables the DNS boundary test), ``--update-goldens``
and ``--goldens-dir DIR``.

Every test that uses an adapter fixture is parametrized over the targets
(``pytest_contract_targets``). A test marked ``@pytest.mark.contract_requires("flag", other=False)``
is *deselected* for a target whose profile does not have those flag values, and the terminal
summary says which flag deselected what: tests that do not apply are never run and skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from adapter_sidecars.contract import hooks
from adapter_sidecars.contract.driver import AdapterDriver
from adapter_sidecars.contract.emulator_admin import EmulatorAdmin
from adapter_sidecars.contract.golden import GoldenBook
from adapter_sidecars.contract.profile import AdapterProfile, ProfileError, load_profile
from adapter_sidecars.contract.target import ContractTarget, Endpoints
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
    "pytest_addhooks",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_contract_targets",
    "pytest_generate_tests",
    "pytest_terminal_summary",
    "targets_from_options",
    "unresolvable_adapter_stub",
]

MARKER = "contract_requires"
_TARGETS = pytest.StashKey[list[ContractTarget]]()
_DESELECTED = pytest.StashKey[Counter[str]]()
_GOLDENS_WRITTEN = pytest.StashKey[list[Path]]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vidroute-contract", "vidroute adapter contract suite")
    group.addoption(
        "--adapter",
        default=None,
        metavar="HOST:PORT",
        help="gRPC address of an already-running adapter sidecar",
    )
    group.addoption(
        "--emulator",
        default=None,
        metavar="URL",
        help="base URL of the provider emulator the adapter talks to",
    )
    group.addoption(
        "--profile",
        default=None,
        metavar="NAME|FILE",
        help="built-in profile (runway, veo, selfhosted) or a profile YAML file",
    )
    group.addoption(
        "--unresolvable-adapter",
        default=None,
        metavar="HOST:PORT",
        help="the same adapter configured with an unresolvable provider host "
        "(enables the DNS-failure boundary test)",
    )
    group.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite golden files from the adapter's current output",
    )
    group.addoption(
        "--goldens-dir",
        default=None,
        metavar="DIR",
        help="folder holding <adapter>/<case>.golden.json (default tests/testdata)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*flags, **flag_values): run only against adapters whose profile has these "
        "capability flags (or these exact flag values); deselected otherwise",
    )
    config.stash[_DESELECTED] = Counter()
    config.stash[_GOLDENS_WRITTEN] = []


@pytest.hookimpl(trylast=True)
def pytest_contract_targets(config: pytest.Config) -> list[ContractTarget] | None:
    """Default: the one adapter named on the command line."""
    return targets_from_options(config)


def targets_from_options(config: pytest.Config) -> list[ContractTarget]:
    """The one target of ``--adapter``/``--emulator``/``--profile`` (UsageError if incomplete)."""
    adapter, emulator, profile = (
        config.getoption(o, default=None) for o in ("adapter", "emulator", "profile")
    )
    if not (adapter and emulator and profile):
        raise pytest.UsageError(
            "the adapter contract suite needs --adapter HOST:PORT, --emulator URL and "
            "--profile NAME|FILE (or a conftest implementing pytest_contract_targets)"
        )
    try:
        loaded = load_profile(profile)
    except ProfileError as exc:
        raise pytest.UsageError(str(exc)) from exc
    features = (
        {"unresolvable_adapter"}
        if config.getoption("unresolvable_adapter", default=None)
        else set()
    )
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
            reasons[f"{target.id}: {reason}"] += 1  # type: ignore[union-attr]
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
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def adapter_profile(contract_target: ContractTarget) -> AdapterProfile:
    """The profile of the adapter under test: models, routes and capability flags."""
    return contract_target.profile


@pytest.fixture(scope="session")
def contract_endpoints(
    request: pytest.FixtureRequest, contract_target: ContractTarget
) -> Endpoints:
    """Addresses from the command line; a harness conftest overrides this to start processes."""
    config = request.config
    return Endpoints(
        adapter=config.getoption("adapter"),
        emulator=config.getoption("emulator"),
        unresolvable_adapter=config.getoption("unresolvable_adapter", default=None),
    )


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
    base = config.getoption("goldens_dir", default=None)
    root = Path(base) if base else Path(config.rootpath) / "tests" / "testdata"
    written = config.stash.setdefault(_GOLDENS_WRITTEN, [])
    return GoldenBook(
        adapter,
        root / adapter.profile.name,
        bool(config.getoption("update_goldens", default=False)),
        written,
    )
