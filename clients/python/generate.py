#!/usr/bin/env python3
"""Generate the vak gRPC/protobuf Python modules from the repo's proto/ tree.

Writes vak_client/_gen/{__init__.py, agent_pb2.py, agent_pb2.pyi,
agent_pb2_grpc.py} next to this script. The output is never committed (see
.gitignore); run this after installing the package and whenever the proto
changes. Works from any cwd.

protoc emits absolute imports derived from the proto path
(`from vak.v1 import agent_pb2`); they are rewritten to package-relative ones
(`from . import agent_pb2`) so the modules live inside vak_client without a
top-level `vak` package or any sys.path manipulation. The descriptor itself
is still registered under its proto name "vak/v1/agent.proto".
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import NoReturn

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO_FILES = ["vak/v1/agent.proto"]
OUT_DIR = HERE / "vak_client" / "_gen"

# What protoc writes (relative to its output root) -> flat name in _gen/.
OUTPUTS = {
    "vak/v1/agent_pb2.py": "agent_pb2.py",
    "vak/v1/agent_pb2.pyi": "agent_pb2.pyi",
    "vak/v1/agent_pb2_grpc.py": "agent_pb2_grpc.py",
}

# `from vak.v1 import agent_pb2 as x` / `from vak.v1 import agent_pb2`
_ABS_IMPORT = re.compile(r"^from vak\.v1 import (\w+_pb2)\b", re.MULTILINE)
_IMPORT_VAK = re.compile(r"^\s*(import vak\b|from vak\b)", re.MULTILINE)


def _fail(msg: str) -> NoReturn:
    print(f"generate.py: {msg}", file=sys.stderr)
    sys.exit(1)


def _rewrite_imports(text: str, name: str) -> str:
    text = _ABS_IMPORT.sub(r"from . import \1", text)
    leftover = _IMPORT_VAK.search(text)
    if leftover:
        _fail(f"{name}: unexpected import left after rewrite: {leftover.group(0).strip()!r}")
    return text


def main() -> None:
    try:
        from grpc_tools import protoc
    except ImportError:
        _fail("grpcio-tools is not installed (pip install -e clients/python)")

    for rel in PROTO_FILES:
        if not (PROTO_ROOT / rel).is_file():
            _fail(f"proto not found: {PROTO_ROOT / rel}")

    # grpc_tools ships google/protobuf/*.proto (struct.proto etc.) here;
    # protoc.main() does not add it by itself.
    well_known = resources.files("grpc_tools") / "_proto"

    with tempfile.TemporaryDirectory(prefix="vak-gen-") as tmp:
        raw = Path(tmp) / "raw"
        raw.mkdir()
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={raw}",
            f"--pyi_out={raw}",
            f"--grpc_python_out={raw}",
            *PROTO_FILES,
        ]
        rc = protoc.main(args)
        if rc != 0:
            _fail(f"protoc failed with exit code {rc}")

        staged = Path(tmp) / "_gen"
        staged.mkdir()
        (staged / "__init__.py").write_text(
            '"""Generated from proto/vak/v1/agent.proto by generate.py. Do not edit."""\n'
        )
        for src_rel, dst_name in OUTPUTS.items():
            src = raw / src_rel
            if not src.is_file():
                _fail(f"protoc did not produce {src_rel}")
            text = _rewrite_imports(src.read_text(), dst_name)
            (staged / dst_name).write_text(text)

        # Swap in the complete tree in one step so a failed run never leaves
        # a half-written package behind.
        if OUT_DIR.exists():
            shutil.rmtree(OUT_DIR)
        shutil.move(str(staged), str(OUT_DIR))

    print(f"generated {', '.join(sorted(OUTPUTS.values()))} in {OUT_DIR}")


if __name__ == "__main__":
    main()
