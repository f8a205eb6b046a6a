#!/usr/bin/env bash
# The main job: set up, then time the load-time permutation of a whole model
# (DeepSeek-V4.1-Flash, TP 1, 43 layers) against the reference and a plain
# copy. Extra arguments go to bench/bench_load_time.py (--help lists them).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/env.sh"
cd "$ROOT"
exec "$PY" bench/bench_load_time.py "$@"
