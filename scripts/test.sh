#!/usr/bin/env bash
# The test suite (pytest) against the native build; sets up first if needed.
# Extra arguments go to pytest; test files or directories among them (tests/...)
# replace the default, the whole of tests/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/env.sh"
cd "$ROOT"
TARGETS=(tests)
for arg in "$@"; do
  case $arg in tests/*) TARGETS=() ;; esac
done
exec "$PY" -m pytest -q "${TARGETS[@]}" "$@"
