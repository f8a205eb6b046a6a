#!/usr/bin/env bash
# The test suite (pytest) against the native build; sets up first if needed.
# Extra arguments go to pytest; test files or directories among them (tests/...,
# device/tests/...) replace the default: tests/ and the device tooling's device/tests/.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/env.sh"
cd "$ROOT"
TARGETS=(tests device/tests)
for arg in "$@"; do
  case $arg in tests/* | device/tests*) TARGETS=() ;; esac
done
exec "$PY" -m pytest -q "${TARGETS[@]}" "$@"
