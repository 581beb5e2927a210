"""The compiled constraint language (`vidroute_core.capabilities.compiled`) is the interpreter's
twin: on any expression and any environment it returns the same boolean or raises the same
`ConstraintTypeError` with the same message."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapter_sidecars.common.compiling import aspect_label, constraint_env
from tests.support.sizes import examples
from tests.unit.domain.test_routing import specs
from vidroute_core.capabilities.compiled import compile_expression, compile_rules
from vidroute_core.capabilities.constraints import (
    IDENTIFIERS,
    Constraint,
    ConstraintError,
    ConstraintTypeError,
    Environment,
    parse,
    violations,
)
from vidroute_core.capabilities.loader import load_file
from vidroute_core.spec import GenerationSpec

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = [
    cap for p in sorted(ROOT.glob("adapter_sidecars/*/capabilities/*.yaml")) for cap in load_file(p)
]

# ---- random expressions, rendered as text the parser reads ----------------------------------

strings = st.sampled_from(['"TEXT_TO_VIDEO"', '"1080p"', '"16:9"', "'4k'", '"a\\"b"', '""'])
numbers = st.sampled_from(["0", "1", "4", "8", "-2", "2.5", "8.0"])
booleans = st.sampled_from(["true", "false"])
literals = st.one_of(strings, numbers, booleans)
names = st.sampled_from(sorted(IDENTIFIERS))
operands = st.one_of(literals, names)
comparisons = st.one_of(
    st.tuples(operands, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), operands).map(
        " ".join
    ),
    st.tuples(
        operands,
        st.sampled_from(["in", "not in"]),
        st.lists(literals, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
    ).map(" ".join),
)


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        inner.map(lambda e: f"not {e}"),
        inner.map(lambda e: f"({e})"),
        st.lists(inner, min_size=2, max_size=3).map(" and ".join),
        st.lists(inner, min_size=2, max_size=3).map(" or ".join),
    )


expressions = st.recursive(st.one_of(comparisons, operands), _extend, max_leaves=8)

values = st.one_of(
    st.sampled_from(["TEXT_TO_VIDEO", "IMAGE_TO_VIDEO", "1080p", "720p", "4k", "16:9", 'a"b', ""]),
    st.integers(-3, 10),
    st.sampled_from([2.5, 8.0, 0.0]),
    st.booleans(),
)
environments = st.dictionaries(names, values)  # any subset, any kinds: errors are compared too


def _outcome(evaluate: Callable[[Environment], bool], env: Environment) -> tuple[str, object]:
    try:
        return "value", evaluate(env)
    except ConstraintTypeError as exc:
        return "error", str(exc)


@settings(
    max_examples=examples(150, long=500),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(text=expressions, env=environments)
def test_compiled_expression_agrees_with_the_interpreter(text: str, env: Environment) -> None:
    """Same boolean, or the same ConstraintTypeError message, for random text and environments."""
    try:
        expr = parse(text)
    except ConstraintError:
        return  # the text is not an expression (e.g. `x in [...] in [...]`)
    assert _outcome(compile_expression(text), env) == _outcome(expr.evaluate, env)


@settings(
    max_examples=examples(60, long=200), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    rules=st.lists(st.tuples(expressions, expressions), min_size=1, max_size=3),
    env=environments,
)
def test_compiled_rules_list_the_interpreters_violations(
    rules: list[tuple[str, str]], env: Environment
) -> None:
    """`CompiledRules.violations` / `holds` give `constraints.violations`, errors included."""
    try:
        constraints = tuple(Constraint(w, r) for w, r in rules)
        for c in constraints:
            parse(c.when), parse(c.require)
    except ConstraintError:
        return
    compiled = compile_rules(constraints)

    def interpreted(e: Environment) -> bool:
        return not violations(constraints, e)

    assert _outcome(compiled.holds, env) == _outcome(interpreted, env)
    try:
        expected: object = violations(constraints, env)
    except ConstraintTypeError as exc:
        expected = str(exc)
    try:
        got: object = compiled.violations(env)
    except ConstraintTypeError as exc:
        got = str(exc)
    assert got == expected


@settings(
    max_examples=examples(100, long=300),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(spec=specs, resolution=st.sampled_from(["480p", "720p", "1080p", "4k"]))
def test_shipped_rules_agree_on_random_specs(spec: GenerationSpec, resolution: str) -> None:
    """Every shipped capability's rules, for a random spec at every offered duration."""
    aspect = aspect_label(spec.output.width, spec.output.height)
    for cap in SHIPPED:
        compiled = compile_rules(cap.constraints)
        for seconds in (*cap.durations_seconds, spec.output.duration_ms // 1000):
            env = constraint_env(
                spec,
                resolution=resolution,
                aspect_ratio=aspect,
                duration_seconds=seconds,
                with_audio=spec.output.with_audio,
            )
            assert compiled.violations(env) == violations(cap.constraints, env), cap.model


def test_compiled_expressions_are_built_once_per_text() -> None:
    """Equal texts share one predicate and equal rule tuples one `CompiledRules`."""
    text = 'resolution in ["1080p", "4k"] and duration_seconds != 8'
    assert compile_expression(text) is compile_expression(text)
    rules = (Constraint('mode == "TEXT_TO_VIDEO"', "duration_seconds <= 8"),)
    assert compile_rules(rules) is compile_rules(list(rules))
