#!/usr/bin/env bash
# One row of README's "Tested torch releases": in a fresh virtual environment
# with torch==VERSION from the package index, the CPU-only build
# (FLASHMLA_PERM_CUDA=0) and the suite, then the default build and the suite.
# Prints the row (markdown) last; deletes the environment unless KEEP=1.
#
#   bash scripts/torch_matrix.sh 2.9.1 [VERSION ...]
#
# The module is built in place (flashmla_perm/_C*.so), as scripts/test.sh
# does: the next scripts/test.sh rebuilds it for its own torch.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 TORCH_VERSION [...]" >&2; exit 2; }

suite() {  # label, extra env...: build (if needed) and run the suite; sets RESULT
  local label=$1; shift
  local start=$(date +%s) log=$VENV/$label.log
  if env "$@" FLASHMLA_PERM_VENV="$VENV" FLASHMLA_PERM_TORCH="$TORCH" FLASHMLA_PERM_EXPECT_NATIVE=1 \
      bash "$ROOT/scripts/test.sh" -p no:cacheprovider > "$log" 2>&1; then
    RESULT="$(grep -Eo '[0-9]+ passed[^=]*' "$log" | tail -n 1 | sed 's/ in .*//')"
  else
    RESULT="FAILED ($(grep -E 'FAILED|failed|Error' "$log" | tail -n 1 | cut -c1-80); log $log)"
  fi
  BUILD_S=$(grep -Eo 'built in [0-9]+s' "$log" | grep -Eo '[0-9]+' | tail -n 1)
  CUDA_LINE=$(grep -Eo 'flashmla_perm: CUDA kernels (on|off)[^(]*' "$VENV/build.log" 2>/dev/null | tail -n 1)
  echo "== $TORCH, $label: $RESULT (build ${BUILD_S:-?}s, all $(( $(date +%s) - start ))s) ${CUDA_LINE}"
}

ROWS=()
for TORCH in "$@"; do
  VENV=$(mktemp -d "/tmp/flashmla_perm_torch_$TORCH.XXXXXX")
  start=$(date +%s)
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "torch==$TORCH" > "$VENV/install.log" 2>&1 ||
    { echo "== torch==$TORCH: install failed ($VENV/install.log)"; continue; }
  FULL=$("$VENV/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null)
  echo "== torch $FULL installed in $(( $(date +%s) - start ))s"
  suite cpu-only FLASHMLA_PERM_CUDA=0
  CPU="ok (${BUILD_S:-?} s)"; CPU_SUITE=$RESULT
  [ "${RESULT#FAILED}" = "$RESULT" ] || CPU="FAILED"
  suite default
  INFO=$("$VENV/bin/python" -c "import flashmla_perm as f; i = f.build_info(); print('CUDA' if i['cuda'] else 'CPU-only: ' + str(i['cuda_off_reason']).split(' - ')[0])" 2>/dev/null)
  ROWS+=("| $FULL | $CPU | $CPU_SUITE | ${INFO:-not built}, ${BUILD_S:-?} s | $RESULT |")
  [ "${KEEP:-0}" = 1 ] || rm -rf "$VENV"
done
echo
echo "| torch | CPU-only build | suite | default build | suite |"
echo "| --- | --- | --- | --- | --- |"
printf '%s\n' "${ROWS[@]}"
