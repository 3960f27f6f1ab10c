"""Build hook (hatchling): generates vak_client/_gen from proto/vak/v1/agent.proto.

Runs grpcio-tools (a build requirement, see pyproject.toml) at build time, so
the generated code can never drift from the proto and is never committed:

- wheel: generates into a temporary directory and adds the files to the
  wheel as vak_client/_gen/; nothing is written to the source tree.
- editable wheel (`pip install -e`): the package is imported from the source
  tree, so the modules are generated there, into vak_client/_gen/ (which is
  git-ignored). Reinstall after the proto changes.
- sdist: carries the proto as proto/vak/v1/agent.proto, so a wheel builds
  from the unpacked sdist alone.

The proto is looked up in <root>/proto (an unpacked sdist), then in
<root>/../../proto (the repository: root is clients/python).

protoc emits absolute imports derived from the proto path
(`from vak.v1 import agent_pb2`); they are rewritten to package-relative ones
(`from . import agent_pb2`) so the modules live inside vak_client without a
top-level `vak` package. The descriptor is still registered under its proto
name "vak/v1/agent.proto".
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO_FILE = "vak/v1/agent.proto"
# agent.proto imports http.proto (the REST route option each RPC carries).
PROTO_FILES = (PROTO_FILE, "vak/v1/http.proto")

# What protoc writes (relative to its output root) -> flat name in _gen/.
OUTPUTS = {
    "vak/v1/agent_pb2.py": "agent_pb2.py",
    "vak/v1/agent_pb2.pyi": "agent_pb2.pyi",
    "vak/v1/agent_pb2_grpc.py": "agent_pb2_grpc.py",
    "vak/v1/http_pb2.py": "http_pb2.py",
    "vak/v1/http_pb2.pyi": "http_pb2.pyi",
}

# `from vak.v1 import agent_pb2 as x` / `from vak.v1 import agent_pb2`
_ABS_IMPORT = re.compile(r"^from vak\.v1 import (\w+_pb2)\b", re.MULTILINE)
_IMPORT_VAK = re.compile(r"^\s*(import vak\b|from vak\b)", re.MULTILINE)


class GenerateError(Exception):
    pass


def find_proto_root(root: Path) -> Path:
    for candidate in (root / "proto", root.parent.parent / "proto"):
        if (candidate / PROTO_FILE).is_file():
            return candidate.resolve()
    raise GenerateError(
        f"{PROTO_FILE} not found in {root / 'proto'} or {root.parent.parent / 'proto'}: "
        "build vak-client from the vak repository (clients/python) or from its sdist"
    )


def _rewrite_imports(text: str, name: str) -> str:
    text = _ABS_IMPORT.sub(r"from . import \1", text)
    leftover = _IMPORT_VAK.search(text)
    if leftover:
        raise GenerateError(f"{name}: unexpected import left after rewrite: {leftover.group(0).strip()!r}")
    return text


def generate(proto_root: Path, out_dir: Path) -> list[Path]:
    """Writes out_dir/{__init__.py, agent_pb2.py, agent_pb2.pyi, agent_pb2_grpc.py, http_pb2.py, http_pb2.pyi}.

    Everything is generated in a temporary directory first, so a failed run
    leaves out_dir as it was."""
    from importlib import resources

    from grpc_tools import protoc

    # grpc_tools ships google/protobuf/*.proto (struct.proto etc.) here;
    # protoc.main() does not add it by itself.
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="vak-gen-") as tmp:
        raw = Path(tmp) / "raw"
        raw.mkdir()
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_root}",
                f"-I{well_known}",
                f"--python_out={raw}",
                f"--pyi_out={raw}",
                f"--grpc_python_out={raw}",
                *PROTO_FILES,
            ]
        )
        if rc != 0:
            raise GenerateError(f"protoc failed with exit code {rc}")
        staged = Path(tmp) / "_gen"
        staged.mkdir()
        (staged / "__init__.py").write_text(
            '"""Generated from proto/vak/v1/agent.proto at build time (hatch_build.py). Do not edit."""\n'
        )
        for src_rel, dst_name in OUTPUTS.items():
            src = raw / src_rel
            if not src.is_file():
                raise GenerateError(f"protoc did not produce {src_rel}")
            (staged / dst_name).write_text(_rewrite_imports(src.read_text(), dst_name))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.move(str(staged), str(out_dir))
    return sorted(out_dir.iterdir())


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    _tmp: str | None = None

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        proto_root = find_proto_root(root)
        if self.target_name == "sdist":
            for proto in PROTO_FILES:
                build_data["force_include"][str(proto_root / proto)] = f"proto/{proto}"
            return
        if self.target_name != "wheel":
            return
        if version == "editable":
            generate(proto_root, root / "vak_client" / "_gen")
            return
        self._tmp = tempfile.mkdtemp(prefix="vak-client-build-")
        for path in generate(proto_root, Path(self._tmp) / "_gen"):
            build_data["force_include"][str(path)] = f"vak_client/_gen/{path.name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
