#!/usr/bin/env bash
# The Python client's tests: the pytest suite (tests/, against live `vak
# serve` processes it starts itself), then the smoke test (smoke.py).
# Creates clients/python/.venv when missing and installs the package into it
# (see run-smoke.sh: `pip install -e .[test]`, whose build hook generates the
# protobuf modules from proto/), then runs both. Works from any cwd, needs no
# stdin. Env: PYTHON (default python3) to create the venv, VAK_BIN (default
# <repo>/target/debug/vak). Arguments go to pytest (e.g. -k follow_many -x).
set -euo pipefail

here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
"$here/run-smoke.sh" --setup-only
py="$here/.venv/bin/python"

cd "$here"
"$py" -m pytest -q -p no:cacheprovider "$@" tests </dev/null
"$py" "$here/smoke.py" </dev/null
