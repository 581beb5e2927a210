"""Generate the `vidroute` Python package (protobuf, gRPC and mypy stubs) from proto/.

The one way generated code is produced. Output goes to the given directory (default: the repo
root, so the package lands in ./vidroute); tests regenerate into a temporary directory and
compare to prove the committed code is fresh.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = "vidroute"
INIT_DOC = '"""Generated from proto/ by scripts/gen_proto.py. Do not edit."""\n'


def generate(out_dir: Path) -> list[Path]:
    """Write the generated package under out_dir/vidroute and return the files written."""
    target = out_dir / PACKAGE
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    bindir = Path(sys.executable).parent  # the venv's bin, where mypy-protobuf's plugins live
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{wkt}",
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for folder in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").write_text(INIT_DOC)
    (target / "py.typed").write_text("")
    return sorted(p for p in target.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="directory receiving vidroute/")
    args = parser.parse_args(argv)
    files = generate(args.out)
    print(f"generated {len(files)} files under {args.out / PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
