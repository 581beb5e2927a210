"""The shared adapter contract suite (design 9.25): one suite, every provider adapter.

- `suite`: abstract pytest classes (`CompileContract`, `SubmitBoundaryContract`, ...).
- `plugin`: pytest options (``--adapter``, ``--emulator``, ``--profile``), fixtures and the
  capability-flag selection of tests.
- `profile`: `AdapterProfile`, the description of an adapter the suite needs.
- `emulator_admin`: client of an emulator's fault and truth endpoints.
- `harness`: start an emulator and an adapter sidecar as processes (for CI).
- `cli`: the ``vidroute-contract`` command.

See README.md in this folder for adapter authors.
"""

import pytest

# The suite's assertions live here, not in test files: ask pytest to rewrite them so a failure
# shows the compared values, not just the message. Must run before those modules are imported.
pytest.register_assert_rewrite(
    "adapter_sidecars.contract.compile_contract",
    "adapter_sidecars.contract.driver",
    "adapter_sidecars.contract.golden",
    "adapter_sidecars.contract.lifecycle_contract",
    "adapter_sidecars.contract.recovery_contract",
    "adapter_sidecars.contract.submit_contract",
)
