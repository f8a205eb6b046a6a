#!/usr/bin/env bash
# The device check (device/README.md): bash device/check.sh, or without a GPU
# FLASHMLA_PERM_GPU_CHECK_DRY=1 [PYTHON=...] [OUT=...] bash device/check.sh.
# check.py imports no torch, so any python 3.9+ runs it.
set -u
exec "$(command -v python3 || echo "${PYTHON:-python3}")" "$(dirname "${BASH_SOURCE[0]}")/check.py" "$@"
