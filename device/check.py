#!/usr/bin/env python3
"""The device check (device/README.md): each step a subprocess under its own
timeout within one budget, its figures into $OUT/gpu_check.json as it ends.
Imports no torch (a broken torch still gets a report). Exit status 0 only
when every step passed.
"""

import csv
import glob
import importlib.util
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
sys.path.insert(0, os.path.join(ROOT, "device"))
import crash_probe  # noqa: E402  (no torch at import)

# The package's one reader of on/off switches, loaded on its own (no torch).
_spec = importlib.util.spec_from_file_location("_switches", os.path.join(ROOT, "flashmla_perm", "_switches.py"))
_switches = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_switches)
switch = _switches.switch

BUDGET_S = 480
# Step timeouts (s) on a GPU machine, in run order; dry mode: 3x.
TIMEOUTS = {
    "gpu": 10,
    "build": 85,
    "probe": 45,
    "bench": 55,
    "sweep": 50,
    "tests": 65,
    "runtime": 25,
    "first_use": 60,
    "images": 5,
    "ncu": 25,
    "memcheck": 20,
    "racecheck": 20,
    "model": 15,
}  # 480 in all
BENCH_BASELINES = ("inplace", "outofplace", "copy_1buf")  # bench_load_time.py's BASELINES
BENCH_KINDS = "wq_b,wo_a,wq_b_packed,wv_packed,permute_q,permute_q_h128,load"
# The sweep's launch plans (label, the executor's environment, kinds), each
# timed in a benchmark process of its own beside the copy.
SWEEP = (
    ("ctas6", {"FLASHMLA_PERM_MAX_CTAS_PER_SM": "6"}, "wq_b,wo_a"),
    ("row1", {"FLASHMLA_PERM_ROW_STAGES": "1"}, "wq_b"),
    ("col2", {"FLASHMLA_PERM_COL_STAGES": "2"}, "wo_a"),
    *((f"ctas{n}", {"FLASHMLA_PERM_MAX_CTAS_PER_SM": str(n)}, "wq_b,wo_a") for n in (4, 2, 1)),
    ("tile16k", {"FLASHMLA_PERM_TILE_BUDGET": "16384"}, "wq_b,wo_a"),
    ("tile8k", {"FLASHMLA_PERM_TILE_BUDGET": "8192"}, "wq_b,wo_a"),
)
# The sanitizers run their cases under the default plan and each kernel's other stages.
SANITIZE_PLANS = (("default", {}), ("other stages", {"FLASHMLA_PERM_COL_STAGES": "2", "FLASHMLA_PERM_ROW_STAGES": "1"}))
NCU_FLAGS = (  # our kernels only (the mangled names hold the namespace), at the card's own clocks
    "--target-processes all --clock-control none --kernel-name-base mangled --kernel-name regex:flashmla_perm"
    " --force-overwrite"
)
NCU_METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_of_peak",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "bank_conflicts",
    "smsp__inst_executed.sum": "instructions",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
}


class StepFailed(Exception):  # a step's own failure (TimeoutError: its deadline)
    pass


def find_tool(name):
    for path in (shutil.which(name), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name)):
        if path and os.access(path, os.X_OK):
            return path
    return None


