#!/usr/bin/env bash
# Python client smoke test: one vak server shared by gRPC and REST.
# Creates clients/python/.venv when missing and installs the client into it
# with its test extra (`pip install -e '.[test]'`: the build hook generates
# vak_client/_gen from proto/), reinstalling whenever pyproject.toml, the
# build hook or the proto changed; then runs smoke.py (run-tests.sh runs the
# pytest suite first). Works from any cwd, needs no stdin. Env: PYTHON
# (default python3) to create the venv, VAK_BIN (default
# <repo>/target/debug/vak). Arguments go to smoke.py (-v prints the events and
# server output); --setup-only stops before it.
set -euo pipefail

here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
py="$venv/bin/python"

if [[ ! -x "$py" ]]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi

stamp="$venv/.vak-client-installed"
want="$(cat "$here/pyproject.toml" "$here/hatch_build.py" "$here/../../proto/vak/v1/agent.proto" | cksum) test"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" || ! -f "$here/vak_client/_gen/agent_pb2.py" ]]; then
  "$py" -m pip install --quiet --disable-pip-version-check -e "$here[test]" </dev/null
  printf '%s\n' "$want" >"$stamp"
fi

if [[ "${1:-}" == "--setup-only" ]]; then
  exit 0
fi
exec "$py" "$here/smoke.py" "$@" </dev/null
