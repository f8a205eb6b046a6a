#!/usr/bin/env bash
# Lint and format checks: ruff for Python, clang-format for C++ and CUDA, at
# pinned versions in a venv of their own (.venv-lint). --fix applies the
# formatters; each failure names what to run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${FLASHMLA_PERM_LINT_VENV:-$ROOT/.venv-lint}
cd "$ROOT"
[ -x "$VENV/bin/ruff" ] && [ -x "$VENV/bin/clang-format" ] ||
  { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q ruff==0.17.6 clang-format==23.1.5; }
mapfile -t CXX < <(git ls-files -co --exclude-standard 'csrc/*.h' 'csrc/*.cpp' 'csrc/*.cu' 'tests/harness/*.cpp' 'tests/stub_cuda/*.c' 'device/*.c')
if [ "${1:-}" = --fix ]; then
  "$VENV/bin/ruff" check --fix .
  "$VENV/bin/ruff" format .
  "$VENV/bin/clang-format" -i "${CXX[@]}"
else
  fix="lint: to fix, run: bash scripts/lint.sh --fix"
  "$VENV/bin/ruff" check . || { echo "$fix (or edit what ruff names)"; exit 1; }
  "$VENV/bin/ruff" format --check . || { echo "$fix"; exit 1; }
  "$VENV/bin/clang-format" --dry-run --Werror "${CXX[@]}" || { echo "$fix"; exit 1; }
  echo "lint: clean (${#CXX[@]} C++/CUDA files)"
fi
