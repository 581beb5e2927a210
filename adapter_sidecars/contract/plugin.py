"""The ``vidroute_contract`` pytest plugin (entry point ``pytest11``): run the adapter contract
suite with plain pytest, from any directory::

    pytest --vidroute-adapter 127.0.0.1:8061 --vidroute-emulator http://127.0.0.1:8101 \\
        --vidroute-profile runway \\
        --vidroute-adapter-config adapter_sidecars/runway/config.example.yaml

Installed with the package (``vidroute-adapters``' source tree or ``vidroute-adapter-contract``),
so pytest loads it in every run. It is inert unless ``--vidroute-adapter`` is given: it only
adds ``--vidroute-*`` options, the ``contract_requires`` marker and the
``pytest_contract_targets`` hook specification; no fixture, no collection change.

With ``--vidroute-adapter`` it registers the suite's fixtures (`fixtures`) and, when no test
paths are given (or the path is the suite's ``bound.py``), collects the whole suite
(``bound.py``). With paths of your own, bind the suite in your conftest instead
(``from adapter_sidecars.contract.fixtures import *``) and the options still apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapter_sidecars.contract import hooks

MARKER = "contract_requires"
#: The module of the bound suite classes collected by ``pytest --vidroute-adapter ...``.
BOUND = Path(__file__).with_name("bound.py")
SUITE_PLUGIN = "vidroute_contract_suite"
_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("adapter", "HOST:PORT", "gRPC address of an already-running adapter sidecar"),
    ("emulator", "URL", "base URL of the provider emulator the adapter talks to"),
    ("profile", "NAME|FILE", "built-in profile (runway, veo, selfhosted) or a profile YAML file"),
    (
        "adapter-config",
        "FILE",
        "the adapter's configuration file: the suite reads its submit read timeout and recovery "
        "settle time from it (scaled by VIDROUTE_TIME_SCALE, as the sidecar does)",
    ),
    (
        "unresolvable-adapter",
        "HOST:PORT",
        "the same adapter configured with an unresolvable provider host "
        "(enables the DNS-failure boundary test)",
    ),
    (
        "goldens-dir",
        "DIR",
        "folder holding <adapter>/<case>.golden.json (default <rootdir>/tests/testdata)",
    ),
)


def option(config: pytest.Config, name: str) -> Any:
    """The value of ``--vidroute-<name>`` (None when absent or the plugin is not loaded)."""
    return config.getoption("vidroute_" + name.replace("-", "_"), default=None)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vidroute-contract", "vidroute adapter contract suite")
    for name, metavar, help_text in _OPTIONS:
        group.addoption(f"--vidroute-{name}", default=None, metavar=metavar, help=help_text)
    group.addoption(
        "--vidroute-ready-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long to wait for the emulator and the adapter's health SERVING (default 30)",
    )
    group.addoption(
        "--vidroute-update-goldens",
        action="store_true",
        default=False,
        help="rewrite golden files from the adapter's current output",
    )


def _runs_bound_suite(config: pytest.Config) -> bool:
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return True
    return any(Path(arg.split("::")[0]).resolve() == BOUND for arg in config.args)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*flags, **flag_values): run only against adapters whose profile has these "
        "capability flags (or these exact flag values); deselected otherwise",
    )
    if not option(config, "adapter"):
        return
    from adapter_sidecars.contract import fixtures

    fixtures.targets_from_options(config)  # a usage error now, not one per collected class
    if not _runs_bound_suite(config):
        return

    if not config.pluginmanager.has_plugin(SUITE_PLUGIN):
        config.pluginmanager.register(fixtures, SUITE_PLUGIN)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(BOUND)]
