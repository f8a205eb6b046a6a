"""Crash probe: each case the first op of its own process, crash_handler.c
loaded, and how each ended (exit status, signal, the handler's record, what
it raised), beside a record of the environment. The first device run's CUDA
suite died of a segmentation fault in its first test (a wq_b scale with the
wrong row count, which must raise ValueError, as it does on the CPU); the
cases tell the suspects apart. --device cpu: the same cases on CPU tensors.

    python device/crash_probe.py [--device cuda|cpu] [--out DIR]

Writes DIR/probe.json and each case's stderr (the maps among it) to
DIR/probe_<case>.err. Exit status 0 when every case ended as expected.
"""

import argparse
import concurrent.futures
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRASHED_TEST = "test_model_errors_leave_both_tensors_untouched"
BAD_ROWS = ("ValueError", "weight_scale")
TORCH_ERROR = ("RuntimeError|IndexError", "")

# name -> (environment, what it must raise: (exception names regex, message
# regex), None: it must succeed, or "pytest": a pytest run that must pass).
CASES = {
    "torch_error": ({}, TORCH_ERROR),
    "torch_error_after_import": ({}, TORCH_ERROR),
    "bad_scale_rows_cpp_stacks": ({"TORCH_SHOW_CPP_STACKTRACES": "1"}, BAD_ROWS),
    "bad_scale_rows_no_cpp_stacks": ({"TORCH_SHOW_CPP_STACKTRACES": "0"}, BAD_ROWS),
    "cpu_valid": ({}, None),
    "cpu_bad_scale_rows": ({}, BAD_ROWS),
    "pytest_suite_shape": ({}, "pytest"),
}


def case_call(name, device):
    """Child: the case's one call."""
    import torch

    sys.path.insert(0, ROOT)
    if name != "torch_error":
        import flashmla_perm  # noqa: F401  (before CUDA's start, as the suite imports it)
    if device == "cuda" and not name.startswith("bad_"):
        torch.ones(1, device="cuda").sum().item()  # CUDA started: what follows is its first error
    if name.startswith("torch_error"):
        return torch.empty(1, device=device).view(-1, 3)
    import flashmla_perm as fp
    from flashmla_perm import reference as ref

    on, gen = "cpu" if name.startswith("cpu_") else device, torch.Generator().manual_seed(0)
    w = torch.randint(0, 256, (256, 64), dtype=torch.uint8, generator=gen).view(torch.float8_e4m3fn).to(on)
    s = torch.randint(0, 256, (256, 2), dtype=torch.uint8, generator=gen).to(on)
    if name != "cpu_valid":
        s = s[:128]  # the suite's crash: a scale with half the weight's rows
    ew, es = w.clone(), s.clone()
    try:
        fp.permute_wq_b_(w, s, 4)
        if name != "cpu_valid":
            return "did not raise"
        ref.permute_wq_b_(ew, es, 4)
    finally:  # raised or not, the bytes are the reference's (unchanged where it raised)
        if not (torch.equal(w.view(torch.uint8), ew.view(torch.uint8)) and torch.equal(s, es)):
            raise AssertionError("the bytes are not the reference's")
    return "bytes as the reference's"


def install():
    """The handler installed again, after torch's imports and Python's
    faulthandler (so that it sees the fault first, then hands it on)."""
    import ctypes

    if os.environ.get("CRASH_HANDLER_SO"):
        ctypes.CDLL(os.environ["CRASH_HANDLER_SO"]).crash_handler_install()


def pytest_sessionstart(session):
    """As a pytest plugin (-p crash_probe): after pytest's faulthandler."""
    install()


def run_case(name, device):
    """Child: one case; one CASE_OUTCOME line saying how it ended (short of a crash)."""
    import faulthandler

    import torch  # noqa: F401

    faulthandler.enable()
    install()
    try:
        said = case_call(name, device)
        outcome = {"raised": None, "message": str(said)}
    except Exception as e:  # reported, and judged by the parent
        outcome = {"raised": type(e).__name__, "message": (str(e).splitlines() or [""])[0]}
    print("CASE_OUTCOME " + json.dumps(outcome), flush=True)


