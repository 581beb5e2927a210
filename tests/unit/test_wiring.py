"""Collaborators by constructor (issue 22): an object is whole when built.

The scanner reads every module of the control plane with `ast` and reports

* an assignment of a hook onto another object (``x.on_freed = ...``, ``db.after_commit = ...``:
  an attribute named ``on_*`` or ``after_*`` of anything but ``self``): hooks are keyword
  arguments of the constructor, closures over what is built later where there is a cycle,
* any use of another object's private attribute (``self._monitor._shared``, ``x._clock = ...``),
* an assignment onto a part of another object (``metrics.state.loop = ...``: the part's sources
  belong in its constructor, built whole once what they read exists),
* an import of a private name of `controlplane.bootstrap` (``bootstrap._adapter_client``).

An object's own ``self._x`` is its business, and so are a class's own private class attributes
(``LocalLock._holders`` inside ``LocalLock``) and a method filling the instance it just made
(``queue = cls(...)`` in a classmethod, ``other = copy.copy(self)``). Modules are not objects
here: ``_sql.cas_task`` names a function of a private module. The scanner is tested on
synthetic sources, so it can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK_PREFIXES = ("on_", "after_")


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def _imported_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


def _made_here(fn: ast.FunctionDef | ast.AsyncFunctionDef, cls: str) -> set[str]:
    """Locals of a method holding an instance it just made: ``cls(...)``, ``Cls(...)`` or a
    copy of ``self`` (``copy.copy(self)``)."""
    made: set[str] = set()
    for a in ast.walk(fn):
        if not (isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)):
            continue
        call = a.value
        ours = isinstance(call.func, ast.Name) and call.func.id in {"cls", cls}
        copied = any(isinstance(arg, ast.Name) and arg.id == "self" for arg in call.args)
        if ours or copied:
            made.update(t.id for t in a.targets if isinstance(t, ast.Name))
    return made


def _own(tree: ast.Module) -> set[int]:
    """Ids of the receivers that are an object's own: ``self``/``cls``, the enclosing class by
    name, and an instance a method of the class just made (`_made_here`)."""
    own: set[int] = set()
    methods = (ast.FunctionDef, ast.AsyncFunctionDef)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for fn in (n for n in ast.walk(cls) if isinstance(n, methods)):
            names = {"self", "cls", cls.name, *_made_here(fn, cls.name)}
            own.update(id(n) for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in names)
    return own


def _messages(tree: ast.Module) -> set[int]:
    """Ids of the names holding a protobuf message their function just built
    (``msg = pb.TaskEvent(...)``, ``pb`` a ``*_pb2`` module): a message's sub-fields are set
    in place (``msg.progress.fraction = ...``), that is how protobuf builds one."""
    modules = {
        a.asname or a.name.split(".")[-1]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
        if a.name.endswith("_pb2")
    }
    ids: set[int] = set()
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        built = {
            t.id
            for a in ast.walk(fn)
            if isinstance(a, ast.Assign)
            and isinstance(a.value, ast.Call)
            and isinstance(a.value.func, ast.Attribute)
            and isinstance(a.value.func.value, ast.Name)
            and a.value.func.value.id in modules
            for t in a.targets
            if isinstance(t, ast.Name)
        }
        ids.update(id(n) for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in built)
    return ids


def _root(node: ast.expr) -> ast.expr:
    """The first name of an attribute chain: ``metrics.state.loop`` -> ``metrics``."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def violations(source: str, path: str) -> list[str]:
    """What in `source` (the module at `path`) wires an object after it was built; empty when
    nothing does."""
    tree = ast.parse(source, filename=path)
    modules, own = _imported_names(tree), _own(tree)
    mine = own | _messages(tree)  # an object's own parts, and messages being built
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("bootstrap"):
            found.extend(
                f"{path}:{node.lineno}: bootstrap's private {a.name}"
                for a in node.names
                if _private(a.name)
            )
        if not isinstance(node, ast.Attribute):
            continue
        receiver = node.value
        if isinstance(receiver, ast.Name) and receiver.id == "bootstrap" and _private(node.attr):
            found.append(f"{path}:{node.lineno}: bootstrap's private {node.attr}")
            continue
        if id(receiver) in own or (isinstance(receiver, ast.Name) and receiver.id in modules):
            continue
        stored = isinstance(node.ctx, ast.Store)
        if stored and node.attr.startswith(HOOK_PREFIXES):
            found.append(f"{path}:{node.lineno}: {node.attr} assigned after construction")
        elif stored and isinstance(receiver, ast.Attribute) and id(_root(receiver)) not in mine:
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)} assigned onto another part")
        elif _private(node.attr):
            found.append(f"{path}:{node.lineno}: another object's {node.attr}")
    return sorted(found, key=lambda v: int(v.split(":")[1]))


