"""Every ``type: ignore`` names its error codes and says why (``make lint``).

A bare ignore hides every error on its line, including the ones a later change introduces; an
ignore without a reason cannot be re-judged by the next reader. So each one must read::

    value = thing()  # type: ignore[arg-type]  # the stub says str; the C API takes bytes too

Comments are found with `tokenize`, so the words inside a string are never taken for an
ignore. Generated protobuf modules (``*_pb2*.py[i]``) are skipped: nobody edits them.

    python scripts/check_type_ignores.py [PATH ...]    # default: the repository

Exit status 1 and one line per offence when any ignore falls short.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tokenize
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "node_modules", "var", "dist", "build", "__pycache__"}
_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<codes>\[[^\]]*\])?(?P<rest>.*)")
_REASON = re.compile(r"\s*#\s*(?P<reason>.*\S)")
MIN_REASON = 8  # characters: "# why", "# ok" or "# TODO" say nothing

USAGE = "# type: ignore[error-code]  # why the checker is wrong here"


def check_source(source: str, path: str = "<string>") -> list[str]:
    """One message per ignore in `source` that lacks an error code or a reason."""
    problems: list[str] = []
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        found = _IGNORE.search(tok.string)
        if found is None:
            continue
        where = f"{path}:{tok.start[0]}"
        codes = (found["codes"] or "").strip("[]").strip()
        if not codes:
            problems.append(f"{where}: bare `type: ignore`; name the error code(s): {USAGE}")
            continue
        reason = _REASON.match(found["rest"])
        if reason is None or len(reason["reason"]) < MIN_REASON:
            problems.append(f"{where}: `type: ignore[{codes}]` without a reason; write {USAGE}")
    return problems


def python_files(paths: Iterable[Path]) -> Iterator[Path]:
    """The .py/.pyi files under `paths`, without generated protobuf code, virtualenvs, caches
    and other tool directories (pruned, not walked)."""
    for top in paths:
        if top.is_file():
            found: Iterable[Path] = [top]
        else:
            found = []
            for here, dirs, files in os.walk(top):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
                found += [Path(here, f) for f in sorted(files)]
        for path in found:
            if path.suffix in {".py", ".pyi"} and "_pb2" not in path.name:
                yield path


def main(argv: list[str]) -> int:
    """Check `argv`'s paths (default: the repository); print offences; 1 if any."""
    tops = [Path(a) for a in argv] or [ROOT]
    problems: list[str] = []
    files = 0
    for path in python_files(tops):
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        problems += check_source(path.read_text(encoding="utf-8"), str(shown))
        files += 1
    for line in problems:
        print(line)
    if problems:
        print(f"check_type_ignores: {len(problems)} `type: ignore` without a code or a reason")
        return 1
    print(f"check_type_ignores: every `type: ignore` in {files} files has codes and a reason")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
