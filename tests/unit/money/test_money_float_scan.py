"""Money is integer micros everywhere (issue 11): no float column, no float arithmetic.

Two scans, both with `ast`/metadata and no database:

* the schema: no column of any model is a Float / REAL / DOUBLE / Numeric, and no migration
  names such a type;
* the money code (`MONEY_MODULES`: domain.money*, persistence.ledger, the usage entries the
  engine writes, and the reconciliation code once it exists): no float literal, no ``float()``
  call, no true division (``/`` or ``/=``; integer ``//`` is how money divides).

The scanners are run on synthetic sources too, so they can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sqlalchemy import Float, Numeric

from controlplane.persistence.models import Base

ROOT = Path(__file__).resolve().parents[3]
MIGRATIONS = ROOT / "controlplane" / "persistence" / "migrations" / "versions"
MONEY_GLOBS = (
    "controlplane/domain/money*.py",
    "controlplane/persistence/ledger.py",
    "controlplane/execution/usage_entries.py",
    "controlplane/domain/reconciliation*.py",
    "controlplane/reconciliation/**/*.py",
    # the billing API and unit costs (issue 11's RPCs, CLI and cost metrics)
    "controlplane/domain/unit_cost.py",
    # imported bills (issue 23): the file's money is read as decimals, kept as micros
    "controlplane/persistence/bill_imports.py",
    "clients/usage_cli.py",
    "clients/disputes_cli.py",
    "controlplane/domain/disputes.py",
    "controlplane/persistence/disputes.py",
    "controlplane/domain/margins.py",
    "controlplane/persistence/finance_reads.py",
    "controlplane/persistence/cost_reads.py",
    "controlplane/service/billing.py",
    "controlplane/api/billing_servicer.py",
    "clients/billing_cli.py",
)
FLOAT_TYPE_NAMES = frozenset({"Float", "REAL", "DOUBLE", "DOUBLE_PRECISION", "Double", "Numeric"})


def money_modules() -> list[Path]:
    return sorted({p for glob in MONEY_GLOBS for p in ROOT.glob(glob)})


def float_arithmetic(source: str, path: str) -> list[str]:
    """Float literals, float() calls and true divisions in `source`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, float):
            found.append(f"{path}:{node.lineno}: float literal {node.value!r}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "float"
        ):
            found.append(f"{path}:{node.lineno}: float() call")
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Div):
            found.append(f"{path}:{node.lineno}: true division")
    return found


def float_types(source: str, path: str) -> list[str]:
    """Names of floating or decimal column types used in `source` (a migration)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if isinstance(node, (ast.Attribute, ast.Name)) and name in FLOAT_TYPE_NAMES:
            found.append(f"{path}:{node.lineno}: {name}")
    return found


def test_no_model_column_is_a_float_or_numeric() -> None:
    """Every column of every table is non-floating: money is BIGINT micros."""
    bad = [
        f"{table.name}.{column.name}: {column.type}"
        for table in Base.metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, (Float, Numeric))
    ]
    assert bad == []


def test_no_migration_names_a_float_type() -> None:
    """No revision creates a Float / REAL / DOUBLE / Numeric column."""
    revisions = sorted(MIGRATIONS.glob("*.py"))
    assert len(revisions) >= 6
    found = [hit for p in revisions for hit in float_types(p.read_text(), p.name)]
    assert found == []


def test_money_code_does_no_float_arithmetic() -> None:
    """The money modules use integers only."""
    modules = money_modules()
    assert ROOT / "controlplane" / "domain" / "money.py" in modules
    assert ROOT / "controlplane" / "persistence" / "ledger.py" in modules
    found = [hit for p in modules for hit in float_arithmetic(p.read_text(), p.name)]
    assert found == []


def test_scanners_find_what_they_look_for() -> None:
    """Synthetic sources: each forbidden construct is reported, integer code is not."""
    bad = "a = 0.5\nb = float(x)\nc = x / 2\nd = 1\nd /= 3\n"
    assert len(float_arithmetic(bad, "bad.py")) == 4
    assert float_arithmetic("a = 7 // 2\nb = divmod(7, 2)\nc = 10**6\n", "ok.py") == []
    assert len(float_types("sa.Column('x', sa.Float())\nsa.Numeric(10, 2)\n", "m.py")) == 2
    assert float_types("sa.Column('x', sa.BigInteger())\n", "m.py") == []
