#!/bin/bash
# Run the harness' pytest suite from bench/.venv (installs the venv if missing; no root needed
# for the tests themselves). Extra arguments go to pytest.
set -euo pipefail
BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ ! -x "$BENCH/.venv/bin/pytest" ]; then
  "$BENCH/install.sh" --no-apt
fi
cd "$BENCH"
exec "$BENCH/.venv/bin/python" -m pytest -q tests "$@"
