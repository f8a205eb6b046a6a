#!/usr/bin/env bash
# Lint and format checks: ruff for Python, clang-format for C++ and CUDA, at
# pinned versions in a venv of their own (.venv-lint), and that every mutant
# of scripts/mutants.py still finds its text. --fix applies the formatters.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${FLASHMLA_PERM_LINT_VENV:-$ROOT/.venv-lint}
cd "$ROOT"
[ -x "$VENV/bin/ruff" ] && [ -x "$VENV/bin/clang-format" ] ||
  { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q ruff==0.17.6 clang-format==23.1.5; }
mapfile -t CXX < <(git ls-files 'csrc/*.h' 'csrc/*.cpp' 'csrc/*.cu' 'tests/harness/*.cpp' 'device/*.c')
if [ "${1:-}" = --fix ]; then
  "$VENV/bin/ruff" check --fix .
  "$VENV/bin/ruff" format .
  "$VENV/bin/clang-format" -i "${CXX[@]}"
else
  "$VENV/bin/ruff" check .
  "$VENV/bin/ruff" format --check .
  "$VENV/bin/clang-format" --dry-run --Werror "${CXX[@]}"
  python3 scripts/mutants.py --check  # each planted bug still finds its text
  echo "lint: clean (${#CXX[@]} C++/CUDA files)"
fi
