#!/usr/bin/env bash
# The one-call check for a machine with an NVIDIA GPU and no network (there:
# torch + CUDA 13, nvcc, compute-sanitizer, pytest, ninja; no pip installs).
# From a clean checkout, each step under its own timeout, within one budget:
#
#   gpu        torch sees a GPU; its architecture; the tools found
#   build      setup.py build_ext --inplace for that architecture only
#   ptxas      scripts/ptxas_gate.py on the build log (no spills, no stack)
#   tests      the suite's CUDA tests (pytest -k cuda; not the >2^31-byte ones)
#   runtime    tests/test_cuda_runtime.py: streams, threads, graphs, cache eviction, >2^31 bytes
#   memcheck   compute-sanitizer memcheck over bench/sanitizer_case.py, our kernels only
#   racecheck  the same under racecheck
#   bench_tp1  bench/bench_load_time.py on CUDA at TP 1, with per-kernel times
#   bench_tp8  the same at TP 8
#   model      bench/gpu_model.py --json $OUT/model.json (--ptxas-log build.log), when it exists
#
#   bash bench/gpu_check.sh
#   FLASHMLA_PERM_GPU_CHECK_DRY=1 [PYTHON=...] bash bench/gpu_check.sh
#
# Logs, JSON (gpu_check.json: per step name, status, seconds, log, figures)
# and the summary table (printed last) go to $OUT (default /tmp/gpu_check);
# build objects to $FLASHMLA_PERM_GPU_CHECK_WORK (default /tmp/flashmla_perm_gpu_check).
# Nothing is written into the repository but the module built in place
# (flashmla_perm/_C*.so). Exit status 0 only when no step failed or timed out.
#
# Dry mode (FLASHMLA_PERM_GPU_CHECK_DRY=1) runs the same steps on a machine
# without a GPU, each CUDA step replaced by its CPU counterpart, so that the
# plumbing is exercised: build reuses the native CPU module when it loads
# (FLASHMLA_PERM_GPU_CHECK_DRY_BUILD=1: build it, FLASHMLA_PERM_CUDA=0), ptxas
# is skipped, tests take the same selection on the CPU, the sanitizer steps run
# bench/sanitizer_case.py on the CPU, the benchmark runs 2 layers once, model
# runs as it is (it needs no GPU). Python: $PYTHON, else .venv/bin/python, else python3
# (outside dry mode: $PYTHON, else python3).
#
# FLASHMLA_PERM_GPU_CHECK_BUDGET_S (default 450; dry 1350) bounds the whole
# run: a step gets the smaller of its own timeout (dry: 3x) and what is left;
# one with under 5 s left is skipped (and counts as a failure).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A relative $PYTHON or $OUT is relative to where the script was started.
case ${PYTHON:-} in */*) [ "${PYTHON:0:1}" = / ] || PYTHON=$PWD/$PYTHON ;; esac
case ${OUT:-} in "" | /*) ;; *) OUT=$PWD/$OUT ;; esac
cd "$ROOT" || exit 2

DRY=${FLASHMLA_PERM_GPU_CHECK_DRY:-0}
[ "$DRY" = 1 ] || DRY=0
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
elif [ "$DRY" = 1 ] && [ -x "$ROOT/.venv/bin/python" ]; then
  PY=$ROOT/.venv/bin/python
else
  PY=python3
fi
OUT=${OUT:-/tmp/gpu_check}
if ! mkdir -p "$OUT" || ! OUT=$(cd "$OUT" && pwd); then
  echo "gpu_check: cannot create OUT=$OUT"
  exit 2
fi
WORK=${FLASHMLA_PERM_GPU_CHECK_WORK:-${TMPDIR:-/tmp}/flashmla_perm_gpu_check}
# Dry mode runs on small CPU machines: every timeout 3x, a larger budget.
SCALE=$([ "$DRY" = 1 ] && echo 3 || echo 1)
BUDGET=${FLASHMLA_PERM_GPU_CHECK_BUDGET_S:-$((450 * SCALE))}
# The reporter needs no torch: any python will do.
RPY=$(command -v python3 || echo "$PY")

# Unbuffered, no bytecode or pytest cache in the tree, the repository's package first.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 BENCH_PROGRESS=1
export HYPOTHESIS_STORAGE_DIRECTORY="$WORK/hypothesis"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export ROOT PY OUT WORK DRY

# Idempotent: this script's own files from an earlier run go first.
rm -f "$OUT"/steps.tsv "$OUT"/gpu_check.json "$OUT"/*.log "$OUT"/tests.xml "$OUT"/runtime.xml \
  "$OUT"/gpu.json "$OUT"/ptxas.json "$OUT"/bench_tp1.json "$OUT"/bench_tp8.json "$OUT"/model.json
: > "$OUT/steps.tsv"

now_ms() { date +%s%3N; }
T0=$(now_ms)
elapsed_s() { echo $(( ($(now_ms) - T0) / 1000 )); }

# The reporter: steps.tsv (+ each step's log and files) -> gpu_check.json;
# with "table", also the summary table on stdout.
report() {
  "$RPY" - "$OUT" "$DRY" "$BUDGET" "$(elapsed_s)" "$PY" "$1" <<'PYEOF'
import json, os, re, sys
import xml.etree.ElementTree as ET

out, dry, budget, elapsed, py, mode = sys.argv[1:7]


def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def text(log):
    try:
        with open(log, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def junit(name):
    try:
        root = ET.parse(os.path.join(out, name)).getroot()
    except (OSError, ET.ParseError):
        return {}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    n["passed"] = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    bad = [f"{c.get('classname', '').split('.')[-1]}::{c.get('name')}" for c in root.iter("testcase")
           if c.find("failure") is not None or c.find("error") is not None]
    if bad:
        n["failed_tests"] = bad[:20]
    return n


def sanitizer(log):
    t, f = text(log), {}
    if m := re.search(r"ERROR SUMMARY: (\d+) error", t):
        f["errors"] = int(m.group(1))
    if m := re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", t):
        f.update(hazards=int(m.group(1)), errors=int(m.group(2)), warnings=int(m.group(3)))
    if m := re.search(r"sanitizer cases on (\S+): (\d+)/(\d+) OK", t):
        f.update(device=m.group(1), cases_ok=int(m.group(2)), cases=int(m.group(3)))
    if m := re.search(r"calls served by each path: (\{.*\})", t):
        f["paths"] = m.group(1)
    return f


def bench(name):
    b = load(name)
    if not b:
        return {}
    f = {"wrong": len(b.get("wrong", []))}
    for r in b.get("rows", []):
        key = f"{r['device']} {r['kind']} {r['backend']}"
        f[key] = {"ms_per_layer": round(r["seconds_per_layer"] * 1e3, 3), "x_copy": round(r["x_copy"], 2),
                  "gbytes_per_s": round(r["gbytes_per_s"], 1)}
        if "speedup_vs_reference" in r:
            f[key]["vs_reference"] = round(r["speedup_vs_reference"], 2)
        if "extra_peak_fraction" in r:
            f[key]["extra_peak_fraction"] = round(r["extra_peak_fraction"], 3)
    kernels = [k for k in b.get("kernel_times", []) if k.get("backend") == "native"]
    f["native_kernels"] = [
        {"kind": k["kind"], "kernel": k.get("kernel"), "launches_per_op": k.get("launches_per_op"),
         "us_per_op": round(k["total_us_per_op"], 2) if "total_us_per_op" in k else None,
         **({"error": k["error"]} if "error" in k else {})}
        for k in kernels][:12]
    return f


def figures(name, log):
    if name == "gpu":
        return load("gpu.json") or {}
    if name == "build":
        m = re.search(r"^BUILD_INFO (\{.*\})$", text(log), re.M)
        f = json.loads(m.group(1)) if m else {}
        if "reusing" in text(log):
            f["reused"] = True
        return f
    if name == "ptxas":
        ks = load("ptxas.json") or []
        return {"kernel_builds": len(ks), "max_registers": max((k.get("registers", 0) for k in ks), default=None),
                "spill_bytes": sum(k.get("spill_stores", 0) + k.get("spill_loads", 0) for k in ks),
                "stack_bytes": sum(k.get("stack", 0) for k in ks)} if ks else {}
    if name in ("tests", "runtime"):
        f = junit(f"{name}.xml")
        if m := re.search(r"^NOTE (.*)$", text(log), re.M):
            f["note"] = m.group(1)
        return f
    if name in ("memcheck", "racecheck"):
        return sanitizer(log)
    if name.startswith("bench_"):
        return bench(f"{name}.json")
    if name == "model":
        m = load("model.json")
        if not isinstance(m, list):
            return {}
        rows = [r for r in m if isinstance(r, dict)]
        fr = [r["predicted_fraction"] for r in rows if isinstance(r.get("predicted_fraction"), (int, float))]
        return {"model_json": os.path.join(out, "model.json"), "cases": len(rows),
                "below_target": sum(1 for r in rows if r.get("meets_target") is False),
                "min_predicted_fraction": round(min(fr), 3) if fr else None}
    return {}


def short(name, f):
    """A few words of figures for the table."""
    if not f:
        return ""
    if name == "gpu":
        s = f"{f.get('name', '?')}, arch {f.get('arch', '?')}, torch {f.get('torch', '?')} (CUDA {f.get('torch_cuda')})"
        if "free_gib" in f:
            s += f", {f['free_gib']} of {f['total_gib']} GiB free"
        return s + ("" if f.get("hypothesis") else ", no hypothesis")
    if name == "build":
        return f"native={f.get('native')} cuda={f.get('cuda')} archs={','.join(f.get('cuda_archs', []))}" + (
            " (reused)" if f.get("reused") else "")
    if name == "ptxas":
        return f"{f['kernel_builds']} kernel builds, max {f['max_registers']} regs, spills {f['spill_bytes']} B, stack {f['stack_bytes']} B"
    if name in ("tests", "runtime"):
        s = f"{f.get('passed', '?')} passed, {f.get('failures', 0) + f.get('errors', 0)} failed, {f.get('skipped', 0)} skipped"
        return s + (f"; {f['note']}" if "note" in f else "")
    if name in ("memcheck", "racecheck"):
        s = f"cases {f.get('cases_ok', '?')}/{f.get('cases', '?')} on {f.get('device', '?')}"
        if "hazards" in f:
            s += f", {f['hazards']} hazards ({f['errors']} errors)"
        elif "errors" in f:
            s += f", {f['errors']} errors"
        return s
    if name == "model":
        return (f"{f['cases']} cases, {f['below_target']} below target, "
                f"min {f['min_predicted_fraction']} of a copy (predicted)")
    if name.startswith("bench_"):
        parts = []
        for k, v in f.items():
            if k.endswith(" native"):
                parts.append(f"{k.split()[1]} {v['ms_per_layer']} ms/layer {v['x_copy']}x copy")
        return "; ".join(parts) + (f"; {f['wrong']} WRONG" if f.get("wrong") else "")
    return ""


steps = []
with open(os.path.join(out, "steps.tsv")) as f:
    for line in f:
        name, status, ms, log, fatal, note = line.rstrip("\n").split("\t")
        step = {"name": name, "status": status, "seconds": round(int(ms) / 1000, 1), "log": log,
                "figures": figures(name, log) if status != "skipped" else {}}
        if note:
            step["note"] = note
        if fatal == "1":
            step["counts_as_failure"] = True
        steps.append(step)
ok = all(s["status"] == "ok" or (s["status"] == "skipped" and not s.get("counts_as_failure")) for s in steps)
summary = {"ok": ok, "dry": dry == "1", "python": py, "out": out, "budget_s": int(budget),
           "elapsed_s": int(elapsed), "steps": steps}
with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(summary, f, indent=2)
if mode == "table":
    print()
    print(f"== gpu_check summary{' (DRY: CPU counterparts)' if dry == '1' else ''}: "
          f"{'all steps ok' if ok else 'FAILED'} in {elapsed}s of {budget}s; {out}/gpu_check.json")
    print(f"{'step':10} {'status':8} {'secs':>6}  figures / note")
    for s in steps:
        detail = short(s["name"], s["figures"]) or s.get("note", "")
        if s.get("note") and detail != s["note"]:
            detail += f" [{s['note']}]"
        print(f"{s['name']:10} {s['status']:8} {s['seconds']:6.1f}  {detail}")
    print(f"logs: {out}/<step>.log")
PYEOF
}

# record NAME STATUS MILLISECONDS FATAL NOTE
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$OUT/$1.log" "$4" "${5//$'\t'/ }" >> "$OUT/steps.tsv"
  report json || echo "gpu_check: the reporter failed (see above)"
}

# skip NAME NOTE [FATAL]: a step that does not run.
skip() {
  echo "== [$1] skipped: $2"
  record "$1" skipped 0 "${3:-0}" "$2"
}

# run_step NAME TIMEOUT_S FUNCTION: FUNCTION (exported) runs in its own bash
# under timeout, output to $OUT/NAME.log; status ok / FAILED / TIMEOUT.
run_step() {
  local name=$1 limit=$(( $2 * SCALE )) fn=$3 left start rc status
  left=$(( BUDGET - $(elapsed_s) - 5 ))
  if (( left < 5 )); then
    skip "$name" "no time left in the ${BUDGET}s budget" 1
    return 1
  fi
  (( limit > left )) && limit=$left
  echo "== [$name] timeout ${limit}s, log $OUT/$name.log"
  start=$(now_ms)
  timeout --kill-after=10 "$limit" bash -c "$fn" > "$OUT/$name.log" 2>&1 < /dev/null
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status=TIMEOUT; echo "gpu_check: $name ran past its ${limit}s timeout (exit $rc)" >> "$OUT/$name.log" ;;
    *) status=FAILED ;;
  esac
  tail -n 4 "$OUT/$name.log" | sed 's/^/   | /'
  echo "   -> $name: $status (exit $rc) in $(( ($(now_ms) - start) / 1000 ))s"
  record "$name" "$status" $(( $(now_ms) - start )) 0 ""
  [ "$status" = ok ]
}

# ------------------------------------------------------------------ the steps
# Each runs in a child bash (exported functions and variables).

step_gpu() {
  echo "python: $PY ($(command -v "$PY" || echo not found))"
  for tool in nvcc compute-sanitizer ncu ninja nvidia-smi; do
    printf '%-18s %s\n' "$tool" "$(command -v "$tool" || echo 'not on PATH')"
  done
  echo "compute-sanitizer used: ${SANITIZER:-none found}"
  if [ "$DRY" = 0 ] && command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.max.sm --format=csv
  fi
  "$PY" - <<'PYEOF'
import importlib.util, json, os, sys
import torch

dry = os.environ["DRY"] == "1"
info = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "hypothesis": importlib.util.find_spec("hypothesis") is not None,
        "pytest": importlib.util.find_spec("pytest") is not None}
if torch.cuda.is_available():
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    free, total = torch.cuda.mem_get_info()
    info.update(name=torch.cuda.get_device_name(0), devices=torch.cuda.device_count(),
                arch=";".join(f"{a}.{b}" for a, b in caps),
                free_gib=round(free / 2**30, 1), total_gib=round(total / 2**30, 1))
elif dry:
    info.update(name="cpu (dry run)", arch="none")
print(json.dumps(info))
with open(os.path.join(os.environ["OUT"], "gpu.json"), "w") as f:
    json.dump(info, f, indent=2)
if not dry and not torch.cuda.is_available():
    print(f"gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU: "
          "nothing below can run. (FLASHMLA_PERM_GPU_CHECK_DRY=1 runs the CPU counterparts.)")
    sys.exit(1)
if not info["pytest"]:
    print("gpu_check: pytest is not installed for this python")
    sys.exit(1)
PYEOF
}

build_info_line() {
  "$PY" -c 'import json, flashmla_perm; print("BUILD_INFO " + json.dumps(flashmla_perm.build_info()))'
}

step_build() {
  if [ "$DRY" = 1 ] && [ "${FLASHMLA_PERM_GPU_CHECK_DRY_BUILD:-0}" != 1 ] &&
    "$PY" -c 'import sys, flashmla_perm; sys.exit(0 if flashmla_perm.build_info()["native"] else 1)'; then
    echo "dry: reusing the native CPU module built in place"
    build_info_line
    return
  fi
  # From nothing each time, so that the log holds every kernel's ptxas lines.
  rm -rf "${WORK:?}/temp" "${WORK:?}/lib"
  mkdir -p "$WORK"
  if [ "$DRY" = 1 ]; then
    export FLASHMLA_PERM_CUDA=0
  else
    export FLASHMLA_PERM_CUDA=1 TORCH_CUDA_ARCH_LIST=$ARCH
  fi
  export MAX_JOBS=${MAX_JOBS:-$(nproc)}
  echo "FLASHMLA_PERM_CUDA=$FLASHMLA_PERM_CUDA TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-} MAX_JOBS=$MAX_JOBS"
  "$PY" setup.py build_ext --inplace --build-temp "$WORK/temp" --build-lib "$WORK/lib" || return 1
  build_info_line || return 1
  "$PY" -c '
import sys, flashmla_perm
info = flashmla_perm.build_info()
want_cuda = sys.argv[1] == "0"
if not info["native"] or info["cuda"] != want_cuda:
    sys.exit(f"gpu_check: the module built is not the one asked for (cuda={want_cuda}): {info}")
' "$DRY"
}

step_ptxas() {
  "$PY" scripts/ptxas_gate.py "$OUT/build.log" --json "$OUT/ptxas.json"
}

# pytest, shared by tests and runtime: ARGS...
run_pytest() {
  local expect=()
  [ "$DRY" = 0 ] && expect=(FLASHMLA_PERM_EXPECT_CUDA=1)
  env FLASHMLA_PERM_EXPECT_NATIVE=1 "${expect[@]}" "$PY" -m pytest -p no:cacheprovider \
    -o faulthandler_timeout=60 -rfEs "$@"
}

step_tests() {
  local device=cuda ignore=(--ignore=tests/test_cuda_runtime.py)
  [ "$DRY" = 1 ] && device=cpu
  if ! "$PY" -c 'import hypothesis' 2> /dev/null; then
    echo "NOTE hypothesis is not installed: tests/test_fuzz.py left out"
    ignore+=(--ignore=tests/test_fuzz.py)
  fi
  FLASHMLA_PERM_FUZZ_EXAMPLES=${FLASHMLA_PERM_FUZZ_EXAMPLES:-$([ "$DRY" = 1 ] && echo 20 || echo 200)} \
    run_pytest -q tests "${ignore[@]}" -k "$device and not 2_31" --junitxml="$OUT/tests.xml"
}

step_runtime() {
  run_pytest -v tests/test_cuda_runtime.py --junitxml="$OUT/runtime.xml"
}

# sanitize TOOL: bench/sanitizer_case.py under compute-sanitizer TOOL, our kernels only.
sanitize() {
  if [ "$DRY" = 1 ]; then
    echo "dry: bench/sanitizer_case.py on the CPU instead of under compute-sanitizer --tool $1"
    "$PY" bench/sanitizer_case.py cpu
    return
  fi
  if [ -z "$SANITIZER" ]; then
    echo "gpu_check: compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)"
    return 1
  fi
  # memcheck: no caching allocator, so that an access past a tensor's end
  # leaves its allocation. kns: a substring of the mangled kernel name (the
  # namespace), so that torch's own kernels are neither checked nor slowed.
  env ${2:+"$2"} "$SANITIZER" --tool "$1" --kernel-name kns=flashmla_perm \
    --error-exitcode 9 --print-limit 20 "$PY" bench/sanitizer_case.py cuda
}
step_memcheck() { sanitize memcheck PYTORCH_NO_CUDA_MEMORY_CACHING=1; }
step_racecheck() { sanitize racecheck; }

# bench TP [ARGS...]
bench() {
  local tp=$1
  shift
  if [ "$DRY" = 1 ]; then
    "$PY" bench/bench_load_time.py --devices cpu --tp "$tp" --layers 2 --reps 1 --kernel-times \
      --json "$OUT/bench_tp$tp.json" "$@"
  else
    "$PY" bench/bench_load_time.py --devices cuda --tp "$tp" --reps 10 --kernel-times \
      --json "$OUT/bench_tp$tp.json" "$@"
  fi
}
step_bench_tp1() { bench 1; }
step_bench_tp8() { bench 8 --no-memory; }

# The launch model needs no GPU: the same run in dry mode, with today's
# register figures instead of this build's.
step_model() {
  local log=()
  grep -q "ptxas info" "$OUT/build.log" 2> /dev/null && log=(--ptxas-log "$OUT/build.log")
  "$PY" bench/gpu_model.py --json "$OUT/model.json" "${log[@]}"
}

SANITIZER=
for s in "$(command -v compute-sanitizer)" "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" \
  /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -n "$s" ] && [ -x "$s" ] && { SANITIZER=$s; break; }
done
ARCH=
export SANITIZER ARCH
export -f build_info_line run_pytest sanitize bench step_gpu step_build step_ptxas step_tests \
  step_runtime step_memcheck step_racecheck step_bench_tp1 step_bench_tp8 step_model

# ------------------------------------------------------------------ the run
echo "== gpu_check$([ "$DRY" = 1 ] && echo ' (DRY: CPU counterparts)'): $ROOT, python $PY, OUT $OUT, budget ${BUDGET}s"
DEPENDENTS=(ptxas tests runtime memcheck racecheck bench_tp1 bench_tp8 model)
if ! run_step gpu 15 step_gpu; then
  for s in build "${DEPENDENTS[@]}"; do skip "$s" "no usable GPU/python (gpu.log)" 1; done
else
  ARCH=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["arch"])' "$OUT/gpu.json") || ARCH=
  export ARCH
  if ! run_step build 180 step_build; then
    for s in "${DEPENDENTS[@]}"; do skip "$s" "no usable build (build.log)" 1; done
  else
    if [ "$DRY" = 1 ]; then
      skip ptxas "dry: no CUDA build"
    else
      run_step ptxas 5 step_ptxas
    fi
    run_step tests 60 step_tests
    run_step runtime 35 step_runtime
    run_step memcheck 40 step_memcheck
    run_step racecheck 40 step_racecheck
    run_step bench_tp1 70 step_bench_tp1  # four kinds, each with two memory probes (a process each)
    run_step bench_tp8 25 step_bench_tp8
    if [ -f bench/gpu_model.py ]; then
      run_step model 10 step_model
    else
      skip model "bench/gpu_model.py is absent"
    fi
  fi
fi

# The figures worth reading here, then the summary table last.
echo
[ -s "$OUT/ptxas.log" ] && { echo "== ptxas"; cat "$OUT/ptxas.log"; echo; }
for f in tests runtime; do
  [ -s "$OUT/$f.log" ] && grep -E '^(FAILED|ERROR) ' "$OUT/$f.log" | head -n 15 | sed "s/^/$f: /"
done
for f in bench_tp1 bench_tp8; do
  [ -s "$OUT/$f.log" ] && { echo "== $f"; sed -n '/^device /,$p' "$OUT/$f.log"; echo; }
done
report table
"$RPY" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$OUT/gpu_check.json"
