"""The constraint language compiled to plain Python closures (design 9.6.3, 9.10 fast path).

`constraints` parses an expression into a tree and walks it on every evaluation; routing checks
the rules of every candidate on every decision, so the walk (dataclass nodes, a method call per
node, a `_kind` call per operand) was most of a decision's cost. Here each tree is turned, once
per expression text, into nested closures over the node's constants: a literal side's kind is
known at compile time, an ``in`` list becomes a frozenset plus the first choice of a foreign
kind, ``and``/``or`` become loops over a tuple of closures.

The closures agree with `Expression.evaluate` on every environment: the same boolean, or the
same `ConstraintTypeError` (same message) for a missing identifier, a comparison across kinds,
an ordered comparison of booleans, an ``in`` list holding another kind, or a non-boolean where a
boolean is needed; evaluation order and short-circuits are the interpreter's
(``tests/unit/core/test_compiled_constraints.py`` checks this on random expressions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from vidroute_core.capabilities.constraints import (
    _COMPARE,
    Constraint,
    ConstraintTypeError,
    Environment,
    Node,
    Value,
    _Bool,
    _Compare,
    _In,
    _kind,
    _Literal,
    _Name,
    _Not,
    parse,
)

Evaluator = Callable[[Environment], Value]
Predicate = Callable[[Environment], bool]

_ORDERING = frozenset({"<", "<=", ">", ">="})


def _need_bool(value: Value) -> bool:
    if value is True or value is False:
        return value
    raise ConstraintTypeError(f"expected a boolean, got {value!r}")


def _literal(node: _Literal) -> Evaluator:
    value = node.value
    return lambda env: value


def _name(node: _Name) -> Evaluator:
    name = node.name

    def get(env: Environment) -> Value:
        try:
            return env[name]
        except KeyError:
            raise ConstraintTypeError(f"identifier {name!r} has no value") from None

    return get


def _not(node: _Not) -> Evaluator:
    inner = _build(node.operand)

    def negate(env: Environment) -> Value:
        return not _need_bool(inner(env))

    return negate


def _bool(node: _Bool) -> Evaluator:
    parts = tuple(_build(o) for o in node.operands)
    if node.op == "and":

        def all_of(env: Environment) -> Value:
            for part in parts:  # noqa: SIM110 - a generator costs more on the hot path
                if not _need_bool(part(env)):
                    return False
            return True

        return all_of

    def any_of(env: Environment) -> Value:
        for part in parts:  # noqa: SIM110 - a generator costs more on the hot path
            if _need_bool(part(env)):
                return True
        return False

    return any_of


def _compare(node: _Compare) -> Evaluator:
    op, symbol = _COMPARE[node.op], node.op
    left = _build(node.left)
    ordering = symbol in _ORDERING
    if isinstance(node.right, _Literal):
        b = node.right.value
        kind_b = _kind(b)

        def against_literal(env: Environment) -> Value:
            a = left(env)
            # `_kind` inlined: this closure is most of a rule's evaluation.
            if a is True or a is False:
                kind_a = "bool"
            elif isinstance(a, int | float):
                kind_a = "number"
            else:
                kind_a = "string"
            if kind_a != kind_b:
                raise ConstraintTypeError(f"cannot compare {a!r} {symbol} {b!r}")
            if ordering and kind_a == "bool":
                raise ConstraintTypeError(f"cannot order booleans: {a!r} {symbol} {b!r}")
            return op(a, b)

        return against_literal
    right = _build(node.right)

    def general(env: Environment) -> Value:
        a, b = left(env), right(env)
        kind_a = _kind(a)
        if kind_a != _kind(b):
            raise ConstraintTypeError(f"cannot compare {a!r} {symbol} {b!r}")
        if ordering and kind_a == "bool":
            raise ConstraintTypeError(f"cannot order booleans: {a!r} {symbol} {b!r}")
        return op(a, b)

    return general


def _in(node: _In) -> Evaluator:
    item = _build(node.item)
    choices = node.choices
    members = frozenset(choices)  # one kind per valid list, where hash+eq is the interpreter's ==
    negated = node.negated
    # The interpreter raises at the first choice whose kind differs from the value's.
    foreign = {
        kind: next((c for c in choices if _kind(c) != kind), None)
        for kind in ("bool", "number", "string")
    }
    has_foreign = {kind: any(_kind(c) != kind for c in choices) for kind in foreign}

    def member(env: Environment) -> Value:
        value = item(env)
        kind = _kind(value)
        if has_foreign[kind]:
            raise ConstraintTypeError(f"cannot test {value!r} in a list holding {foreign[kind]!r}")
        try:
            found = value in members
        except TypeError:  # an unhashable value: compare one by one, as the interpreter does
            found = any(value == c for c in choices)
        return found != negated

    return member


def _build(node: Node) -> Evaluator:
    if isinstance(node, _Literal):
        return _literal(node)
    if isinstance(node, _Name):
        return _name(node)
    if isinstance(node, _Not):
        return _not(node)
    if isinstance(node, _Bool):
        return _bool(node)
    if isinstance(node, _Compare):
        return _compare(node)
    if isinstance(node, _In):
        return _in(node)
    raise TypeError(f"no compiler for {type(node).__name__}")  # a new node kind needs one


@lru_cache(maxsize=1024)
def compile_expression(text: str) -> Predicate:
    """`text` as a predicate; raises `ConstraintSyntaxError` like `parse` (compiled once)."""
    root = _build(parse(text).root)

    def predicate(env: Environment) -> bool:
        return _need_bool(root(env))

    return predicate


@dataclass(frozen=True, slots=True)
class CompiledRules:
    """A capability's `Constraint`s as (when, require) predicate pairs, in their order."""

    constraints: tuple[Constraint, ...]
    checks: tuple[tuple[Predicate, Predicate], ...]

    def violations(self, env: Environment) -> list[Constraint]:
        """Like `constraints.violations`: the rules that do not hold in `env`, in order."""
        out: list[Constraint] = []
        for rule, (when, require) in zip(self.constraints, self.checks, strict=True):
            if when(env) and not require(env):
                out.append(rule)
        return out

    def holds(self, env: Environment) -> bool:
        """``not violations(env)`` without the list: every rule is evaluated, as there, so an
        evaluation error in a later rule surfaces even after a violated one."""
        ok = True
        for when, require in self.checks:
            if when(env) and not require(env):
                ok = False
        return ok


@lru_cache(maxsize=256)
def _compile_rules(constraints: tuple[Constraint, ...]) -> CompiledRules:
    return CompiledRules(
        constraints,
        tuple((compile_expression(c.when), compile_expression(c.require)) for c in constraints),
    )


def compile_rules(constraints: Iterable[Constraint]) -> CompiledRules:
    """Compile a capability's rules; equal rule tuples share one result."""
    return _compile_rules(tuple(constraints))


def compiled_violations(constraints: Sequence[Constraint], env: Environment) -> list[Constraint]:
    """`constraints.violations` through the compiled predicates."""
    return compile_rules(constraints).violations(env)


__all__ = [
    "CompiledRules",
    "Predicate",
    "compile_expression",
    "compile_rules",
    "compiled_violations",
]
