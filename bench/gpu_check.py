#!/usr/bin/env python3
"""The one-call check for a machine with an NVIDIA GPU and no network (there:
torch + CUDA 13, nvcc, compute-sanitizer, ncu, pytest, ninja; no pip
installs). Run through bench/gpu_check.sh, the interface CI and the docs use.
From a clean checkout, each step a subprocess under its own timeout, within
one budget, the figures most wanted first:

  gpu        torch sees a GPU; its architecture; the tools found
  build      setup.py build_ext --inplace for that architecture only
  bench      bench/bench_load_time.py on CUDA: every kind, TP 1 2 4 8, wall and
             device times (CUDA graphs / profiler), per-kernel times, no memory probes;
             beside the copy (each layer into buffers of its own), torch's elementwise
             kernel streaming the weights in place and into a buffer (the inplace and
             outofplace baselines), and the copy into one buffer every layer reuses
             (copy_1buf: the first device run's copy, which the L2 helped)
  sweep      the benchmark's wq_b and wo_a at TP1 again under each of SWEEP (launch
             plans other than the default, through the executor's environment:
             at most n CTAs a SM, smaller tiles, two buffers for staged column
             tiles and for row tiles), the copy beside the native op in each process; time against
             bytes in flight and tile size tells the latency a tile sees from the
             issue rate, and which plan is fastest ($OUT/sweep.json)
  probe      bench/crash_probe.py: error paths, each the first op of its own
             process (the call that crashed the first device run's suite, the
             same after a valid op, other errors, the bad call on CPU tensors
             after CUDA's start), how each ended, and the native stack of any
             that died ($OUT/probe.json)
  tests      the suite's CUDA tests (pytest -k cuda; not the >2^31-byte ones); with
             pytest-xdist 4 workers (fewer on fewer cores), so that a test that
             crashes its process is named and the rest still run; the crashed
             test again alone with its native stack (bench/crash_probe.py
             --pytest; then cuda-gdb if there is one)
  runtime    tests/test_cuda_runtime.py: streams, threads, graphs, cache eviction, >2^31 bytes
  ptxas      scripts/ptxas_gate.py on the build log (no spills, no stack)
  ncu        Nsight Compute on one native wq_b and one wo_a call at TP 1
             (bench/ncu_case.py): DRAM throughput as a fraction of peak,
             shared-memory bank conflicts, instructions issued per byte moved;
             in a second pass, the cycles a warp waits on each stall reason
             per instruction issued; in a third, the same stalls with the
             duration and instructions under the kind's other stages (row1,
             col2: NCU_OTHER_PLAN); in a fourth (NCU_WHERE_METRICS), the
             busiest SM's active cycles over the mean's, sectors an L2 read
             request, waves, and the clocks; the step's timeout cuts the
             least wanted passes first
  memcheck   compute-sanitizer memcheck over bench/sanitizer_case.py, our kernels only
  racecheck  the same under racecheck
  model      bench/gpu_model.py --json $OUT/model.json (--ptxas-log build.log); with the
             bench's rows, --measured: predicted vs measured and a fit ($OUT/model_fit.json);
             with the sweep's, --sweep: each plan predicted vs measured, and one fit
             across them for each explanation, a tile's round trip or each
             warp's issue, and which fits better ($OUT/sweep_model.json). Last: it needs no GPU, and
             build.log, bench.json and sweep.json rerun it anywhere

gpu_check.json ($OUT, default /tmp/gpu_check) is rewritten as each step
starts and ends (name, status, seconds, timeout, log, figures), so a run cut
short keeps every finished step's figures; logs go beside it, build objects
to $FLASHMLA_PERM_GPU_CHECK_WORK (default /tmp/flashmla_perm_gpu_check), and
the summary table prints last. Nothing is written into the repository but
the module built in place (flashmla_perm/_C*.so). Exit status 0 only when no
step failed or timed out.

Dry mode (FLASHMLA_PERM_GPU_CHECK_DRY=1) runs the same steps in the same
order on a machine without a GPU, each CUDA step replaced by its CPU
counterpart, so that the plumbing is exercised: build reuses the native CPU
module when it loads (FLASHMLA_PERM_GPU_CHECK_DRY_BUILD=1: build it,
FLASHMLA_PERM_CUDA=0), the benchmark runs 2 layers once (256 Q tokens),
tests take the same selection on the CPU from two files (tests/test_ops.py,
tests/test_flashmla.py; CI runs the rest just before), ptxas is skipped, ncu runs
bench/ncu_case.py on the CPU without ncu, the sanitizer steps run
bench/sanitizer_case.py on the CPU.

Environment: PYTHON (the python with torch; default python3, in dry mode
.venv/bin/python when present), OUT, FLASHMLA_PERM_GPU_CHECK_BUDGET_S (default
480; dry 1440) bounds the whole run, build included: a step gets the smaller
of its own timeout (dry: 3x) and what is left, and one with under 5 s left is
skipped (and counts as a failure). FLASHMLA_PERM_GPU_CHECK_TIMEOUTS
("tests=30,ncu=20") overrides steps' own timeouts (before the dry 3x).

This program imports no torch (the steps do, in their own processes): a
broken torch still gets a report.
"""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET_S = 480
# Step timeouts (seconds, on a GPU machine); the order is the run order.
TIMEOUTS = {"gpu": 15, "build": 180, "bench": 120, "sweep": 150, "probe": 40, "tests": 90, "runtime": 35,
            "ptxas": 5, "ncu": 60, "memcheck": 50, "racecheck": 50, "model": 150}
NCU_KINDS = ("wq_b", "wo_a")
NCU_METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_of_peak",
    "dram__bytes_read.sum": "dram_bytes_read",
    "dram__bytes_write.sum": "dram_bytes_written",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "smem_bank_conflicts",
    "smsp__inst_executed.sum": "instructions",
    "gpu__time_duration.sum": "duration_ns",
}
# Why the warps wait: cycles a warp spends stalled on each reason per
# instruction it issues (their sum is the warp's cycles per instruction:
# the pair Nsight Compute's own CPIStall rule reads; the
# smsp__average_warp_latency_issue_stalled_* metrics are cycles over a
# warp's whole life instead).
# A second ncu pass of its own, so that a metric this ncu lacks costs only
# these figures. The first device run found the SMs issuing 0.2-0.3 of a
# scheduler's rate without saying on what they waited.
NCU_STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "lg_throttle", "mio_throttle", "drain", "membar",
              "wait", "not_selected", "selected", "math_pipe_throttle", "no_instruction", "dispatch_stall",
              "branch_resolving", "sleeping", "imc_miss", "misc")
