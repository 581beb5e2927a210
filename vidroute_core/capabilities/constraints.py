"""The declarative constraint language of capability entries (design 9.6.3), evaluated without eval.

A capability entry says things like::

    - when: resolution in ["1080p", "4k"]
      require: duration_seconds == 8

Both sides are boolean expressions over a handful of identifiers describing one compiled
request (`IDENTIFIERS`). The grammar, by precedence from loosest to tightest::

    expr       := and_expr ("or" and_expr)*
    and_expr   := not_expr ("and" not_expr)*
    not_expr   := "not" not_expr | comparison
    comparison := operand [ ("==" | "!=" | "<" | "<=" | ">" | ">=") operand
                          | ["not"] "in" list ]
    operand    := STRING | NUMBER | "true" | "false" | IDENT | "(" expr ")"
    list       := "[" [ literal ("," literal)* [","] ] "]"

Expressions are parsed once (`parse`, cached) into a small tree; unknown identifiers and syntax
errors raise `ConstraintSyntaxError` at load time, so a bad YAML file never reaches a request.
Evaluation is strict about types: comparing a string with a number raises `ConstraintTypeError`
instead of quietly returning False, because a silently-false `when` would switch a rule off.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Union

Value = Union[str, float, int, bool]  # noqa: UP007 - a runtime alias used in isinstance checks
Environment = Mapping[str, Value]

#: Identifiers an expression may use, with the Python types their values must have.
IDENTIFIERS: Mapping[str, tuple[type, ...]] = {
    "mode": (str,),
    "resolution": (str,),
    "aspect_ratio": (str,),
    "duration_seconds": (int, float),
    "with_audio": (bool,),
    "sample_count": (int,),
    "has_last_frame": (bool,),
    "reference_count": (int,),
    "has_negative_prompt": (bool,),
    "has_seed": (bool,),
}


class ConstraintError(ValueError):
    """Root of the constraint language's errors.

    ConstraintError
    ├── ConstraintSyntaxError   the text is not a valid expression (raised by `parse`)
    └── ConstraintTypeError     evaluation met a missing identifier or mismatched types
    """


class ConstraintSyntaxError(ConstraintError):
    """The expression text cannot be parsed; the message names the position."""


class ConstraintTypeError(ConstraintError):
    """Evaluation failed: an identifier is missing from the environment or types don't match."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<number>-?\d+(?:\.\d+)?)
      | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,)
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)
_KEYWORDS = frozenset({"and", "or", "not", "in", "true", "false"})


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # number | string | op | word | keyword | end
    text: str
    pos: int


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise ConstraintSyntaxError(f"unexpected character at {pos} in {text!r}")
        group = match.lastgroup or ""
        value = match.group(group)
        kind = "keyword" if group == "word" and value in _KEYWORDS else group
        tokens.append(_Token(kind, value, match.start(group)))
        pos = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


# --- the tree ---------------------------------------------------------------------------------


