#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU and no network (there: torch 2.11
# + CUDA 13 under Python 3.12, nvcc 13.0, compute-sanitizer, pytest, ninja).
# Builds the extension in place, runs the CUDA tests, compute-sanitizer
# memcheck and racecheck over a small case of each kernel, and the benchmark
# on CUDA; prints a summary table last. Meant to finish within 8 minutes.
#
#   bash bench/gpu_check.sh            logs and bench JSON under $OUT (or /tmp/gpu_check)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${OUT:-/tmp/gpu_check}
mkdir -p "$LOGS"
SUMMARY=()

step() {  # name, command...
  local name=$1 start=$(date +%s) result=ok
  shift
  echo "== $name: $*"
  "$@" > "$LOGS/$name.log" 2>&1 || result=FAILED
  tail -n 3 "$LOGS/$name.log"
  SUMMARY+=("$(printf '%-10s %-7s %5ss' "$name" "$result" $(( $(date +%s) - start )))")
}

# Only the GPU's own architecture: a quick build.
arch=$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
step build env TORCH_CUDA_ARCH_LIST="$arch" "$PY" setup.py build_ext --inplace
step tests env FLASHMLA_PERM_EXPECT_NATIVE=1 FLASHMLA_PERM_EXPECT_CUDA=1 FLASHMLA_PERM_FUZZ_EXAMPLES=300 \
  "$PY" -m pytest -q -p no:cacheprovider tests -k "cuda and not 2_31"
step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$PY" bench/sanitizer_case.py
step racecheck compute-sanitizer --tool racecheck --error-exitcode 9 "$PY" bench/sanitizer_case.py
step bench "$PY" bench/bench_load_time.py --devices cuda --reps 10 --json "$LOGS/bench.json"

echo
echo "== benchmark (CUDA, DeepSeek-V4.1-Flash TP1, 43 layers)"
sed -n '/^device/,$p' "$LOGS/bench.log"
echo
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
! printf '%s\n' "${SUMMARY[@]}" | grep -q FAILED