class Check:
    def __init__(self, env):
        self.dry = switch("FLASHMLA_PERM_GPU_CHECK_DRY", False, env)
        venv = os.path.join(ROOT, ".venv", "bin", "python")
        py = env.get("PYTHON") or (venv if self.dry and os.access(venv, os.X_OK) else "python3")
        self.py = os.path.abspath(py) if "/" in py else py
        self.out = os.path.abspath(env.get("OUT") or "/tmp/gpu_check")
        self.work = os.path.join(env.get("TMPDIR", "/tmp"), "flashmla_perm_gpu_check")
        scale = 3 if self.dry else 1
        self.budget = int(env.get("FLASHMLA_PERM_GPU_CHECK_BUDGET_S") or BUDGET_S * scale)
        given = dict(p.split("=") for p in env.get("FLASHMLA_PERM_GPU_CHECK_TIMEOUTS", "").split(",") if p)
        self.timeouts = {k: int(given.get(k, v)) * scale for k, v in TIMEOUTS.items()}
        self.env = dict(
            env,
            PYTHONUNBUFFERED="1",
            PYTHONDONTWRITEBYTECODE="1",
            FLASHMLA_PERM_EXPECT_NATIVE="1",
            HYPOTHESIS_STORAGE_DIRECTORY=os.path.join(self.work, "hypothesis"),
            PYTHONPATH=os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")])),
        )
        self.device = "cpu" if self.dry else "cuda"
        self.arch, self.handler, self.steps, self.t0 = "", None, [], time.monotonic()

    def path(self, name):
        return os.path.join(self.out, name)

    def run(self, argv, env=None, check=True, stdout=None):
        """argv in its own process group, output into the step's log; the
        group is killed at the step's deadline."""
        self.log.write("$ " + " ".join(argv) + "\n")
        self.log.flush()
        out = open(stdout, "w") if stdout else self.log
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=dict(self.env, **(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=self.log,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=max(self.deadline - time.monotonic(), 0.1))
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:  # its own session: kill it with us
            os.killpg(proc.pid, 9)
            proc.wait()
            raise e if isinstance(e, KeyboardInterrupt) else TimeoutError("ran past its timeout")
        finally:
            if stdout:
                out.close()
        if check and rc:
            raise StepFailed(f"{os.path.basename(argv[1] if argv[0] == self.py else argv[0])} exited {rc}")
        return rc

    def python(self, *args, **kw):
        return self.run([self.py, *args], **kw)

    # ---------------------------------------------------------------- the steps

    def step_gpu(self):
        for tool in ("nvcc", "compute-sanitizer", "ncu", "nvidia-smi"):
            self.log.write(f"{tool:18} {find_tool(tool) or 'not found'}\n")
        self.python("-c", GPU_INFO, self.path("gpu.json"), "1" if self.dry else "0")
        self.arch = load_json(self.path("gpu.json")).get("arch", "")

    def step_build(self):
        if (
            self.dry
            and self.python("-c", "import flashmla_perm as f; assert f.build_info()['native']", check=False) == 0
        ):
            self.log.write("dry: the native CPU module built in place is reused\n")
        else:
            env = (
                {"FLASHMLA_PERM_CUDA": "0"}
                if self.dry
                else {"FLASHMLA_PERM_CUDA": "1", "FLASHMLA_PERM_CUDA_ARCHS": self.arch}
            )
            shutil.rmtree(self.work, ignore_errors=True)  # from nothing
            temp, lib = os.path.join(self.work, "temp"), os.path.join(self.work, "lib")
            self.python(*"setup.py build_ext --inplace --build-temp".split(), temp, "--build-lib", lib,
                        env=dict(env, MAX_JOBS=str(os.cpu_count())))  # fmt: skip
        self.python(
            "-c",
            "import json, sys, flashmla_perm as f; i = f.build_info(); print('BUILD_INFO', json.dumps(i));"
            f" sys.exit(not i['native'] or i['cuda'] != {not self.dry})",
        )
        self.handler = crash_probe.build_handler(self.out)  # preloaded into the test steps

    def step_probe(self):
        timeout = str(self.timeouts["probe"] - 5)
        self.python("device/crash_probe.py", "--device", self.device, "--out", self.out, "--timeout", timeout)

    def bench(self, *args, env=None, check=True):
        quick = ["--layers", "2", "--reps", "1", "--tokens", "256"] if self.dry else ["--reps", "5"]
        return self.python(
            "bench/bench_load_time.py", "--devices", self.device, "--no-memory", *quick, *args, env=env, check=check
        )

    def step_bench(self):
        # The model's kinds; not `generic` (4 one-shot permutations of 4 Mi
        # units, host planning each time), which would spend the step's
        # budget before the TP rows are written.
        backends = ",".join(("reference", "native", *BENCH_BASELINES))
        self.bench(*"--tp 1 2 4 8 --kernel-times --kinds".split(), BENCH_KINDS,
                   "--json", self.path("bench.json"), "--backends", backends)  # fmt: skip

    def step_sweep(self):
        sweep, failed = {}, []
        for label, env, kinds in SWEEP:  # a plan that fails is recorded and the next one runs
            out = self.path(f"sweep_{label}.json")
            rc = self.bench("--tp", "1", "--kinds", kinds, "--backends", "native", "--json", out, env=env, check=False)
            rows = (load_json(out) or {}).get("rows", [])
            sweep[label] = {
                "env": env,
                "exit_status": rc,
                "rows": {
                    f"{r['kind']} {r['backend']}": {k: r.get(k) for k in ("device_ms_per_layer", "x_copy_device")}
                    for r in rows
                },
            }
            failed += [label] if rc else []
            write_json(self.path("sweep.json"), sweep)
        if failed:
            raise StepFailed("plans failed: " + ", ".join(failed))

    def pytest(self, name, *args, env=None):
        # The crash handler in every test process: a crash leaves its record in the log.
        env = dict(crash_probe.handler_env(self.handler, self.env) if self.handler else {}, **(env or {}))
        env.update({} if self.dry else {"FLASHMLA_PERM_EXPECT_CUDA": "1"})
        rc = self.python(
            *crash_probe.suite_args(self.handler),
            f"--junitxml={self.path(name + '.xml')}",
            *args,
            env=env,
            check=False,
        )
        if rc:
            raise StepFailed(f"pytest exited {rc}")

    def step_tests(self):
        workers = (
            ["-n", str(min(4, os.cpu_count() or 1))] if self.python("-c", "import xdist", check=False) == 0 else []
        )
        where = (
            ["tests/test_ops.py", "tests/test_flashmla.py"]
            if self.dry
            else ["tests", "--ignore=tests/test_cuda_runtime.py"]
        )
        self.pytest("tests", *workers, *where, "-k", f"{self.device} and not 2_31")

    def step_runtime(self):
        self.pytest("runtime", "tests/test_cuda_runtime.py")

    def step_first_use(self):
        """The first call of a fresh process, bytes checked: with the install's
        cubin, then with its PTX (FLASHMLA_PERM_PTX=1, which the driver
        compiles at that call); the TP1 bench on the PTX's kernels (their
        speed beside the bench step's, the cubin's); the kernels' tests."""
        ptx = {"FLASHMLA_PERM_PTX": "1"}
        if not self.dry:
            self.python("-c", FIRST_CALL, "cubin")
            self.python("-c", FIRST_CALL, "ptx", env=ptx)
            self.bench(
                "--tp", "1", "--kinds", "wq_b,wo_a", "--backends", "native",
                "--json", self.path("first_use_bench.json"), env=ptx,
            )  # fmt: skip
        self.pytest("first_use", "tests/test_kernels.py")

    def step_images(self):  # dry: no CUDA build, nothing to gate
        self.dry or self.python("-m", "flashmla_perm.images", "--gate", "--json", self.path("images.json"))

    def step_ncu(self):
        """One ncu pass a kind over one native call; dry: the call alone."""
        ncu, wrong = find_tool("ncu"), []
        if not (self.dry or ncu):
            raise StepFailed("ncu not found")
        for kind in ("wq_b", "wo_a"):
            report = self.path(f"ncu_{kind}")
            tool = [] if self.dry else [ncu, *NCU_FLAGS.split(), "--metrics", ",".join(NCU_METRICS), "--export", report]
            if self.run(
                [*tool, self.py, "device/ncu_case.py", kind, "--device", self.device, "--json", report + ".json"],
                check=False,
            ):
                wrong.append(kind)
            if not self.dry:
                self.run(
                    [ncu, "--import", report + ".ncu-rep", "--csv", "--page", "details", "--print-units", "base"],
                    stdout=report + ".csv",
                    check=False,
                )
        if wrong:
            raise StepFailed(f"ncu or the case failed for {', '.join(wrong)}")

    def sanitize(self, tool, env=None):
        sanitizer, failed = find_tool("compute-sanitizer"), []
        if not (self.dry or sanitizer):
            raise StepFailed("compute-sanitizer not found")
        for label, plan in SANITIZE_PLANS:
            self.log.write(f"plan: {label}\n")
            flags = "--kernel-name kns=flashmla_perm --error-exitcode 9 --print-limit 20".split()
            tool_argv = [] if self.dry else [sanitizer, "--tool", tool, *flags]
            if self.run(
                [*tool_argv, self.py, "device/sanitizer_case.py", self.device], env={**(env or {}), **plan}, check=False
            ):
                failed.append(label)
        if failed:
            raise StepFailed("plans failed: " + ", ".join(failed))

    def step_memcheck(self):  # no caching allocator: an access past a tensor's end leaves its allocation
        self.sanitize("memcheck", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})

    def step_racecheck(self):
        self.sanitize("racecheck")

    def step_model(self):
        usable = {"gpu.json": "card" in (load_json(self.path("gpu.json")) or {})}
        module = sorted(glob.glob(os.path.join(ROOT, "flashmla_perm", "_C*.so")))[:1]
        self.python(
            "device/model.py",
            "--json",
            self.path("model.json"),
            *([] if self.dry or not module else ["--module", module[0]]),
            *[
                x
                for flag, name in (("--card", "gpu.json"), ("--measured", "bench.json"), ("--sweep", "sweep.json"))
                if os.path.exists(self.path(name)) and usable.get(name, True)
                for x in (flag, self.path(name))
            ],
        )

    # ---------------------------------------------------------------- figures

    def figures(self, name):
        log = read_text(self.path(f"{name}.log"))
        if name == "gpu":
            return load_json(self.path("gpu.json")) or {}
        if name == "build":
            m = re.search(r"^BUILD_INFO (\{.*\})$", log, re.M)
            return {**(json.loads(m.group(1)) if m else {}), "reused": "reused" in log}
        if name == "probe":
            doc = load_json(self.path("probe.json")) or {}
            return {
                "environment": doc.get("environment"),
                "cases": {
                    r["case"]: {k: r.get(k) for k in ("ok", "rc", "signal", "raised", "message", "summary") if r.get(k)}
                    | (
                        {"handler": {k: v for k, v in r["handler"].items() if k != "frames"}}
                        if r.get("handler")
                        else {}
                    )
                    for r in doc.get("cases", [])
                },
            }
        if name == "bench":
            doc = load_json(self.path("bench.json")) or {}
            return {
                "card": doc.get("card"),
                "wrong": doc.get("wrong", []),
                "rows": {
                    f"{r['kind']} tp{r['tp']} {r['backend']}": {
                        "device_ms_per_layer": r["device_ms_per_layer"],
                        "x_copy_device": r["x_copy_device"],
                    }
                    for r in doc.get("rows", [])
                },
            }
        if name == "sweep":
            return load_json(self.path("sweep.json")) or {}
        if name in ("tests", "runtime"):
            return {
                **junit(self.path(f"{name}.xml")),
                "crashed": sorted(set(re.findall(r"worker '\w+' crashed while running '([^']+)'", log))),
                "handler": crash_probe.handler_record(log),
            }
        if name == "first_use":
            doc = load_json(self.path("first_use_bench.json")) or {}
            return {
                "first_call_s": {m[0]: float(m[1]) for m in re.findall(r"^FIRST_CALL_(\w+)_S ([\d.]+)$", log, re.M)},
                "kernels": re.findall(r"^KERNELS (.*)$", log, re.M),
                **junit(self.path("first_use.xml")),
                "ptx_rows": {
                    f"{r['kind']} tp{r['tp']}": {k: r.get(k) for k in ("device_ms_per_layer", "x_copy_device")}
                    for r in doc.get("rows", [])
                },
            }
        if name == "images":
            found = (load_json(self.path("images.json")) or {}).get("images", [])
            ks = [k for image in found for k in image.get("kernels", {}).values()]
            return {
                "kernels": len(ks),
                "max_registers": max((k.get("registers", 0) for k in ks), default=None),
                "stack_or_local_bytes": sum(k.get("stack", 0) + k.get("local", 0) for k in ks),
            }
        if name == "ncu":
            return {
                kind: ncu_figures(self.path(f"ncu_{kind}.csv"), load_json(self.path(f"ncu_{kind}.json")))
                for kind in ("wq_b", "wo_a")
            }
        if name in ("memcheck", "racecheck"):
            parts = re.split(r"^plan: (.*)$", log, flags=re.M)
            return {
                label: {
                    "errors": [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", body)],
                    "cases": re.findall(r"sanitizer cases on \S+: (\d+/\d+) OK", body),
                }
                for label, body in zip(parts[1::2], parts[2::2])
            }
        if name == "model":
            doc = load_json(self.path("model.json")) or {}
            return {
                "card": (doc.get("card") or {}).get("name"),
                "tp1": {
                    r["op"]: {k: r.get(k) for k in ("x_copy_predicted", "x_copy_measured")}
                    for r in doc.get("records", [])
                    if r["tp"] == 1
                },
                "sweep": doc.get("sweep"),
            }
        return {}

    # ---------------------------------------------------------------- the run

    def write(self):
        ok = all(s["status"] in ("ok", "running") for s in self.steps)
        write_json(
            self.path("gpu_check.json"),
            {
                "ok": ok,
                "dry": self.dry,
                "python": self.py,
                "budget_s": self.budget,
                "elapsed_s": round(time.monotonic() - self.t0),
                "steps": self.steps,
            },
        )

    def step(self, name, blocked=None):
        left = self.budget - (time.monotonic() - self.t0)
        entry = {
            "name": name,
            "status": "running",
            "timeout_s": int(min(self.timeouts[name], left)),
            "log": self.path(f"{name}.log"),
        }
        if blocked or left < 5:
            entry.update(status="skipped", note=blocked or "no time left in the budget")
        self.steps.append(entry)
        self.write()
        said = (
            f"skipped: {entry['note']}" if blocked or left < 5 else f"timeout {entry['timeout_s']}s, log {entry['log']}"
        )
        print(f"== [{name}] {said}", flush=True)
        if entry["status"] == "skipped":
            return False
        start, self.deadline = time.monotonic(), time.monotonic() + entry["timeout_s"]
        with open(entry["log"], "w") as self.log:
            try:
                getattr(self, f"step_{name}")()
                status = "ok"
            except TimeoutError as e:
                status, entry["note"] = "TIMEOUT", str(e)
            except KeyboardInterrupt:  # SIGINT or SIGTERM: the step's processes are gone, the record kept
                status, entry["note"] = "INTERRUPTED", "the check was stopped"
            except Exception as e:  # a step that fails or cannot start: the others still run
                status, entry["note"] = "FAILED", f"{type(e).__name__}: {e}"
        try:
            figures = self.figures(name)
        except Exception as e:  # noqa: BLE001 (the figures of a step cut short may be half there)
            figures = {"figures_error": f"{type(e).__name__}: {e}"}
        entry.update(status=status, seconds=round(time.monotonic() - start, 1), figures=figures)
        self.write()
        print(f"   -> {name}: {status} in {entry['seconds']}s {entry.get('note', '')}", flush=True)
        if status == "INTERRUPTED":
            sys.exit(1)
        return status == "ok"

    def run_all(self):
        os.makedirs(self.out, exist_ok=True)
        blocked = None
        for name in TIMEOUTS:
            if not self.step(name, blocked) and name in ("gpu", "build"):
                blocked = blocked or f"no usable {name} ({name}.log)"
        self.write()
        print(json.dumps({s["name"]: s["status"] for s in self.steps}))
        return 0 if all(s["status"] == "ok" for s in self.steps) else 1


# A process's first op (argv[1]: cubin or ptx): the seconds of the first call
# (loading the kernels, the driver compiling the PTX; the launch), its bytes
# against the reference, and what loaded.
FIRST_CALL = """
import sys, time, torch, flashmla_perm as f
from flashmla_perm import _ops
g = torch.Generator().manual_seed(1)
w = torch.randint(0, 256, (4096, 1280), dtype=torch.uint8, generator=g).cuda()
s = torch.randint(0, 256, (4096, 10), dtype=torch.uint8, generator=g).cuda()
want = (w.clone(), s.clone())
f.reference.permute_wq_b_(*want, 8)
torch.cuda.synchronize()
start = time.perf_counter()
f.permute_wq_b_(w, s, 8)
torch.cuda.synchronize()
print(f"FIRST_CALL_{sys.argv[1].upper()}_S {time.perf_counter() - start:.3f}")
print("KERNELS", sys.argv[1], f.build_info()["devices"][torch.cuda.current_device()])
assert torch.equal(w, want[0]) and torch.equal(s, want[1]), "the kernels moved bytes wrongly"
"""

GPU_INFO = """
import json, sys, torch
sys.path.insert(0, "device")
from card import record_cuda_card
info = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    info.update(name=torch.cuda.get_device_name(0), arch=";".join(f"{a}.{b}" for a, b in caps))
    record_cuda_card(info)
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(info)
sys.exit(sys.argv[2] != "1" and not torch.cuda.is_available())
"""


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path, doc):
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)  # never half written, whenever the run is cut


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
    n = {k: sum(int(s.get(k, 0)) for s in root.iter("testsuite")) for k in ("tests", "failures", "errors", "skipped")}
    n["failed"] = [
        f"{c.get('classname')}::{c.get('name')}"
        for c in root.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ][:20]
    return n