def _modules() -> list[Path]:
    return sorted(
        p
        for p in (ROOT / "controlplane").rglob("*.py")
        if "__pycache__" not in p.parts and not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    )


def test_no_object_is_wired_after_construction() -> None:
    """No module of the control plane assigns a hook onto another object, touches another
    object's private attributes or imports bootstrap's private names."""
    modules = _modules()
    assert len(modules) > 50  # the scan really covers the control plane
    found = [v for p in modules for v in violations(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == [], "\n".join(found)


def test_the_scanner_finds_wiring_after_construction() -> None:
    """Hooks assigned onto built objects, private attributes of others read or written, and
    bootstrap's private names imported are each reported with their line."""
    source = (
        "from controlplane import bootstrap\n"
        "from controlplane.bootstrap import _adapter_client, Settings\n"
        "def wire(leases, monitor, upkeep, db, dispatchers):\n"
        "    leases.on_freed = lambda a: None\n"
        "    monitor.on_recovered = upkeep.kick\n"
        "    db.after_commit = print\n"
        "    dispatchers[0]._clock = lambda: 0\n"
        "    return bootstrap._adapter_client\n"
        "class SharedIncumbents:\n"
        "    def put(self):\n"
        "        self._monitor._background('x', self._monitor._shared.put())\n"
        "def wire_metrics(metrics, runtime):\n"
        "    metrics.state.loop = runtime.loop\n"
        "    metrics.state.accounts, x.y = runtime.usage, 1\n"
    )
    assert violations(source, "controlplane/scheduling/bad.py") == [
        "controlplane/scheduling/bad.py:2: bootstrap's private _adapter_client",
        "controlplane/scheduling/bad.py:4: on_freed assigned after construction",
        "controlplane/scheduling/bad.py:5: on_recovered assigned after construction",
        "controlplane/scheduling/bad.py:6: after_commit assigned after construction",
        "controlplane/scheduling/bad.py:7: another object's _clock",
        "controlplane/scheduling/bad.py:8: bootstrap's private _adapter_client",
        "controlplane/scheduling/bad.py:11: another object's _background",
        "controlplane/scheduling/bad.py:11: another object's _shared",
        "controlplane/scheduling/bad.py:13: metrics.state.loop assigned onto another part",
        "controlplane/scheduling/bad.py:14: metrics.state.accounts assigned onto another part",
    ]


def test_the_scanner_allows_an_objects_own_parts() -> None:
    """``self``'s attributes, hooks given at construction, a class's own class attributes, an
    alternative constructor's new instance and private modules pass."""
    source = (
        "from controlplane.persistence import _sql\n"
        "class Queue:\n"
        "    _holders = {}\n"
        "    def __init__(self, on_freed=None):\n"
        "        self._on_freed = on_freed\n"
        "        self.on_done = None\n"
        "        Queue._holders[1] = self\n"
        "    @classmethod\n"
        "    def rebuild(cls, parts):\n"
        "        queue = cls()\n"
        "        queue._partial = frozenset(parts)\n"
        "        return queue\n"
        "    def but(self, hook):\n"
        "        other = copy.copy(self)\n"
        "        other._on_freed = hook\n"
        "        self.parts.count = 1\n"
        "        return other\n"
        "from vidroute.scheduler.v1 import scheduler_pb2 as pb\n"
        "def event(fraction):\n"
        "    msg = pb.TaskEvent(kind='x')\n"
        "    msg.progress.fraction = fraction\n"
        "    return msg\n"
        "async def f(conn):\n"
        "    store = Store(on_freed=print)\n"
        "    return await _sql.cas_task(conn)\n"
    )
    assert violations(source, "controlplane/domain/good.py") == []