NCU_STALL_METRICS = {f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio": r for r in NCU_STALLS}
NCU_STALL_METRICS.update({"smsp__average_warp_latency_per_inst_issued.ratio": "cycles_per_instruction",
                          "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct"})
# A third pass a kind under the sweep's other stages for its kernel, with
# its duration and instructions: whether a second tile buffer moves the
# stalls (a tile's round trip: long scoreboard and barrier) or leaves them.
# wq_b's rows run two buffers by default since 2026-12-05, so its other plan
# is one (the first device run's); wo_a's columns run one, so theirs is two.
NCU_OTHER_PLAN = {"wq_b": ("row1", {"FLASHMLA_PERM_ROW_STAGES": "1"}),
                  "wo_a": ("col2", {"FLASHMLA_PERM_COL_STAGES": "2"})}
NCU_PLAN_TIME_METRICS = {"gpu__time_duration.sum": "duration_ns", "smsp__inst_executed.sum": "instructions"}
NCU_PLAN_METRICS = {**NCU_STALL_METRICS, **NCU_PLAN_TIME_METRICS}
# A fourth pass a kind, the least wanted: what else could keep the kernels
# at 0.78-0.81 of the copy's bandwidth (the first device run) that the
# passes above do not show. How even the SMs' work is (the busiest SM's
# active cycles over the mean: a CTA holds 1.6-2.8 tiles, a few hold a last
# small one); how many 32-byte sectors an L2 read request carries (wo_a
# gathers 32-byte chunks 512 bytes apart, wq_b reads whole rows); the waves,
# and the CTAs a SM that the shared memory the driver granted (its carveout)
# and the registers allow (the plan counts on 6 of 33 KiB for wo_a: 198 KiB of
# the 228; the carveout asked for is a hint); and both clocks as ncu saw them
# (it leaves them alone, as the benchmark did).
NCU_WHERE_METRICS = {"sm__cycles_active.max": "sm_active_max", "sm__cycles_active.avg": "sm_active_avg",
                     "lts__t_sectors_srcunit_tex_op_read.sum": "l2_read_sectors",
                     "lts__t_requests_srcunit_tex_op_read.sum": "l2_read_requests",
                     "launch__waves_per_multiprocessor": "waves_per_sm",
                     "launch__occupancy_limit_shared_mem": "ctas_by_smem",
                     "launch__occupancy_limit_registers": "ctas_by_regs",
                     "launch__shared_mem_config_size": "smem_config_bytes",
                     "sm__cycles_elapsed.avg.per_second": "sm_hz", "dram__cycles_elapsed.avg.per_second": "dram_hz"}
# The benchmark's baselines the bench step asks for (bench_load_time.py
# BASELINES): torch's elementwise kernel in place and into each layer's
# buffers, and the copy into one buffer every layer reuses.
BENCH_BASELINES = ("inplace", "outofplace", "copy_1buf")
KILL_GRACE_S = 10  # after SIGTERM, before SIGKILL
GDB_TIMEOUT_S = 30  # cuda-gdb over a crashed test: the stack, not the tests step's whole time
# pytest-xdist processes of the tests step, where it is installed: no more than
# the cores (CI's dry run on 2 cores took 109 s with 4 workers, 67 s serially).
TEST_WORKERS = max(1, min(4, os.cpu_count() or 1))
# The sweep's launch plans: (label, environment, kinds), the ones a new
# default may come from first (a timeout keeps the plans that finished).
# Caps on CTAs a SM (the kernels plan 5 or 6: ctas6 is the default plan,
# measured in the same kind of process); the other number of tile buffers
# for each kernel: one for row tiles (wq_b: the rows kernel, two by default
# since 2026-12-05; row1 is the first device run's plan) and two for staged
# column tiles (wo_a: the cols kernel), each buffer half the budget; tile
# budgets under the default 32 KiB (row and staged column tiles), with each
# kernel's default stages and with its other.
SWEEP = (
    ("ctas6", {"FLASHMLA_PERM_MAX_CTAS_PER_SM": "6"}, "wq_b,wo_a"),
    ("row1", {"FLASHMLA_PERM_ROW_STAGES": "1"}, "wq_b"),
    ("col2", {"FLASHMLA_PERM_COL_STAGES": "2"}, "wo_a"),
    *((f"ctas{n}", {"FLASHMLA_PERM_MAX_CTAS_PER_SM": str(n)}, "wq_b,wo_a") for n in (4, 2, 1)),
    ("tile16k", {"FLASHMLA_PERM_TILE_BUDGET": "16384"}, "wq_b,wo_a"),
    ("tile8k", {"FLASHMLA_PERM_TILE_BUDGET": "8192"}, "wq_b,wo_a"),
    ("row1_tile16k", {"FLASHMLA_PERM_ROW_STAGES": "1", "FLASHMLA_PERM_TILE_BUDGET": "16384"}, "wq_b"),
    ("col2_tile16k", {"FLASHMLA_PERM_COL_STAGES": "2", "FLASHMLA_PERM_TILE_BUDGET": "16384"}, "wo_a"),
)

# The memcheck and racecheck steps run their cases under each of these:
# the default plan (whatever the caller's environment says: empty is unset;
# row tiles through two buffers, staged column tiles through one), and each
# kernel's other stages (what the sweep's row1 and col2 plans time), so that
# both forms of every in-place kernel are checked (but the two-stage form of
# short runs, the packed wv scale's: launches plan two stages at V = 16 only).
SANITIZE_PLANS = (("default", {"FLASHMLA_PERM_COL_STAGES": "", "FLASHMLA_PERM_ROW_STAGES": ""}),
                  ("other stages", {"FLASHMLA_PERM_COL_STAGES": "2", "FLASHMLA_PERM_ROW_STAGES": "1"}))


class StepFailed(Exception):
    pass


class StepTimeout(Exception):
    pass


class Interrupted(Exception):
    """The check itself got SIGTERM or SIGINT (an outer timeout, say)."""


def on_signal(signum, frame):
    raise Interrupted(f"the check got signal {signal.Signals(signum).name}")


# --------------------------------------------------------------------------- configuration

def find_tool(name):
    """On PATH, else in the CUDA toolkit's usual places."""
    for path in (shutil.which(name), os.path.join(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", name),
                 f"/usr/local/cuda/bin/{name}", f"/usr/local/cuda/{name}/{name}"):
        if path and os.access(path, os.X_OK):
            return path
    return None


def timeout_overrides(text):
    """'tests=30,ncu=20' -> {'tests': 30, 'ncu': 20}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, seconds = part.partition("=")
        if name not in TIMEOUTS:
            raise SystemExit(f"gpu_check: FLASHMLA_PERM_GPU_CHECK_TIMEOUTS names no step {name!r}")
        out[name] = int(seconds)
    return out


class Config:
    def __init__(self, env):
        self.dry = env.get("FLASHMLA_PERM_GPU_CHECK_DRY") == "1"
        venv = os.path.join(ROOT, ".venv", "bin", "python")
        default_py = venv if self.dry and os.access(venv, os.X_OK) else "python3"
        py = env.get("PYTHON") or default_py
        # A relative PYTHON or OUT is relative to where the check was started.
        self.py = os.path.abspath(py) if "/" in py else py
        self.out = os.path.abspath(env.get("OUT") or "/tmp/gpu_check")
        self.work = env.get("FLASHMLA_PERM_GPU_CHECK_WORK") or os.path.join(
            env.get("TMPDIR", "/tmp"), "flashmla_perm_gpu_check")
        scale = 3 if self.dry else 1  # dry mode runs on small CPU machines
        self.budget = int(env.get("FLASHMLA_PERM_GPU_CHECK_BUDGET_S") or BUDGET_S * scale)
        overrides = timeout_overrides(env.get("FLASHMLA_PERM_GPU_CHECK_TIMEOUTS", ""))
        self.timeouts = {k: overrides.get(k, v) * scale for k, v in TIMEOUTS.items()}
        self.sanitizer = find_tool("compute-sanitizer")
        self.ncu = find_tool("ncu")
        self.arch = ""  # set by the gpu step
        # Unbuffered, no bytecode or pytest cache in the tree, the repository's package first.
        self.env = dict(env, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", BENCH_PROGRESS="1",
                        HYPOTHESIS_STORAGE_DIRECTORY=os.path.join(self.work, "hypothesis"),
                        PYTHONPATH=ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""))

    def path(self, name):
        return os.path.join(self.out, name)


# --------------------------------------------------------------------------- running a step

class Step:
    """One step's run: its commands share the step's log and its deadline."""

    def __init__(self, cfg, name, limit):
        self.cfg, self.name, self.limit = cfg, name, limit
        self.log_path = cfg.path(f"{name}.log")
        self.deadline = time.monotonic() + limit
        self.log = open(self.log_path, "w")

    def say(self, text):
        self.log.write(text + "\n")
        self.log.flush()

    def run(self, argv, env=None, stdout=None, check=True):
        """argv in its own process group, output to the log (or stdout to a
        file); the whole group is killed at the step's deadline."""
        self.say("$ " + " ".join(argv))
        out = open(stdout, "w") if stdout else self.log
        try:
            proc = subprocess.Popen(argv, cwd=ROOT, env=dict(self.cfg.env, **(env or {})), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=self.log, start_new_session=True)
            try:
                rc = proc.wait(timeout=max(self.deadline - time.monotonic(), 0))
            except subprocess.TimeoutExpired:
                stop(proc)
                raise StepTimeout(f"ran past its {self.limit}s timeout")
            except Interrupted:
                stop(proc)  # its own session: the signal that stops us does not reach it
                raise
        finally:
            if stdout:
                out.close()
        if check and rc != 0:
            raise StepFailed(f"{os.path.basename(argv[0])} exited {rc}")
        return rc

    def python(self, *args, **kw):
        return self.run([self.cfg.py, *args], **kw)


def stop(proc):
    """SIGTERM to the step's process group, SIGKILL after a grace period."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


# --------------------------------------------------------------------------- the steps
# Each takes (cfg, step) and raises StepFailed / StepTimeout.

def step_gpu(cfg, step):
    step.say(f"python: {cfg.py} ({shutil.which(cfg.py) or 'not found'})")
    for tool in ("nvcc", "compute-sanitizer", "ncu", "ninja", "nvidia-smi"):
        step.say(f"{tool:18} {find_tool(tool) or 'not found'}")
    if not cfg.dry and shutil.which("nvidia-smi"):
        step.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.used,memory.total,clocks.max.sm",
                  "--format=csv"], check=False)
    step.python(os.path.abspath(__file__), "--gpu-info", cfg.path("gpu.json"), env={"DRY": "1" if cfg.dry else "0"})
    with open(cfg.path("gpu.json")) as f:
        cfg.arch = json.load(f).get("arch", "")


def gpu_info(path):
    """Runs with PYTHON (torch): what the steps below need, into `path`."""
    import importlib.util

    import torch

    dry = os.environ.get("DRY") == "1"
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
        from card import record_cuda_card  # bench/card.py: the figures the model's step plans with

        record_cuda_card(info)
    elif dry:
        info.update(name="cpu (dry run)", arch="none")
    print(json.dumps(info))
    with open(path, "w") as f:
        json.dump(info, f, indent=2)
    if not dry and not torch.cuda.is_available():
        sys.exit(f"gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU: "
                 "nothing below can run. (FLASHMLA_PERM_GPU_CHECK_DRY=1 runs the CPU counterparts.)")
    if not info["pytest"]:
        sys.exit("gpu_check: pytest is not installed for this python")
    return 0


BUILD_INFO = 'import json, flashmla_perm; print("BUILD_INFO " + json.dumps(flashmla_perm.build_info()))'
NATIVE_LOADS = 'import sys, flashmla_perm; sys.exit(0 if flashmla_perm.build_info()["native"] else 1)'
BUILT_AS_ASKED = '''
import sys, flashmla_perm
info = flashmla_perm.build_info()
want_cuda = sys.argv[1] == "1"
if not info["native"] or info["cuda"] != want_cuda:
    sys.exit(f"gpu_check: the module built is not the one asked for (cuda={want_cuda}): {info}")
'''


def step_build(cfg, step):
    dry_build = os.environ.get("FLASHMLA_PERM_GPU_CHECK_DRY_BUILD") == "1"
    if cfg.dry and not dry_build and step.python("-c", NATIVE_LOADS, check=False) == 0:
        step.say("dry: reusing the native CPU module built in place")
        step.python("-c", BUILD_INFO)
        return
    # From nothing each time, so that the log holds every kernel's ptxas lines.
    for d in ("temp", "lib"):
        shutil.rmtree(os.path.join(cfg.work, d), ignore_errors=True)
    os.makedirs(cfg.work, exist_ok=True)
    env = {"FLASHMLA_PERM_CUDA": "0"} if cfg.dry else {"FLASHMLA_PERM_CUDA": "1", "TORCH_CUDA_ARCH_LIST": cfg.arch}
    env["MAX_JOBS"] = os.environ.get("MAX_JOBS") or str(os.cpu_count())
    step.say(" ".join(f"{k}={v}" for k, v in env.items()))
    step.python("setup.py", "build_ext", "--inplace", "--build-temp", os.path.join(cfg.work, "temp"),
                "--build-lib", os.path.join(cfg.work, "lib"), env=env)
    step.python("-c", BUILD_INFO)
    step.python("-c", BUILT_AS_ASKED, "0" if cfg.dry else "1")


def step_bench(cfg, step):
    # With the baselines (BENCH_BASELINES): whether in place itself streams
    # at the copy's rate, and how much the L2 helped the first run's copy.
    common = ["--tp", "1", "2", "4", "8", "--no-memory", "--kernel-times", "--json", cfg.path("bench.json"),
              "--backends", ",".join(("reference", "native", *BENCH_BASELINES))]
    if cfg.dry:
        step.python("bench/bench_load_time.py", "--devices", "cpu", "--layers", "2", "--reps", "1",
                    "--tokens", "256", *common)
    else:
        step.python("bench/bench_load_time.py", "--devices", "cuda", "--reps", "5", *common)


def run_pytest(cfg, step, *args, env=None, check=True):
    env = dict(env or {}, FLASHMLA_PERM_EXPECT_NATIVE="1")
    if not cfg.dry:
        env["FLASHMLA_PERM_EXPECT_CUDA"] = "1"
    return step.python("-m", "pytest", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=60", "-rfEs", *args,
                       env=env, check=check)


def step_tests(cfg, step):
    ignore = ["--ignore=tests/test_cuda_runtime.py"]
    if step.python("-c", "import hypothesis", check=False) != 0:
        step.say("NOTE hypothesis is not installed: tests/test_fuzz.py left out")
        ignore.append("--ignore=tests/test_fuzz.py")
    # With pytest-xdist (the GPU machine has it), a test that kills its
    # process is reported by name and its worker replaced: the rest still run.
    # (The first device run lost every test to one segfault.)
    workers = []
    if step.python("-c", "import xdist", check=False) == 0:
        workers = ["-n", str(TEST_WORKERS)]
        step.say(f"pytest-xdist: {TEST_WORKERS} workers; a crashed one is named and replaced")
    examples = os.environ.get("FLASHMLA_PERM_FUZZ_EXAMPLES") or ("20" if cfg.dry else "200")
    device = "cpu" if cfg.dry else "cuda"
    # Dry, two files of the selection prove the plumbing (xdist, the junit
    # counts, crash naming): the whole of it is the CPU suite CI has just run.
    where = ["tests/test_ops.py", "tests/test_flashmla.py"] if cfg.dry else ["tests", *ignore]
    # -v: each result on a line of the log, so that a step cut short by its
    # timeout (pytest writes tests.xml only as it ends) still has its counts.
    rc = run_pytest(cfg, step, "-v", *workers, *where, "-k", f"{device} and not 2_31",
                    f"--junitxml={cfg.path('tests.xml')}", env={"FLASHMLA_PERM_FUZZ_EXAMPLES": examples}, check=False)
    crashed = crashed_tests(read_text(step.log_path))
    if crashed and not cfg.dry:
        native_backtrace(cfg, step, crashed[0])
    if rc != 0:
        raise StepFailed(f"pytest exited {rc}" + (f"; crashed: {', '.join(crashed)}" if crashed else ""))


def crashed_tests(log):
    """Tests that killed their process: named by xdist, or, without it, the
    test function in faulthandler's traceback."""
    named = re.findall(r"worker '\w+' crashed while running '([^']+)'", log, re.I)
    if named:
        return list(dict.fromkeys(named))
    if "Fatal Python error" not in log:
        return []
    frames = re.findall(r'File "[^"]*/(tests/test_\w+\.py)", line \d+ in (test_\w+)', log)
    return [f"{frames[0][0]}::{frames[0][1]}"] if frames else []


def native_backtrace(cfg, step, node):
    """The crashed test alone, its native stack into this step's log: from
    bench/crash_probe.py (a signal handler preloaded; the GPU machine has no
    gdb), then from cuda-gdb where the toolkit has one."""
    step.say(f"== native stack of {node} (bench/crash_probe.py --pytest)")
    step.python("bench/crash_probe.py", "--pytest", node, env={"FLASHMLA_PERM_EXPECT_NATIVE": "1"}, check=False)
    gdb = find_tool("cuda-gdb")
    if not gdb:
        step.say("no cuda-gdb")
        return
    step.say(f"== native backtrace of {node} (cuda-gdb, at most {GDB_TIMEOUT_S}s)")
    limit = ["timeout", "-k", "5", str(GDB_TIMEOUT_S)] if shutil.which("timeout") else []
    step.run([*limit, gdb, "-q", "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 40",
              "--args", cfg.py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:faulthandler", node],
             env={"FLASHMLA_PERM_EXPECT_NATIVE": "1"}, check=False)


def step_probe(cfg, step):
    step.python("bench/crash_probe.py", "--device", "cpu" if cfg.dry else "cuda", "--json", cfg.path("probe.json"),
                env={"FLASHMLA_PERM_EXPECT_NATIVE": "1"})


def step_runtime(cfg, step):
    run_pytest(cfg, step, "-v", "tests/test_cuda_runtime.py", f"--junitxml={cfg.path('runtime.xml')}")


def step_ptxas(cfg, step):
    step.python("scripts/ptxas_gate.py", cfg.path("build.log"), "--json", cfg.path("ptxas.json"))


def step_model(cfg, step):
    """The launch model needs no GPU: the same run in dry mode, with today's
    register figures instead of this build's."""
    log = []
    try:
        with open(cfg.path("build.log"), errors="replace") as f:
            if "ptxas info" in f.read():
                log = ["--ptxas-log", cfg.path("build.log")]
    except OSError:
        pass
    # On a device, its card: SMs, shared memory, clock, memory peak (an H100's
    # are not the H200's the model's defaults were fitted on).
    card = ["--card", cfg.path("gpu.json")] if (load_json(cfg.path("gpu.json")) or {}).get("card") else []
    inputs = log + card
    step.python("bench/gpu_model.py", "--json", cfg.path("model.json"), *inputs)
    # The benchmark's device rows beside the prediction, and the latency,
    # bandwidth and issue rate that explain them (the weight ops: their
    # launches simulate fast enough for the fit's repeated runs).
    if os.path.exists(cfg.path("bench.json")):
        step.python("bench/gpu_model.py", "--measured", cfg.path("bench.json"), "--ops", "wq_b,wo_a",
                    "--json", cfg.path("model_fit.json"), *inputs)
    if os.path.exists(cfg.path("sweep.json")):
        # Dry: CPU times, which no GPU model explains; a few evaluations show the plumbing.
        step.python("bench/gpu_model.py", "--sweep", cfg.path("sweep.json"), "--json", cfg.path("sweep_model.json"),
                    *(["--fit-evals", "6"] if cfg.dry else []), *inputs)


def step_ncu(cfg, step):
    """ncu processes, one a kind and pass, so that each profiled launch of our
    kernels (the mangled names hold the namespace) belongs to one kind and
    plan. The passes in order of worth, both kinds each: the main metrics,
    the stall reasons, the stalls under each kind's other stages, then
    balance, L2 requests and clocks; a timeout keeps the passes that ended."""
    if not cfg.dry and not cfg.ncu:
        raise StepFailed("ncu not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")

    def case(kind, plan=None):
        record = f"ncu_{kind}_{plan}.json" if plan else f"ncu_{kind}.json"
        return ["bench/ncu_case.py", kind, "--device", "cpu" if cfg.dry else "cuda", "--json", cfg.path(record)]

    if cfg.dry:
        for kind in NCU_KINDS:
            plan, plan_env = NCU_OTHER_PLAN[kind]
            step.say(f"dry: bench/ncu_case.py {kind} on the CPU instead of under ncu, then under {plan}")
            step.python(*case(kind))
            step.python(*case(kind, plan), env=plan_env)
        return

    def profile(report, metrics, argv, env=None):
        """One profiled process; its report as CSV wherever ncu wrote one (a
        case whose bytes came out wrong exits 1 after it was profiled). The
        process's exit status."""
        # --clock-control none: the card's clocks as the benchmark saw them
        # (ncu's default locks them to base, and no figure here is about clocks).
        rc = step.run([cfg.ncu, "--target-processes", "all", "--clock-control", "none", "--kernel-name-base",
                       "mangled", "--kernel-name", "regex:flashmla_perm", "--metrics", ",".join(metrics),
                       "--export", report, "--force-overwrite", cfg.py, *argv], env=env, check=False)
        if os.path.exists(report + ".ncu-rep"):
            step.run([cfg.ncu, "--import", report + ".ncu-rep", "--csv", "--page", "details", "--print-units", "base"],
                     stdout=report + ".csv", check=False)
        return rc

    # The main pass: a kind whose bytes come out wrong still has its report
    # read (the case exits 1 after it was profiled), and the other passes run.
    wrong = [kind for kind in NCU_KINDS if profile(cfg.path(f"ncu_{kind}"), NCU_METRICS, case(kind)) != 0]
    stalls_ok = True
    for kind in NCU_KINDS:
        if profile(cfg.path(f"ncu_{kind}_stalls"), NCU_STALL_METRICS, case(kind)) != 0:
            stalls_ok = False
            step.say(f"NOTE the stall metrics' ncu pass failed for {kind}: the main figures stand")
    for kind in NCU_KINDS:
        plan, plan_env = NCU_OTHER_PLAN[kind]
        # Where the stall pass failed (an ncu without one of those metrics),
        # the plan's duration and instructions alone.
        metrics = NCU_PLAN_METRICS if stalls_ok else NCU_PLAN_TIME_METRICS
        if profile(cfg.path(f"ncu_{kind}_stalls_{plan}"), metrics, case(kind, plan), env=plan_env) != 0:
            step.say(f"NOTE the {plan} ncu pass failed for {kind} (ncu_{kind}_{plan}.json says whether its "
                     "bytes were right): the default plan's figures stand")
    for kind in NCU_KINDS:
        if profile(cfg.path(f"ncu_{kind}_where"), NCU_WHERE_METRICS, case(kind)) != 0:
            step.say(f"NOTE the balance, L2 request and clock ncu pass failed for {kind}: the other figures stand")
    if wrong:
        raise StepFailed(f"the main ncu pass failed for {', '.join(wrong)} (ncu_<kind>.json says whether its bytes "
                         "were right)")


def sanitize(cfg, step, tool, env=None):
    """The cases under the default plan, then again under the sweep's
    other stages (SANITIZE_PLANS): a plan the next default may come from
    must be as clean."""
    if not cfg.dry and not cfg.sanitizer:
        raise StepFailed("compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    failed = []
    for label, plan_env in SANITIZE_PLANS:  # every plan, whatever the one before found
        step.say(f"plan: {label}")
        if cfg.dry:
            step.say(f"dry: bench/sanitizer_case.py on the CPU instead of under compute-sanitizer --tool {tool}")
            rc = step.python("bench/sanitizer_case.py", "cpu", env={**(env or {}), **plan_env}, check=False)
        else:
            # kns: a substring of the mangled kernel name (the namespace), so that
            # torch's own kernels are neither checked nor slowed.
            rc = step.run([cfg.sanitizer, "--tool", tool, "--kernel-name", "kns=flashmla_perm", "--error-exitcode",
                           "9", "--print-limit", "20", cfg.py, "bench/sanitizer_case.py", "cuda"],
                          env={**(env or {}), **plan_env}, check=False)
        if rc:
            failed.append(f"{label} (exit {rc})")
    if failed:
        raise StepFailed("plans failed: " + ", ".join(failed))


def step_memcheck(cfg, step):
    # No caching allocator: an access past a tensor's end leaves its allocation.
    sanitize(cfg, step, "memcheck", env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})


def step_racecheck(cfg, step):
    sanitize(cfg, step, "racecheck")


def step_sweep(cfg, step):
    """One benchmark process a plan (the executor reads its environment once
    a process), the copy beside the native op in each; their rows into
    sweep.json as each ends, so that a timeout keeps the plans that finished."""
    sweep, failed = {}, []
    for label, env, kinds in SWEEP:
        out = cfg.path(f"sweep_{label}.json")
        args = ["bench/bench_load_time.py", "--devices", "cpu" if cfg.dry else "cuda", "--tp", "1",
                "--kinds", kinds, "--backends", "native", "--no-memory", "--json", out]
        args += ["--layers", "2", "--reps", "1"] if cfg.dry else ["--reps", "5"]
        # A plan that fails (wrong bytes, a refused environment) is recorded
        # and the next one runs: each plan is a question of its own.
        rc = step.python(*args, env=env, check=False)
        doc = load_json(out) or {}
        sweep[label] = {"env": env, **({"exit_status": rc} if rc else {}), "rows": {
            f"{r['kind']} {r['backend']}": {"device_ms_per_layer": r["device_ms_per_layer"],
                                            "x_copy_device": r["x_copy_device"]}
            for r in doc.get("rows", [])}}
        if rc:
            failed.append(f"{label} (exit {rc})")
        with open(cfg.path("sweep.json"), "w") as f:
            json.dump(sweep, f, indent=2)
    if failed:
        raise StepFailed("plans failed: " + ", ".join(failed))


STEPS = {"gpu": step_gpu, "build": step_build, "bench": step_bench, "sweep": step_sweep, "probe": step_probe,
         "tests": step_tests, "runtime": step_runtime, "ptxas": step_ptxas, "ncu": step_ncu,
         "memcheck": step_memcheck, "racecheck": step_racecheck, "model": step_model}
assert list(STEPS) == list(TIMEOUTS)


# --------------------------------------------------------------------------- figures, per step

def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def junit(path):
    try:
        root = ET.parse(path).getroot()
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


def verbose_counts(log):
    """Counts from pytest -v's result lines (with xdist "[gw0] [ 5%] PASSED
    tests/...::t", without "tests/...::t PASSED [ 5%]"), for a run cut short
    before it wrote its junit XML; {} where there are none."""
    words = re.findall(r"^(?:\[gw\d+\] \[ *\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) \S+::"
                       r"|\S+::\S+ (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b)", log, re.M)
    results = [a or b for a, b in words]
    if not results:
        return {}
    n = {k: results.count(w) for k, w in (("passed", "PASSED"), ("failures", "FAILED"), ("errors", "ERROR"),
                                          ("skipped", "SKIPPED"))}
    return {"tests": len(results), **n, "from": "the log's -v lines (no junit XML: the run was cut short)"}


def sanitizer_run_figures(text):
    """One sanitizer process's figures (racecheck's summary over memcheck's)."""
    f = {}
    if m := re.search(r"ERROR SUMMARY: (\d+) error", text):
        f["errors"] = int(m.group(1))
    if m := re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text):
        f.update(hazards=int(m.group(1)), errors=int(m.group(2)), warnings=int(m.group(3)))
    if m := re.search(r"sanitizer cases on (\S+): (\d+)/(\d+) OK", text):
        f.update(device=m.group(1), cases_ok=int(m.group(2)), cases=int(m.group(3)))
    if m := re.search(r"calls served by each path: (\{.*\})", text):
        f["paths"] = m.group(1)
    return f


def sanitizer_figures(text):
    """Each plan's figures (the log's "plan: LABEL" lines start them), and
    their counts summed over the plans."""
    parts = re.split(r"^plan: (.*)$", text, flags=re.M)
    by_plan = {label: sanitizer_run_figures(body) for label, body in zip(parts[1::2], parts[2::2])}
    if not by_plan:
        return sanitizer_run_figures(text)
    f = {"plans": len(by_plan), "by_plan": by_plan}
    for one in by_plan.values():
        for key in ("errors", "hazards", "warnings", "cases_ok", "cases"):
            if key in one:
                f[key] = f.get(key, 0) + one[key]
        if "device" in one:
            f["device"] = one["device"]
    return f


def bench_figures(doc):
    """Per (device, kind, tp, backend): the wall and device figures."""
    if not doc:
        return {}
    f = {"wrong": len(doc.get("wrong", [])), "notes": doc.get("notes", [])}
    for r in doc.get("rows", []):
        g = {"ms_per_layer": round(r["ms_per_layer"], 4), "device_ms_per_layer": round(r["device_ms_per_layer"], 4),
             "device_time": r["device_time"], "x_copy": round(r["x_copy"], 2),
             "x_copy_device": round(r["x_copy_device"], 2), "gbytes_per_s_device": round(r["gbytes_per_s_device"], 1),
             "bytes_moved_per_layer": r["bytes_moved_per_layer"]}
        if "speedup_vs_reference" in r:
            g["vs_reference"] = round(r["speedup_vs_reference"], 2)
        f[f"{r['device']} {r['kind']} tp{r['tp']} {r['backend']}"] = g
    kernels = [k for k in doc.get("kernel_times", []) if k.get("backend") == "native" and k.get("tp") == 1]
    f["native_kernels_tp1"] = [
        {"kind": k["kind"], "kernel": k.get("kernel"), "launches_per_op": k.get("launches_per_op"),
         "us_per_op": round(k["total_us_per_op"], 2) if "total_us_per_op" in k else None,
         **({"error": k["error"]} if "error" in k else {})}
        for k in kernels][:12]
    return f


def number(text):
    return float(text.replace(",", ""))  # ncu may group thousands


def ncu_launches(csv_path, metrics):
    """{launch ID: {figure: value, "kernel": name}} of the `metrics` (ncu
    name -> figure) in one ncu report (the details page, as CSV)."""
    lines = [line for line in read_text(csv_path).splitlines() if line.startswith('"')]
    launches = {}
    for row in csv.DictReader(lines):
        metric = metrics.get(row.get("Metric Name", ""))
        if metric:
            launch = launches.setdefault(row["ID"], {"kernel": row.get("Kernel Name", "")})
            launch[metric] = number(row["Metric Value"])
    return launches


def ncu_kind_figures(csv_path, case):
    """Our kernels' launches in one ncu report, summed; the DRAM throughput
    weighted by duration."""
    launches = ncu_launches(csv_path, NCU_METRICS)
    if not launches:
        return {"error": f"no launch of our kernels in {csv_path}"}
    total = {m: sum(launch.get(m, 0.0) for launch in launches.values()) for m in NCU_METRICS.values()}
    moved = case["bytes_moved"] if case else None
    f = {"launches": len(launches), "kernels": sorted({launch["kernel"] for launch in launches.values()}),
         "smem_bank_conflicts": int(total["smem_bank_conflicts"]), "instructions": int(total["instructions"]),
         "dram_bytes": int(total["dram_bytes_read"] + total["dram_bytes_written"]),
         "duration_us": round(total["duration_ns"] / 1e3, 2)}
    if total["duration_ns"]:
        f["dram_pct_of_peak"] = round(sum(launch.get("dram_pct_of_peak", 0.0) * launch.get("duration_ns", 0.0)
                                          for launch in launches.values()) / total["duration_ns"], 1)
    if moved:
        f.update(bytes_moved=moved, instructions_per_byte=round(total["instructions"] / moved, 4),
                 dram_bytes_per_byte_moved=round(f["dram_bytes"] / moved, 3))
    stalls = ncu_stall_figures(csv_path.replace(".csv", "_stalls.csv"))
    if stalls:
        f["stalls"] = stalls
    plan = NCU_OTHER_PLAN[case["kind"]][0] if case and case.get("kind") in NCU_OTHER_PLAN else None
    if plan and (planned := ncu_stall_figures(csv_path.replace(".csv", f"_stalls_{plan}.csv"))):
        f[f"stalls_{plan}"] = planned
    where = ncu_where_figures(csv_path.replace(".csv", "_where.csv"))
    if where:
        f["where"] = where
    return f


def ncu_where_figures(csv_path):
    """NCU_WHERE_METRICS over our kernels' launches: the busiest SM's active
    cycles over the mean SM's (summed over launches), 32-byte sectors an L2
    read request, each launch's waves, the mean clocks (GHz)."""
    launches = list(ncu_launches(csv_path, NCU_WHERE_METRICS).values())
    if not launches:
        return {}

    def total(key):
        return sum(launch.get(key, 0.0) for launch in launches)

    def everywhere(key):  # a figure this ncu gave for every launch
        return all(key in launch for launch in launches)

    f = {}
    if everywhere("waves_per_sm"):
        f["waves_per_sm"] = [round(launch["waves_per_sm"], 2) for launch in launches]
    for key in ("ctas_by_smem", "ctas_by_regs"):
        if everywhere(key):
            f[key] = [int(launch[key]) for launch in launches]
    if everywhere("smem_config_bytes"):
        f["smem_config_kib"] = [round(launch["smem_config_bytes"] / 1024, 1) for launch in launches]
    for hz, ghz in (("sm_hz", "sm_ghz"), ("dram_hz", "dram_ghz")):
        if everywhere(hz):
            f[ghz] = round(total(hz) / len(launches) / 1e9, 3)
    if total("sm_active_avg"):
        f["sm_busiest_over_mean"] = round(total("sm_active_max") / total("sm_active_avg"), 3)
    if total("l2_read_requests"):
        f["l2_sectors_per_read_request"] = round(total("l2_read_sectors") / total("l2_read_requests"), 2)
    return f


def ncu_where_text(w):
    parts = {"sm_busiest_over_mean": lambda x: f"busiest SM x{x} the mean",
             "l2_sectors_per_read_request": lambda x: f"{x} sectors an L2 read",
             "waves_per_sm": lambda x: "waves " + "/".join(str(v) for v in x),
             "ctas_by_smem": lambda x: "CTAs a SM by shared memory " + "/".join(str(v) for v in x),
             "ctas_by_regs": lambda x: "by registers " + "/".join(str(v) for v in x),
             "smem_config_kib": lambda x: "carveout " + "/".join(str(v) for v in x) + " KiB",
             "sm_ghz": lambda x: f"SM clock {x} GHz", "dram_ghz": lambda x: f"DRAM clock {x} GHz"}
    return "; " + ", ".join(text(w[key]) for key, text in parts.items() if key in w)


def ncu_stall_figures(csv_path):
    """NCU_STALL_METRICS of our kernels' launches (the stall pass's CSV),
    each launch's weighted by its instructions' share: cycles a warp waits
    on each reason per instruction issued, largest first."""
    launches = ncu_launches(csv_path, NCU_PLAN_METRICS)
    if not launches:
        return {}
    n = len(launches)
    mean = {k: round(sum(launch.get(k, 0.0) for launch in launches.values()) / n, 2)
            for k in NCU_STALL_METRICS.values()}
    reasons = sorted(((mean[r], r) for r in NCU_STALLS if mean[r] > 0), reverse=True)
    f = {"cycles_per_instruction": mean["cycles_per_instruction"], "occupancy_pct": mean["occupancy_pct"],
         "per_instruction": {r: v for v, r in reasons}}
    # The plan pass also has its launches' duration and instructions, summed.
    if all("duration_ns" in launch for launch in launches.values()):
        f["duration_us"] = round(sum(launch["duration_ns"] for launch in launches.values()) / 1e3, 2)
    if all("instructions" in launch for launch in launches.values()):
        f["instructions"] = int(sum(launch["instructions"] for launch in launches.values()))
    return f


def ncu_top_stalls(stalls):
    return ", ".join(f"{r} {c}" for r, c in list(stalls["per_instruction"].items())[:4])


def ncu_figures(cfg):
    f = {}
    for kind in NCU_KINDS:
        case = load_json(cfg.path(f"ncu_{kind}.json"))
        if cfg.dry:
            plan = NCU_OTHER_PLAN[kind][0]
            planned = load_json(cfg.path(f"ncu_{kind}_{plan}.json"))
            f[kind] = {"dry": True, **case, **({f"ok_{plan}": planned.get("ok")} if planned else {})} if case else {}
        elif os.path.exists(cfg.path(f"ncu_{kind}.csv")):
            f[kind] = ncu_kind_figures(cfg.path(f"ncu_{kind}.csv"), case)
            plan = NCU_OTHER_PLAN[kind][0]
            planned = load_json(cfg.path(f"ncu_{kind}_{plan}.json"))
            if planned:
                f[kind][f"ok_{plan}"] = planned.get("ok")
    return f


def scaling_figures(doc):
    """Per op, from the model's --measured fit across TPs: the native's
    bandwidth as a fraction of the copy's, and the smallest TP's gap to the
    copy (us) from fixed costs and from bandwidth."""
    if not isinstance(doc, dict) or not doc.get("scaling"):
        return {}
    return {"scaling": {s["op"]: {"bandwidth_ratio": round(s["bandwidth_ratio"], 3),
                                  "gap_from_fixed_us": round(s["gap_from_fixed_us"], 2),
                                  "gap_from_bandwidth_us": round(s["gap_from_bandwidth_us"], 2),
                                  **{f"{b}_bandwidth_ratio": round(s[b]["bandwidth_ratio"], 3)
                                     for b in ("inplace", "copy_1buf") if b in s}}
                        for s in doc["scaling"]}}


def sweep_fit(doc):
    """The model's one fit across the sweep's plans (sweep_model.json), if
    any: a tile's round trip's, and which explanation fits the plans better
    (and the warp issue fit's figures)."""
    if not isinstance(doc, dict) or not doc.get("fitted"):
        return {}
    out = {"sweep_fitted": doc["fitted"], "sweep_worst_ratio": round(doc["worst_ratio"], 3)}
    warp = (doc.get("explanations") or {}).get("warp_issue")
    if warp:
        out.update(sweep_better=doc.get("better"), sweep_warp_fitted=warp["fitted"],
                   sweep_warp_worst_ratio=round(warp["worst_ratio"], 3))
    return out


def figures(cfg, name):
    log = read_text(cfg.path(f"{name}.log"))
    if name == "gpu":
        return load_json(cfg.path("gpu.json")) or {}
    if name == "build":
        m = re.search(r"^BUILD_INFO (\{.*\})$", log, re.M)
        f = json.loads(m.group(1)) if m else {}
        if "reusing" in log:
            f["reused"] = True
        return f
    if name == "bench":
        return bench_figures(load_json(cfg.path("bench.json")))
    if name in ("tests", "runtime"):
        f = junit(cfg.path(f"{name}.xml")) or verbose_counts(log)
        if m := re.search(r"^NOTE (.*)$", log, re.M):
            f["note"] = m.group(1)
        if crashed := crashed_tests(log):
            f["crashed"] = crashed
        return f
    if name == "ptxas":
        ks = load_json(cfg.path("ptxas.json")) or []
        return {"kernel_builds": len(ks), "max_registers": max((k.get("registers", 0) for k in ks), default=None),
                "spill_bytes": sum(k.get("spill_stores", 0) + k.get("spill_loads", 0) for k in ks),
                "stack_bytes": sum(k.get("stack", 0) for k in ks)} if ks else {}
    if name == "model":
        m = load_json(cfg.path("model.json"))
        if not isinstance(m, list):
            return {}
        rows = [r for r in m if isinstance(r, dict)]
        fr = [r["predicted_fraction"] for r in rows if isinstance(r.get("predicted_fraction"), (int, float))]
        fit = load_json(cfg.path("model_fit.json"))
        # In the bench line's terms (native time / copy time), beside it in the summary.
        tp1 = {r["op"]: round(1 / r["predicted_fraction"], 2) for r in rows
               if r.get("tp") == 1 and r.get("op") in ("wq_b", "wo_a") and r.get("predicted_fraction")}
        card = (rows[0].get("inputs") or {}).get("card_name") if rows else None
        return {"model_json": cfg.path("model.json"), "card": card, "tp1_x_copy_predicted": tp1, "cases": len(rows),
                "below_target": sum(1 for r in rows if r.get("meets_target") is False),
                "min_predicted_fraction": round(min(fr), 3) if fr else None,
                **({"fitted": fit["fitted"]} if isinstance(fit, dict) and fit.get("fitted") else {}),
                **scaling_figures(fit), **sweep_fit(load_json(cfg.path("sweep_model.json")))}
    if name == "ncu":
        return ncu_figures(cfg)
    if name in ("memcheck", "racecheck"):
        return sanitizer_figures(log)
    if name == "sweep":
        return {"plans": load_json(cfg.path("sweep.json")) or {}}
    if name == "probe":
        doc = load_json(cfg.path("probe.json")) or {}
        cases = doc.get("cases", [])
        return {"cases": len(cases), "as_expected": sum(1 for c in cases if c.get("ok")),
                "not": {c["case"]: c.get("how") or (f"raised {c['raised']}: {c.get('message', '')}" if c.get("raised")
                                                     else c.get("message", ""))
                        for c in cases if not c.get("ok")}} if cases else {}
    return {}


# --------------------------------------------------------------------------- the record

class Record:
    """Every step's outcome, rewritten into gpu_check.json at each change."""

    def __init__(self, cfg):
        self.cfg, self.t0, self.steps = cfg, time.monotonic(), []

    def elapsed(self):
        return time.monotonic() - self.t0

    def ok(self):
        return all(s["status"] == "ok" or (s["status"] == "skipped" and not s.get("counts_as_failure"))
                   for s in self.steps)

    def set(self, step):
        """Add `step`, or replace the entry of the same name."""
        self.steps = [s for s in self.steps if s["name"] != step["name"]] + [step]
        self.write()

    def write(self):
        cfg = self.cfg
        doc = {"ok": self.ok(), "dry": cfg.dry, "python": cfg.py, "out": cfg.out, "budget_s": cfg.budget,
               "elapsed_s": round(self.elapsed()), "steps": self.steps}
        tmp = cfg.path("gpu_check.json.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, cfg.path("gpu_check.json"))  # never half written, whenever the run is cut


def skip(record, name, note, fatal=False):
    print(f"== [{name}] skipped: {note}", flush=True)
    record.set({"name": name, "status": "skipped", "seconds": 0, "log": record.cfg.path(f"{name}.log"),
                "figures": {}, "note": note, **({"counts_as_failure": True} if fatal else {})})


def run_step(record, name):
    """The step under the smaller of its timeout and what is left of the
    budget; its figures recorded as it ends. True when it passed."""
    cfg = record.cfg
    left = cfg.budget - record.elapsed() - 5
    if left < 5:
        skip(record, name, f"no time left in the {cfg.budget}s budget", fatal=True)
        return False
    limit = int(min(cfg.timeouts[name], left))
    print(f"== [{name}] timeout {limit}s, log {cfg.path(name + '.log')}", flush=True)
    entry = {"name": name, "status": "running", "timeout_s": limit, "log": cfg.path(f"{name}.log")}
    record.set(entry)
    start = time.monotonic()
    step = Step(cfg, name, limit)
    interrupted = None
    try:
        STEPS[name](cfg, step)
        status, note = "ok", ""
    except StepTimeout as e:
        status, note = "TIMEOUT", str(e)
    except Interrupted as e:
        status, note, interrupted = "INTERRUPTED", str(e), e
    except StepFailed as e:
        status, note = "FAILED", str(e)
    except Exception as e:  # a step that cannot even start (no python, say): the others still run
        status, note = "FAILED", f"{type(e).__name__}: {e}"
    if note:
        step.say(f"gpu_check: {name}: {note}")
    step.log.close()
    seconds = time.monotonic() - start
    for line in read_text(step.log_path).splitlines()[-4:]:
        print(f"   | {line}")
    print(f"   -> {name}: {status} in {seconds:.0f}s", flush=True)
    # Reading a step's figures parses what the GPU's tools wrote, which the
    # dry run cannot rehearse: a surprise there costs that step's figures,
    # not the run.
    try:
        figs = figures(cfg, name)
    except Exception as e:
        figs = {"figures_error": f"{type(e).__name__}: {e}"}
        print(f"   !! {name}: its figures could not be read: {figs['figures_error']}", flush=True)
    record.set({**entry, "status": status, "seconds": round(seconds, 1), "figures": figs,
                **({"note": note} if note else {})})
    if interrupted:
        raise interrupted
    return status == "ok"


def run_all(record):
    """The steps in order. Without a usable GPU/python or build nothing else
    can run: the rest are skipped, as failures."""
    names = list(STEPS)
    for i, name in enumerate(names):
        if name == "ptxas" and record.cfg.dry:
            skip(record, name, "dry: no CUDA build")
            continue
        if not run_step(record, name) and name in ("gpu", "build"):
            why = "no usable GPU/python (gpu.log)" if name == "gpu" else "no usable build (build.log)"
            for rest in names[i + 1:]:
                skip(record, rest, why, fatal=True)
            return


# --------------------------------------------------------------------------- the summary

def short(name, f):
    """A few words of figures for the table."""
    if not f:
        return ""
    if name == "gpu":
        s = f"{f.get('name', '?')}, arch {f.get('arch', '?')}, torch {f.get('torch', '?')} (CUDA {f.get('torch_cuda')})"
        if "free_gib" in f:
            s += f", {f['free_gib']} of {f['total_gib']} GiB free"
        if card := f.get("card"):
            s += f", {card['sms']} SMs, {card.get('peak_tbps')} TB/s peak"
        elif "card_error" in f:
            s += f", no card figures ({f['card_error']}): the model assumed the H200's"
        return s + ("" if f.get("hypothesis") else ", no hypothesis")
    if name == "build":
        return f"native={f.get('native')} cuda={f.get('cuda')} archs={','.join(f.get('cuda_archs', []))}" + (
            " (reused)" if f.get("reused") else "")
    if name == "bench":
        parts = [f"{k.split()[1]} {v['device_ms_per_layer']:.3g} ms {v['x_copy_device']}x"
                 for k, v in f.items() if k.endswith(" native") and " tp1 " in k]
        baseline = [f"{k.split()[1]} {k.split()[3]} {v['x_copy_device']}x" for k, v in f.items()
                    if k.endswith(tuple(f" {b}" for b in BENCH_BASELINES)) and " tp1 " in k]
        return ("TP1 native, device ms/layer, x copy: " + "; ".join(parts)
                + (f"; baselines x copy: {', '.join(baseline)}" if baseline else "")
                + (f"; {f['wrong']} WRONG" if f.get("wrong") else ""))
    if name in ("tests", "runtime"):
        failed = f.get("failures", 0) + f.get("errors", 0)
        s = f"{f.get('passed', '?')} passed, {failed} failed, {f.get('skipped', 0)} skipped"
        if f.get("crashed"):
            s += f"; CRASHED: {', '.join(f['crashed'])}"
        return s + (f"; {f['note']}" if "note" in f else "")
    if name == "ptxas":
        return (f"{f['kernel_builds']} kernel builds, max {f['max_registers']} regs, "
                f"spills {f['spill_bytes']} B, stack {f['stack_bytes']} B")
    if name == "model":
        s = (f"{f['cases']} cases, {f['below_target']} below target, "
             f"min {f['min_predicted_fraction']} of a copy (predicted)")
        if f.get("tp1_x_copy_predicted"):
            s += (f"; TP1 predicted for {f.get('card')}, x copy: "
                  + ", ".join(f"{op} {x}x" for op, x in f["tp1_x_copy_predicted"].items()))
        if f.get("scaling"):
            named = {"inplace": "torch in place", "copy_1buf": "the copy into one buffer"}
            s += "; bandwidth x the copy's (across TPs): " + ", ".join(
                f"{op} native {v['bandwidth_ratio']:.2f}"
                + "".join(f", {words} {v[f'{b}_bandwidth_ratio']:.2f}" for b, words in named.items()
                          if f"{b}_bandwidth_ratio" in v)
                for op, v in f["scaling"].items())
        if "sweep_fitted" in f:
            s += (f"; one fit across the sweep's plans: latency {f['sweep_fitted']['latency_us']:.3g} us, "
                  f"ipc {f['sweep_fitted']['ipc']:.3g}, worst point x{f['sweep_worst_ratio']:.2f}")
        if "sweep_warp_fitted" in f:
            s += (f"; warp issue: a warp's {f['sweep_warp_fitted']['warp_cpi']:.3g} cycles an instruction, "
                  f"worst point x{f['sweep_warp_worst_ratio']:.2f}; better explained by {f['sweep_better']}")
        return s
    if name == "ncu":
        return "; ".join(
            f"{k}: " + (f"dry, {v.get('tensor_bytes')} B ok={v.get('ok')}"
                        + "".join(f" {key}={x}" for key, x in v.items() if key.startswith("ok_")) if v.get("dry") else
                        v.get("error") or f"{v.get('duration_us')} us, DRAM {v.get('dram_pct_of_peak')}% of peak, "
                        f"{v['smem_bank_conflicts']} bank conflicts, {v.get('instructions_per_byte')} inst/B"
                        + ("; stalls a instr: " + ncu_top_stalls(v["stalls"]) if v.get("stalls") else "")
                        + "".join(f"; {key[7:]}: {p.get('duration_us')} us"
                                  + (f", stalls {ncu_top_stalls(p)}" if p["per_instruction"] else "")
                                  for key, p in v.items() if key.startswith("stalls_"))
                        + "".join(f"; {key[3:]} BYTES WRONG" for key, x in v.items()
                                  if key.startswith("ok_") and x is False)
                        + (ncu_where_text(v["where"]) if v.get("where") else ""))
            for k, v in f.items() if v)
    if name == "sweep":
        parts, best = [], {}
        for label, plan in f.get("plans", {}).items():
            native = {k.split()[0]: v for k, v in plan["rows"].items() if k.endswith(" native")}
            parts.append(f"{label}: " + ", ".join(f"{kind} {v['x_copy_device']:.2f}x" for kind, v in native.items()))
            for kind, v in native.items():
                if kind not in best or v["x_copy_device"] < best[kind][1]:
                    best[kind] = (label, v["x_copy_device"])
        fastest = ", ".join(f"{kind} {label} ({x:.2f}x)" for kind, (label, x) in best.items())
        return f"fastest (native time x the copy's): {fastest}; plans: " + "; ".join(parts)
    if name == "probe":
        return (f"error paths, a process each: {f['as_expected']}/{f['cases']} as expected"
                + "".join(f"; {case}: {how}" for case, how in f["not"].items()))
    if name in ("memcheck", "racecheck"):
        s = f"cases {f.get('cases_ok', '?')}/{f.get('cases', '?')} on {f.get('device', '?')}"
        if "plans" in f:
            s += f" over {f['plans']} plans"
        if "hazards" in f:
            s += f", {f['hazards']} hazards ({f['errors']} errors)"
        elif "errors" in f:
            s += f", {f['errors']} errors"
        return s
    return ""


def print_summary(record):
    cfg = record.cfg
    print()
    ptxas = read_text(cfg.path("ptxas.log"))
    if ptxas:
        print(f"== ptxas\n{ptxas}")
    for name in ("tests", "runtime"):
        bad = [line for line in read_text(cfg.path(f"{name}.log")).splitlines() if re.match(r"(FAILED|ERROR) ", line)]
        for line in bad[:15]:
            print(f"{name}: {line}")
    bench = read_text(cfg.path("bench.log")).split("\nkernel times")[0]  # the main table, not the kernels'
    table = [line for line in bench.splitlines() if re.match(r"(device |-{20}|cpu |cuda)", line)]
    if table:
        print("== bench\n" + "\n".join(table) + "\n")
    print(f"== gpu_check summary{' (DRY: CPU counterparts)' if cfg.dry else ''}: "
          f"{'all steps ok' if record.ok() else 'FAILED'} in {record.elapsed():.0f}s of {cfg.budget}s; "
          f"{cfg.path('gpu_check.json')}")
    print(f"{'step':10} {'status':8} {'secs':>6}  figures / note")
    for s in record.steps:
        detail = short(s["name"], s.get("figures")) or s.get("note", "")
        if s.get("note") and detail != s["note"]:
            detail += f" [{s['note']}]"
        print(f"{s['name']:10} {s['status']:8} {s.get('seconds', 0):6.1f}  {detail}")
    print(f"logs: {cfg.out}/<step>.log")


# Files of an earlier run that this one rewrites (so that none is mistaken for this run's).
OUTPUTS = ("gpu_check.json", "gpu.json", "tests.xml", "runtime.xml", "ptxas.json", "bench.json", "model.json",
           "model_fit.json", "probe.json", "sweep.json", "sweep_model.json",
           *(f"sweep_{label}.json" for label, _, _ in SWEEP),
           *(f"ncu_{k}{ext}" for k in NCU_KINDS for ext in (".json", ".csv", ".ncu-rep", "_stalls.csv",
                                                             "_stalls.ncu-rep", "_where.csv", "_where.ncu-rep")),
           *(f"ncu_{k}{ext}" for k, (plan, _) in NCU_OTHER_PLAN.items()
             for ext in (f"_{plan}.json", f"_stalls_{plan}.csv", f"_stalls_{plan}.ncu-rep")))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--gpu-info":
        return gpu_info(sys.argv[2])
    cfg = Config(os.environ)
    try:
        os.makedirs(cfg.out, exist_ok=True)
    except OSError as e:
        print(f"gpu_check: cannot create OUT={cfg.out}: {e}")
        return 2
    for name in OUTPUTS + tuple(f"{s}.log" for s in STEPS):
        try:
            os.remove(cfg.path(name))
        except FileNotFoundError:
            pass
    record = Record(cfg)
    record.write()
    print(f"== gpu_check{' (DRY: CPU counterparts)' if cfg.dry else ''}: {ROOT}, python {cfg.py}, "
          f"OUT {cfg.out}, budget {cfg.budget}s", flush=True)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        run_all(record)
    except Interrupted as e:
        print(f"gpu_check: stopped: {e}")
    print_summary(record)
    return 0 if record.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
