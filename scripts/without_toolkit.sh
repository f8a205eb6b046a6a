#!/usr/bin/env bash
# Runs a command as if no CUDA toolkit were installed, as in `pip install vllm`
# environments and vLLM's runtime image: in a mount namespace of its own
# (root, util-linux unshare), every toolkit folder is covered by an empty one,
# every nvcc on PATH by a script that fails, and CUDA_HOME / CUDA_PATH are
# unset.
#
#   bash scripts/without_toolkit.sh COMMAND [ARGS...]
set -euo pipefail
exec unshare -m bash -c '
set -euo pipefail
empty=$(mktemp -d)
for d in /usr/local/cuda /usr/local/cuda-* ${CUDA_HOME:-} ${CUDA_PATH:-}; do
  if [ -d "$d" ]; then mount --bind "$empty" "$(readlink -f "$d")"; fi
done
printf "#!/bin/sh\necho no toolkit here >&2\nexit 127\n" > "$empty.nvcc"
chmod +x "$empty.nvcc"
IFS=: read -ra dirs <<< "$PATH"
for d in "${dirs[@]}"; do
  if [ -e "$d/nvcc" ]; then mount --bind "$empty.nvcc" "$d/nvcc"; fi
done
unset CUDA_HOME CUDA_PATH
exec "$@"' without_toolkit "$@"