class Node:
    """An expression tree node."""

    def evaluate(self, env: Environment) -> Value:
        """Compute the node's value in `env`."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class _Literal(Node):
    value: Value

    def evaluate(self, env: Environment) -> Value:
        return self.value


@dataclass(frozen=True, slots=True)
class _Name(Node):
    name: str

    def evaluate(self, env: Environment) -> Value:
        if self.name not in env:
            raise ConstraintTypeError(f"identifier {self.name!r} has no value")
        return env[self.name]


@dataclass(frozen=True, slots=True)
class _Not(Node):
    operand: Node

    def evaluate(self, env: Environment) -> Value:
        return not _truth(self.operand.evaluate(env))


@dataclass(frozen=True, slots=True)
class _Bool(Node):
    op: str  # "and" | "or"
    operands: tuple[Node, ...]

    def evaluate(self, env: Environment) -> Value:
        if self.op == "and":
            return all(_truth(o.evaluate(env)) for o in self.operands)
        return any(_truth(o.evaluate(env)) for o in self.operands)


_COMPARE: Mapping[str, Callable[[Value, Value], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _kind(value: Value) -> str:
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else "string"


@dataclass(frozen=True, slots=True)
class _Compare(Node):
    op: str
    left: Node
    right: Node

    def evaluate(self, env: Environment) -> Value:
        a, b = self.left.evaluate(env), self.right.evaluate(env)
        if _kind(a) != _kind(b):
            raise ConstraintTypeError(f"cannot compare {a!r} {self.op} {b!r}")
        if self.op not in ("==", "!=") and _kind(a) == "bool":
            raise ConstraintTypeError(f"cannot order booleans: {a!r} {self.op} {b!r}")
        return _COMPARE[self.op](a, b)


@dataclass(frozen=True, slots=True)
class _In(Node):
    item: Node
    choices: tuple[Value, ...]
    negated: bool

    def evaluate(self, env: Environment) -> Value:
        value = self.item.evaluate(env)
        for choice in self.choices:
            if _kind(choice) != _kind(value):
                raise ConstraintTypeError(f"cannot test {value!r} in a list holding {choice!r}")
        found = any(value == choice for choice in self.choices)
        return found != self.negated


def _truth(value: Value) -> bool:
    if not isinstance(value, bool):
        raise ConstraintTypeError(f"expected a boolean, got {value!r}")
    return value


# --- the parser ---------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def fail(self, what: str) -> ConstraintSyntaxError:
        shown = self.tok.text or "end of input"
        return ConstraintSyntaxError(f"{what} at {self.tok.pos} ({shown!r}) in {self.text!r}")

    def accept(self, kind: str, text: str | None = None) -> _Token | None:
        tok = self.tok
        if tok.kind == kind and (text is None or tok.text == text):
            self.i += 1
            return tok
        return None

    def expect(self, kind: str, text: str) -> None:
        if self.accept(kind, text) is None:
            raise self.fail(f"expected {text!r}")

    def parse(self) -> Node:
        node = self.expr()
        if self.tok.kind != "end":
            raise self.fail("unexpected token")
        return node

    def expr(self) -> Node:
        return self._chain("or", self.and_expr)

    def and_expr(self) -> Node:
        return self._chain("and", self.not_expr)

    def _chain(self, keyword: str, sub: Callable[[], Node]) -> Node:
        parts = [sub()]
        while self.accept("keyword", keyword):
            parts.append(sub())
        return parts[0] if len(parts) == 1 else _Bool(keyword, tuple(parts))

    def not_expr(self) -> Node:
        if self.accept("keyword", "not"):
            return _Not(self.not_expr())
        return self.comparison()

    def comparison(self) -> Node:
        left = self.operand()
        if self.tok.kind == "op" and self.tok.text in _COMPARE:
            op = self.tok.text
            self.i += 1
            return _Compare(op, left, self.operand())
        negated = False
        if self.tok.kind == "keyword" and self.tok.text == "not":
            nxt = self.tokens[self.i + 1]
            if nxt.kind == "keyword" and nxt.text == "in":
                self.i += 1
                negated = True
        if self.accept("keyword", "in"):
            return _In(left, self.list_literal(), negated)
        return left

    def operand(self) -> Node:
        if self.accept("op", "("):
            node = self.expr()
            self.expect("op", ")")
            return node
        tok = self.tok
        if tok.kind == "word":
            if tok.text not in IDENTIFIERS:
                raise self.fail(f"unknown identifier (known: {', '.join(sorted(IDENTIFIERS))})")
            self.i += 1
            return _Name(tok.text)
        return _Literal(self.literal())

    def literal(self) -> Value:
        tok = self.tok
        self.i += 1
        if tok.kind == "number":
            return float(tok.text) if "." in tok.text else int(tok.text)
        if tok.kind == "string":
            return re.sub(r"\\(.)", r"\1", tok.text[1:-1])
        if tok.kind == "keyword" and tok.text in ("true", "false"):
            return tok.text == "true"
        self.i -= 1
        raise self.fail("expected a literal")

    def list_literal(self) -> tuple[Value, ...]:
        self.expect("op", "[")
        items: list[Value] = []
        while not self.accept("op", "]"):
            items.append(self.literal())
            if not self.accept("op", ","):
                self.expect("op", "]")
                break
        return tuple(items)


@dataclass(frozen=True, slots=True)
class Expression:
    """A parsed expression; `evaluate` returns a bool or raises `ConstraintTypeError`."""

    text: str
    root: Node

    def evaluate(self, env: Environment) -> bool:
        """Evaluate in `env` (identifier -> value); the result must be a boolean."""
        return _truth(self.root.evaluate(env))


@lru_cache(maxsize=1024)
def parse(text: str) -> Expression:
    """Parse `text`, raising `ConstraintSyntaxError` on any error (results are cached)."""
    return Expression(text, _Parser(text).parse())


@dataclass(frozen=True, slots=True)
class Constraint:
    """One `when`/`require` rule with its explanation."""

    when: str
    require: str
    message: str = ""

    def check(self, env: Environment) -> bool:
        """True when the rule holds: the condition is false or the requirement is true."""
        return not parse(self.when).evaluate(env) or parse(self.require).evaluate(env)

    def describe(self) -> str:
        """The message, or a generated one when the YAML gave none."""
        return self.message or f"when {self.when}, {self.require} is required"


def violations(constraints: Iterable[Constraint], env: Environment) -> list[Constraint]:
    """The constraints that do not hold in `env`, in order."""
    return [c for c in constraints if not c.check(env)]


def validate_syntax(constraints: Iterable[Constraint]) -> None:
    """Parse every expression now, so a malformed rule fails at load time."""
    for c in constraints:
        parse(c.when)
        parse(c.require)
