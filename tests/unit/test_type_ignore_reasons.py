"""Every ``type: ignore`` names its error codes and says why (issue 25; `make lint` step 5).

The checker (scripts/check_type_ignores.py) is proved on synthetic sources first, so the
repository-wide test below can fail; the ignores in these sources are built from pieces so this
file itself holds none the checker would read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.check_type_ignores import ROOT, check_source, main

IGNORE = "# type" + ": ignore"  # split so the checker does not read this file's own text


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        (f"x = f()  {IGNORE}\n", "bare"),
        (f"x = f()  {IGNORE}  # the stub is wrong here\n", "bare"),
        (f"x = f()  {IGNORE}[]  # the stub is wrong here\n", "bare"),
        (f"x = f()  {IGNORE}[arg-type]\n", "without a reason"),
        (f"x = f()  {IGNORE}[arg-type]  #\n", "without a reason"),
        (f"x = f()  {IGNORE}[arg-type]  # why\n", "without a reason"),
        (f"x = f()  #{IGNORE[1:]}[arg-type] trailing words without a hash\n", "without a reason"),
    ],
)
def test_an_ignore_without_code_or_reason_is_reported(line: str, complaint: str) -> None:
    """A bare ignore, or one whose reason is missing or too short to say anything, gives one
    message naming the line and the fix."""
    problems = check_source(line, "example.py")
    assert len(problems) == 1
    assert problems[0].startswith("example.py:1: ")
    assert complaint in problems[0]
    assert "# type: ignore[error-code]  # why" in problems[0]


@pytest.mark.parametrize(
    "source",
    [
        f"x = f()  {IGNORE}[arg-type]  # the stub says str; the C API takes bytes too\n",
        f"x = f()  {IGNORE}[arg-type, return-value]  # T is narrowed by _is_number\n",
        f"x = f()  {IGNORE}[no-untyped-call]#the factory ships untyped\n",
        f's = "{IGNORE}"  # a string that mentions it is not a comment\n',
        "x = 1  # an ordinary comment\n",
    ],
)
def test_an_ignore_with_code_and_reason_passes(source: str) -> None:
    """An ignore with error codes and a reason, or text that is not an ignore comment, passes."""
    assert check_source(source) == []


def test_main_exits_1_and_prints_each_offence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command over a directory with one bad file prints its line and exits 1; generated
    ``_pb2`` modules are not read."""
    (tmp_path / "good.py").write_text(f"x = f()  {IGNORE}[misc]  # a reason long enough\n")
    (tmp_path / "bad.py").write_text(f"y = 1\nx = f()  {IGNORE}\n")
    (tmp_path / "thing_pb2.py").write_text(f"x = f()  {IGNORE}\n")
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'bad.py'}:2: bare" in out
    assert "thing_pb2" not in out
    assert "good.py" not in out


def test_the_repository_has_no_ignore_without_code_and_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every ignore in the packages, tests, bench and scripts names its codes and says why."""
    assert main([str(ROOT)]) == 0, capsys.readouterr().out
