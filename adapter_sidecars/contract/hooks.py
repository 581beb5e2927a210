"""Hook specifications of the contract plugin (registered by ``plugin.pytest_addhooks``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from adapter_sidecars.contract.target import ContractTarget


@pytest.hookspec(firstresult=True)
def pytest_contract_targets(config: pytest.Config) -> list[ContractTarget] | None:
    """Return the adapters the suite runs against, or None to defer.

    The plugin's own implementation (tried last) builds one target from ``--adapter``,
    ``--emulator`` and ``--profile``. A conftest that launches adapters itself returns its
    targets here and overrides the ``contract_endpoints`` fixture to start them.
    """