def build_handler(work):
    """device/crash_handler.c as a shared object; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    out = os.path.join(work, "crash_handler.so")
    if (
        cc
        and subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", "-o", out, os.path.join(ROOT, "device", "crash_handler.c")],
            capture_output=True,
        ).returncode
        == 0
    ):
        return out
    return None


HEADER = re.compile(
    r"crash_handler: signal (\d+) si_code (-?\d+) si_addr (0x[0-9a-f]+) pc (0x[0-9a-f]+) "
    r"sp (0x[0-9a-f]+)"
)


def handler_record(stderr):
    """The handler's record in a child's stderr, or None: the signal, its
    code and address, pc and sp, the mapping pc lies in, the frames."""
    m = HEADER.search(stderr)
    if not m:
        return None
    sig, code, addr, pc, sp = m.groups()
    rest = stderr[m.end() :]
    maps = rest.split("crash_handler: maps\n", 1)[-1].split("crash_handler: backtrace", 1)[0].splitlines()
    where = next(
        (
            line
            for line in maps
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line)
            and int(line.split("-")[0], 16) <= int(pc, 16) < int(line.split()[0].split("-")[1], 16)
        ),
        None,
    )
    frames = rest.partition("crash_handler: backtrace\n")[2].split("crash_handler: end")[0].splitlines()
    return {
        "signal": int(sig),
        "signal_name": signal.Signals(int(sig)).name,
        "si_code": int(code),
        "si_addr": addr,
        "pc": pc,
        "sp": sp,
        "pc_in": where,
        "maps_lines": len(maps),
        "frames": frames,
        "backtrace_ended": "crash_handler: end" in rest,
    }


def ended(argv, handler, env=None, timeout=40):
    """Runs argv with the handler preloaded; (rc, stdout, stderr)."""
    env = dict(os.environ, **(env or {}))
    if handler:
        env.update(handler_env(handler, env))
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, errors="replace", timeout=timeout, cwd=ROOT
        )
        return done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        return "timeout", *(
            x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr)
        )


def handler_env(handler, env):
    """The variables that load the handler into a process and its pytest
    (-p crash_probe: device/ on PYTHONPATH)."""
    return {
        "CRASH_HANDLER_SO": handler,
        "LD_PRELOAD": " ".join(filter(None, [handler, env.get("LD_PRELOAD")])),
        "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(ROOT, "device"), env.get("PYTHONPATH")])),
    }


def judge(name, expected, rc, out, err):
    """How a case ended, and whether that is what it must do."""
    record = {"case": name, "rc": rc}
    if isinstance(rc, int) and rc < 0:
        record["signal"] = signal.Signals(-rc).name
    if handled := handler_record(err):
        record["handler"] = handled
    if "CASE_OUTCOME " in out:
        record.update(json.loads(out.split("CASE_OUTCOME ", 1)[1].splitlines()[0]))
    if expected == "pytest":
        record["ok"] = rc == 0
        record["summary"] = (re.findall(r"^=+ (.*) =+$", out, re.M) or [""])[-1]
    elif rc != 0 or "CASE_OUTCOME " not in out:
        record["ok"] = False
    elif expected is None:
        record["ok"] = record["raised"] is None
    else:
        kinds, pattern = expected
        record["ok"] = bool(
            record["raised"] and re.fullmatch(kinds, record["raised"]) and re.search(pattern, record["message"])
        )
    if not record["ok"]:
        record["stderr_tail"] = err.split("crash_handler: maps")[0].strip().splitlines()[-12:]
    return record


def environment():
    """Kernel, compiler, C library, torch and its CUDA (read from torch/version.py,
    no import), the driver, and the variables that steer them."""

    def first_line(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.split("\n")[0]
        except (OSError, subprocess.TimeoutExpired):
            return None

    spec = importlib.util.find_spec("torch")
    version = open(os.path.join(os.path.dirname(spec.origin), "version.py")).read() if spec else ""
    return {
        "uname": " ".join(platform.uname()),
        "python": sys.version.split()[0],
        "compiler": first_line([shutil.which("cc") or "cc", "--version"]),
        "libc": " ".join(platform.libc_ver()),
        "torch_cuda": None,
        **{
            "torch_" + k.strip("_"): v
            for k, v in re.findall(r"^(__version__|cuda|git_version)\s*(?::\s*\S+)?\s*=\s*'([^']*)'", version, re.M)
        },
        "driver": first_line(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]),
        "variables": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("TORCH_", "CUDA_", "NCCL_", "LD_"))},
    }


def suite_args(handler):  # not pytest_*: pytest would take it for a hook
    """pytest as the device check runs it, the handler's plugin loaded where built."""
    plugin = ["-p", "crash_probe"] if handler else []
    return ["-m", "pytest", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=60", "-rfEs", "-v", *plugin]


def case_argv(name, device, handler):
    if CASES[name][1] == "pytest":  # the suite's collection, then the test that crashed first
        return [sys.executable, *suite_args(handler), "tests", "-k", f"{CRASHED_TEST} and {device}"]
    return [sys.executable, os.path.abspath(__file__), "--case", name, "--device", device]


def probe(device, out_dir, handler, names=tuple(CASES), timeout=40):
    doc = {"device": device, "handler": handler is not None, "environment": environment(), "cases": []}

    def one(name):
        env = dict(CASES[name][0], FLASHMLA_PERM_EXPECT_NATIVE="1")
        rc, out, err = ended(case_argv(name, device, handler), handler, env, timeout)
        with open(os.path.join(out_dir, f"probe_{name}.err"), "w") as f:
            f.write(err)
        return judge(name, CASES[name][1], rc, out, err)

    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:  # probe.json as each case ends
        for future in concurrent.futures.as_completed([pool.submit(one, name) for name in names]):
            r = future.result()
            doc["cases"] = sorted(doc["cases"] + [r], key=lambda c: names.index(c["case"]))
            with open(os.path.join(out_dir, "probe.json"), "w") as f:
                json.dump(doc, f, indent=1)
            h = r.get("handler")
            said = (
                f"died of {h['signal_name']} at {h['si_addr']}, pc in {h['pc_in']}"
                if h
                else r.get("signal")
                or r.get("summary")
                or (f"raised {r['raised']}: {r['message']}" if r.get("raised") else r.get("message", f"exit {r['rc']}"))
            )
            print(f"  {'OK   ' if r['ok'] else 'WRONG'} {r['case']:<30} {str(said)[:140]}", flush=True)
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cpu")
    ap.add_argument("--out", default=".")
    ap.add_argument("--case")
    ap.add_argument("--timeout", type=float, default=40, help="seconds a case (all run at once)")
    args = ap.parse_args()
    if args.case:
        return run_case(args.case, args.device)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        handler = build_handler(work)
        if not handler:
            print("NOTE no C compiler: a crash is recorded by its exit status alone")
        doc = probe(args.device, args.out, handler, timeout=args.timeout)
    bad = [r["case"] for r in doc["cases"] if not r["ok"]]
    print(
        f"crash probe on {args.device}: {len(doc['cases']) - len(bad)}/{len(doc['cases'])} as expected"
        + (f"; not: {', '.join(bad)}" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
