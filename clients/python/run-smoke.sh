#!/usr/bin/env bash
# Python client smoke test: one vak server shared by gRPC and REST.
# Creates clients/python/.venv when missing, installs the pinned client
# with its test extra, regenerates the protobuf modules from proto/, then
# runs smoke.py (run-tests.sh runs the pytest suite first). Works from any
# cwd, needs no stdin. Env: PYTHON (default python3) to create the venv,
# VAK_BIN (default <repo>/target/debug/vak). Arguments go to smoke.py (-v
# prints the events and server output); --setup-only stops before it.
set -euo pipefail

here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
py="$venv/bin/python"

if [[ ! -x "$py" ]]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi

# Reinstall only when pyproject.toml changed since the last install.
stamp="$venv/.vak-client-installed"
want="$(cksum <"$here/pyproject.toml") test"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  "$py" -m pip install --quiet --disable-pip-version-check -e "$here[test]" </dev/null
  printf '%s\n' "$want" >"$stamp"
fi

"$py" "$here/generate.py" </dev/null
if [[ "${1:-}" == "--setup-only" ]]; then
  exit 0
fi
exec "$py" "$here/smoke.py" "$@" </dev/null
