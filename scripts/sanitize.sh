#!/usr/bin/env bash
# The native CPU module built with AddressSanitizer and UndefinedBehaviorSanitizer,
# and the whole pytest suite run against it. Any report fails the run.
# Rebuilds the module in place; the next scripts/test.sh rebuilds the normal one.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export FLASHMLA_PERM_SANITIZE=address,undefined FLASHMLA_PERM_CUDA=0
source "$ROOT/scripts/env.sh"
cd "$ROOT"
# Python itself is not instrumented: the runtimes are preloaded. Leak checks
# are off (the interpreter keeps its objects at exit by design).
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
exec "$PY" -m pytest -q -p no:cacheprovider tests "$@"
