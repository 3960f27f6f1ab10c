"""The package installs like any other: `pip install ./clients/python`
(not editable) into a fresh virtual environment gives a working client whose
generated modules were made by the build, without writing anything into the
source tree; its metadata has version ranges, not pins, and no build tools;
`python -m build` makes an sdist from which a complete wheel builds.

The install and the type-check are the shell blocks of README.md, run as
written from the repository root with HOME a temporary directory (pip's
cache stays the real one).

These tests need PyPI (pip installs the dependencies and the build
requirements); each subprocess has a deadline."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, Server

PACKAGE = REPO / "clients" / "python"
README = PACKAGE / "README.md"
TOP_README = REPO / "README.md"
INSTALL_DEADLINE = 600.0


def _env(home: Path | None = None) -> dict[str, str]:
    """The environment without anything that would put the source tree on
    sys.path; with `home`, HOME is that directory."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if home is not None:
        env.setdefault("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
        env["HOME"] = str(home)
    return env


def _run(argv: list[str], cwd: Path, timeout: float = INSTALL_DEADLINE, home: Path | None = None) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, env=_env(home), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{argv} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def shell_blocks(doc: Path) -> list[str]:
    """The bodies of a Markdown document's ```sh blocks."""
    return re.findall(r"^```sh\n(.*?)^```$", doc.read_text(), re.MULTILINE | re.DOTALL)


def readme_block(containing: str) -> str:
    """The one sh block of clients/python/README.md that contains `containing`."""
    blocks = [b for b in shell_blocks(README) if containing in b]
    assert len(blocks) == 1, f"{len(blocks)} sh blocks of {README} contain {containing!r}"
    return blocks[0]


def run_block(block: str, home: Path, timeout: float = INSTALL_DEADLINE) -> str:
    """Runs a README block with bash -eu from the repository root."""
    return _run(["bash", "--noprofile", "--norc", "-euc", block], cwd=REPO, timeout=timeout, home=home)


def git_status() -> str | None:
    """`git status --porcelain` of clients/python (untracked files listed one
    by one), or None when this is not a git checkout."""
    if shutil.which("git") is None:
        return None
    proc = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=all", "--", "clients/python"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.stdout if proc.returncode == 0 else None


@dataclass
class Installed:
    python: Path
    status_before: str | None
    status_after: str | None


INSTALL_COMMAND = "pip install ./clients/python"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """A fresh venv in a temporary HOME with `pip install ./clients/python`
    (non-editable): README.md's install block, run as written."""
    home = tmp_path_factory.mktemp("home")
    block = readme_block(INSTALL_COMMAND)
    before = git_status()
    out = run_block(block, home)
    assert "vak_client._sync.Client" in out, out
    (python,) = home.glob(".venvs/*/bin/python")
    yield Installed(python, before, git_status())


def test_the_top_readme_shows_the_tested_install() -> None:
    """The top-level README's Python block is the first line of the block run above."""
    section = TOP_README.read_text().split("### Python (`clients/python`)", 1)[1].split("\n### ", 1)[0]
    (block,) = re.findall(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert INSTALL_COMMAND in block
    assert block.strip() == readme_block(INSTALL_COMMAND).splitlines()[0].strip()


def test_pip_install_leaves_the_source_tree_alone(installed: Installed) -> None:
    if installed.status_before is None:
        pytest.skip("not a git checkout")
    assert installed.status_after == installed.status_before


CLIENT_SNIPPET = """
import sys
import vak_client
from vak_client import Client

url, token = sys.argv[1:3]
text = ""
with Client(url, token=token, unary="rest") as client:          # REST (httpx) for unary calls
    sid = client.create_session()
    with client.follow(sid, after=0) as events:                  # SSE (httpx-sse)
        client.run(sid, "hello world")
        for event in events:
            kind = event.WhichOneof("kind")
            if kind == "text_delta":
                text += event.text_delta.text
            elif kind == "run_finished":
                break
with Client(url, token=token) as client:                         # gRPC
    title = client.attach(sid).title
print(vak_client.__file__)
print(title)
print(text)
"""


def test_installed_package_runs_a_prompt(installed: Installed, server: Server, tmp_path: Path) -> None:
    out = _run([str(installed.python), "-c", CLIENT_SNIPPET, server.url, server.token], cwd=tmp_path, timeout=120)
    module, title, text = out.rstrip("\n").split("\n")
    # The installed copy, with its generated modules, not the source tree.
    assert Path(module).resolve().is_relative_to(installed.python.parent.parent.resolve()), module
    assert (Path(module).parent / "_gen" / "agent_pb2.py").is_file()
    assert title == "hello world"
    assert text == "echo: hello world"


METADATA_SNIPPET = """
import importlib.metadata, importlib.util, json, pathlib, re
from vak_client._gen import agent_pb2, agent_pb2_grpc

source = pathlib.Path(agent_pb2.__file__).read_text()
print(json.dumps({
    "requires": importlib.metadata.requires("vak-client") or [],
    "grpc_gencode": agent_pb2_grpc.GRPC_GENERATED_VERSION,
    "protobuf_gencode": re.search(r"Protobuf Python Version: ([0-9.]+)", source).group(1),
    "grpc_tools_installed": importlib.util.find_spec("grpc_tools") is not None,
}))
"""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_installed_metadata_has_ranges_and_no_build_tools(installed: Installed, tmp_path: Path) -> None:
    info = json.loads(_run([str(installed.python), "-c", METADATA_SNIPPET], cwd=tmp_path, timeout=60))
    runtime: dict[str, str] = {}
    for requirement in info["requires"]:
        spec, _, marker = requirement.partition(";")
        m = re.fullmatch(r"\s*([A-Za-z0-9._-]+)\s*(?:\[[^\]]*\])?\s*(.*?)\s*", spec)
        assert m, requirement
        name, versions = m.group(1).lower().replace("_", "-"), m.group(2)
        if marker.strip():
            # Only the test extra (its tools are pinned exactly: the Connect
            # stubs it generates must match the connectrpc it runs them with).
            assert re.fullmatch(r"""extra\s*==\s*["']test["']""", marker.strip()), requirement
            continue
        assert "==" not in versions, f"pinned: {requirement}"
        assert name != "grpcio-tools", f"grpcio-tools is a build requirement only: {requirement}"
        runtime[name] = versions
    assert set(runtime) == {"grpcio", "protobuf", "httpx", "httpx-sse"}, runtime
    for name, versions in runtime.items():
        assert ">=" in versions and "<" in versions.replace("<=", ""), f"{name}: not a bounded range: {versions}"
    assert not info["grpc_tools_installed"], "grpcio-tools was installed at runtime"

    # The generated code refuses runtimes older than the generator: the
    # lower bounds must be at least the gencode versions.
    def lower(name: str) -> tuple[int, ...]:
        m = re.search(r">=\s*([0-9.]+)", runtime[name])
        assert m, runtime[name]
        return _version(m.group(1))

    assert lower("grpcio") >= _version(info["grpc_gencode"]), (runtime["grpcio"], info["grpc_gencode"])
    assert lower("protobuf") >= _version(info["protobuf_gencode"]), (runtime["protobuf"], info["protobuf_gencode"])


def test_build_makes_an_sdist_that_builds_a_complete_wheel(tmp_path: Path) -> None:
    """`python -m build` makes the sdist, then the wheel from the unpacked sdist."""
    before = git_status()
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(PACKAGE)], cwd=tmp_path)
    if before is not None:
        assert git_status() == before
    (sdist,) = dist.glob("vak_client-*.tar.gz")
    (wheel,) = dist.glob("vak_client-*.whl")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"proto/vak/v1/agent.proto", "hatch_build.py", "pyproject.toml", "vak_client/__init__.py"} <= names
    assert not any(n.startswith("vak_client/_gen") for n in names), "generated code in the sdist"
    with zipfile.ZipFile(wheel) as whl:
        files = set(whl.namelist())
    generated = {f"vak_client/_gen/{n}" for n in ("__init__.py", "agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py")}
    assert generated <= files, sorted(files)
    assert "vak_client/py.typed" in files
    assert not any(f.startswith(("tests/", "proto/")) or f == "hatch_build.py" for f in files), sorted(files)


def test_readme_type_check_passes(tmp_path: Path) -> None:
    """README.md's mypy block, with its venv in a temporary directory."""
    block = readme_block("mypy --strict").replace("/tmp/mypy", str(tmp_path / "mypy"))
    (tmp_path / "home").mkdir()
    out = run_block(block, tmp_path / "home")
    assert "Success: no issues found" in out, out
