"""Outbox topics are spelled once, in `controlplane.domain.outbox.Topic`: an AST scan of the
control plane, the clients and the tests finds no topic string anywhere else."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from controlplane.domain.outbox import Topic

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("controlplane", "clients", "tests")
HOME = ROOT / "controlplane" / "domain" / "outbox.py"
# Migrations are frozen history: they spell the values of their day, never import the enum.
MIGRATIONS = ROOT / "controlplane" / "persistence" / "migrations"
# "task.queued" is also the kind of a task's first history event (``task_events.kind``), so
# that string is a topic only where a topic goes; every other topic string is one anywhere.
SHARED_WITH_EVENT_KINDS = frozenset({Topic.QUEUED.value})
TOPIC_CALLS = frozenset({"NewOutboxMessage", "claim", "claim_messages", "claim_batch"})


def _topic_position(node: ast.Constant, parent: ast.AST) -> bool:
    """Whether `node` sits where an outbox topic goes."""
    if isinstance(parent, ast.keyword):
        return parent.arg is not None and "topic" in parent.arg
    if isinstance(parent, ast.Call):
        func = parent.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in TOPIC_CALLS
    if isinstance(parent, ast.Compare):
        sides = [parent.left, *parent.comparators]
        return any(isinstance(s, ast.Attribute) and s.attr == "topic" for s in sides)
    if isinstance(parent, ast.Dict):
        for key, value in zip(parent.keys, parent.values, strict=True):
            if value is node and isinstance(key, ast.Constant) and key.value == "topic":
                return True
        return False
    return False  # an assignment to a TOPIC name is found by `_assigned_to_topic_name`


def _assigned_to_topic_name(tree: ast.AST) -> set[int]:
    """ids of constants assigned (alone or in a tuple) to a name mentioning TOPIC."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and "TOPIC" in t.id.upper() for t in targets):
                found |= {id(c) for c in ast.walk(node) if isinstance(c, ast.Constant)}
    return found


def topic_literals(source: str) -> Iterator[tuple[int, str]]:
    """(line, value) of each topic string literal in `source`."""
    tree = ast.parse(source)
    values = {t.value for t in Topic}
    named = _assigned_to_topic_name(tree)
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if not (isinstance(child, ast.Constant) and child.value in values):
                continue
            if (
                child.value not in SHARED_WITH_EVENT_KINDS
                or _topic_position(child, parent)
                or id(child) in named
            ):
                yield child.lineno, str(child.value)


def test_the_scanner_finds_topic_literals() -> None:
    """The scan is not vacuous: each way of spelling a topic by hand is caught, an event kind
    that shares the queued topic's string is not."""
    source = "\n".join(
        [
            'a = NewOutboxMessage("task.queued", "1", {})',
            'b = store.claim("attempt.submit", "w")',
            'c = outbox.c.topic == "task.queued"',
            'd = {"topic": "task.queued"}',
            'QUEUE_TOPICS = ("task.queued", Topic.REQUEUE)',
            'e = "output.fetch"',
            'f = append_event(conn, 1, 1, "task.queued", {})',
            'g = {"task.queued": 1}',
        ]
    )
    assert sorted(line for line, _ in topic_literals(source)) == [1, 2, 3, 4, 5, 6]


def test_no_topic_string_outside_the_enum() -> None:
    """Every writer and consumer names a topic through `Topic`."""
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == HOME or MIGRATIONS in path.parents or "_pb2" in path.name:
                continue
            for line, value in topic_literals(path.read_text(encoding="utf-8")):
                found.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    assert sorted(found) == []
