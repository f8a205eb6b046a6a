#!/usr/bin/env bash
# The test suite (pytest) against the native build; sets up first if needed.
# Extra arguments go to pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec "$PY" -m pytest -q tests "$@"
