"""The import graph the deployables promise (issue 9): read from the source with `ast`, so no
module is imported and every import counts, including lazy ones inside functions and those
under ``if TYPE_CHECKING:``.

* ``controlplane`` and ``adapter_sidecars`` never import each other; both import the kernel.
* ``vidroute_core`` imports neither deployable.
* ``controlplane.domain`` imports nothing above it: only the standard library, the kernel and
  itself (not persistence, execution, scheduling, api, adapters or leases).
* The kernel's pure modules (all but ``vidroute_core.wire``) touch no transport or storage
  library: no grpc, protobuf (nor the generated ``vidroute`` protos), sqlalchemy, redis, httpx.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Libraries the kernel's pure modules must not import (top-level package names).
TRANSPORT_AND_STORAGE = ("grpc", "google.protobuf", "vidroute", "sqlalchemy", "redis", "httpx")


def module_name(path: Path) -> str:
    """The dotted module name of a source file under the repository root."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in `source`, anywhere in the tree; a relative
    import is resolved against `module`. ``from a import b`` yields ``a`` and ``a.b`` (b may be
    a submodule), so a rule on ``a.b`` sees it."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def within(name: str, prefix: str) -> bool:
    """Whether module `name` is `prefix` or inside it."""
    return name == prefix or name.startswith(prefix + ".")


def sources(package: str) -> list[Path]:
    """Every module of a top-level package directory."""
    return sorted((ROOT / package.replace(".", "/")).rglob("*.py"))


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    """`file:line imports name` for each import under `package` of a `forbidden` prefix."""
    found = []
    for path in sources(package):
        module = module_name(path)
        source = path.read_text(encoding="utf-8")
        for line, name in imports_of(source, module, path.name == "__init__.py"):
            if any(within(name, f) for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return sorted(set(found))


def outsiders(package: str, allowed: tuple[str, ...]) -> list[str]:
    """`file:line imports name` for each import under `package` that is neither standard
    library nor inside an `allowed` prefix."""
    stdlib = sys.stdlib_module_names | {"__future__"}
    found = []
    for path in sources(package):
        module = module_name(path)
        source = path.read_text(encoding="utf-8")
        for line, name in imports_of(source, module, path.name == "__init__.py"):
            top = name.split(".")[0]
            if top in stdlib or any(within(name, a) for a in allowed):
                continue
            if any(within(a, name) for a in allowed):
                continue  # ``from controlplane import domain`` names a parent of an allowed one
            found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return sorted(set(found))


def test_control_plane_never_imports_the_sidecars() -> None:
    """No module under controlplane/ imports adapter_sidecars."""
    assert violations("controlplane", ("adapter_sidecars",)) == []


def test_sidecars_never_import_the_control_plane() -> None:
    """No module under adapter_sidecars/ imports controlplane."""
    assert violations("adapter_sidecars", ("controlplane",)) == []


def test_kernel_imports_neither_deployable() -> None:
    """No module under vidroute_core/ imports controlplane or adapter_sidecars."""
    assert violations("vidroute_core", ("controlplane", "adapter_sidecars")) == []


def test_domain_imports_nothing_above_it() -> None:
    """controlplane/domain imports only the standard library, the kernel and itself."""
    assert outsiders("controlplane.domain", ("vidroute_core", "controlplane.domain")) == []


def test_pure_kernel_modules_touch_no_transport_or_storage() -> None:
    """Every kernel module outside vidroute_core/wire imports no grpc, protobuf, sqlalchemy,
    redis or httpx."""
    found = [
        v
        for v in violations("vidroute_core", TRANSPORT_AND_STORAGE)
        if not v.startswith("vidroute_core/wire/")
    ]
    assert found == []


SYNTHETIC = """
from __future__ import annotations
from typing import TYPE_CHECKING
import json
if TYPE_CHECKING:
    from controlplane.persistence.records import TaskRecord
def later():
    import adapter_sidecars.runway.adapter
    from . import routing
    from ..leases import base
"""


@pytest.mark.parametrize(
    "expected",
    [
        "controlplane.persistence.records",
        "controlplane.persistence.records.TaskRecord",
        "adapter_sidecars.runway.adapter",
        "controlplane.domain.routing",
        "controlplane.leases.base",
    ],
)
def test_scanner_sees_lazy_typing_and_relative_imports(expected: str) -> None:
    """The scanner reports imports inside functions, under TYPE_CHECKING and relative ones
    (resolved against the importing module), so the rules above can fail."""
    names = {name for _, name in imports_of(SYNTHETIC, "controlplane.domain.scoring")}
    assert expected in names


def test_a_forbidden_import_is_flagged() -> None:
    """A synthetic module importing upward is caught by the same prefix rule the tests use."""
    names = [name for _, name in imports_of(SYNTHETIC, "controlplane.domain.scoring")]
    upward = ("controlplane.persistence", "controlplane.leases", "adapter_sidecars")
    flagged = sorted({n for n in names if any(within(n, u) for u in upward)})
    assert "controlplane.leases.base" in flagged
    assert "adapter_sidecars.runway.adapter" in flagged
    assert not any(within(n, "controlplane.domain") for n in flagged)
    assert "json" not in flagged
