#!/usr/bin/env bash
# The one-call check for a machine with an NVIDIA GPU and no network:
# build, benchmark, tests, runtime tests, ptxas gate, ncu, sanitizers, each
# step under its own timeout within 8 minutes, figures in $OUT/gpu_check.json
# as each step ends. The steps, the environment (PYTHON, OUT,
# FLASHMLA_PERM_GPU_CHECK_DRY=1 for the CPU counterparts, budget, timeouts)
# and the output: bench/gpu_check.py, which this runs.
#
#   bash bench/gpu_check.sh
#   FLASHMLA_PERM_GPU_CHECK_DRY=1 [PYTHON=...] [OUT=...] bash bench/gpu_check.sh
#
# The orchestrator imports no torch, so any python 3.8+ runs it: python3 when
# there is one, else $PYTHON. Relative PYTHON and OUT stay relative to the
# directory this was started in.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RPY=$(command -v python3 || echo "${PYTHON:-python3}")
exec "$RPY" "$HERE/gpu_check.py" "$@"