def ncu_figures(csv_path, case):
    """Our kernels' launches in one ncu report, summed (the DRAM throughput
    and occupancy weighted by duration), against the bytes the case moved."""
    launches = {}
    for row in csv.DictReader(line for line in read_text(csv_path).splitlines() if line.startswith('"')):
        if row.get("Metric Name") in NCU_METRICS:
            launches.setdefault(row["ID"], {})[NCU_METRICS[row["Metric Name"]]] = float(
                row["Metric Value"].replace(",", "")
            )
    f = {"case": case}
    if launches:
        ns = sum(launch.get("duration_ns", 0) for launch in launches.values())
        f.update(
            launches=len(launches),
            duration_us=round(ns / 1e3, 2),
            **{
                k: round(sum(launch.get(k, 0) * launch.get("duration_ns", 0) for launch in launches.values()) / ns, 1)
                for k in ("dram_pct_of_peak", "occupancy_pct")
                if ns
            },
            bank_conflicts=sum(launch.get("bank_conflicts", 0) for launch in launches.values()),
        )
        if case and case.get("bytes_moved"):
            f["instructions_per_byte"] = round(
                sum(launch.get("instructions", 0) for launch in launches.values()) / case["bytes_moved"], 4
            )
    return f


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # an outer timeout stops the step's processes too
    sys.exit(Check(os.environ).run_all())
