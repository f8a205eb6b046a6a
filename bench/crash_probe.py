"""Error paths, each as the first op of its own process, and how each ended.

The first device run lost its CUDA suite to a segmentation fault in the
suite's first CUDA test: `permute_wq_b_` with a scale of the wrong row count,
which must raise ValueError (and does, on the CPU). That one crash could be
this call, the first op of a process on CUDA, or any error raised on CUDA
tensors. Each case below tells those apart: one process a case, its exit
status, what it raised, the tensors' bytes afterwards, and, where it died of
a signal, its native stack (bench/segv_backtrace.c, LD_PRELOAD'ed; the GPU
machine has no gdb), resolved by addr2line where binutils is installed.

    python bench/crash_probe.py [--device cuda|cpu] [--json FILE]
    python bench/crash_probe.py --pytest NODE      one test, its native stack if it crashes
    python bench/crash_probe.py --case NAME --device D   (what the parent runs)

Exit status 0 when every case ended as expected, 1 otherwise.
"""

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE_TIMEOUT_S = 32  # a case is one op and a CUDA start, nine at once; the device check's probe step has 40 s

# name -> (CUDA only, what it must raise: (exception names regex, message regex),
# or None: it must succeed). "first": the process's first op of this package.
CASES = {
    "valid_first": (False, None),
    "bad_scale_rows_first": (False, ("ValueError", "weight_scale has 128 rows")),  # the suite's crash
    "bad_scale_rows_after_valid": (False, ("ValueError", "weight_scale has 128 rows")),
    "bad_heads_first": (False, ("ValueError", "num_local_heads")),  # raised before the pair check
    "bad_scale_device_first": (True, ("ValueError", "weight_scale is on")),
    "cpu_bad_scale_rows_after_cuda_init": (True, ("ValueError", "weight_scale has 128 rows")),
    "bad_perm_first": (False, ("ValueError", "more than once")),  # the runtime suite's error, which passed
    "schema_error_first": (False, ("RuntimeError|TypeError", "")),  # torch raises it, not this package
    "bad_wo_a_scale_first": (False, ("ValueError", "weight_scale")),
}


# --------------------------------------------------------------------------- the cases (child side)

def case_functions(device):
    """name -> the case's calls (CASES says what each must do)."""
    import torch

    sys.path.insert(0, ROOT)
    import flashmla_perm as fp
    from flashmla_perm import reference as ref

    gen = torch.Generator().manual_seed(0)

    def rand(shape, dtype=torch.uint8, on=device):
        raw = torch.randint(0, 256, list(shape[:-1]) + [shape[-1] * torch.empty((), dtype=dtype).element_size()],
                            dtype=torch.uint8, generator=gen)
        return raw.view(dtype).to(on)

    def wq(rows=256, srows=None, on=device):  # the suite's test: fp8 [256, 64], uint8 scale [256, 2]
        return rand((rows, 64), torch.float8_e4m3fn, on), rand((srows or rows, 2), on=on)

    def unchanged(*pairs):
        for t, before in pairs:
            if not torch.equal(t.view(torch.uint8).cpu(), before.view(torch.uint8).cpu()):
                raise AssertionError("a tensor changed although the op raised")

    def bad(call, *tensors):
        """call() must raise; every tensor must keep its bytes."""
        before = [(t, t.clone()) for t in tensors]
        try:
            call()
        finally:
            unchanged(*before)
        return "did not raise"

    def valid():
        w, s = wq()
        ew, es = w.clone(), s.clone()
        fp.permute_wq_b_(w, s, 4)
        ref.permute_wq_b_(ew, es, 4)
        unchanged((w, ew), (s, es))
        return "permuted, bytes as the reference's"

    def bad_scale_rows():
        w, s = wq()
        s = s[:128]
        return bad(lambda: fp.permute_wq_b_(w, s, 4), w, s)

    def bad_scale_rows_after_valid():
        valid()
        return bad_scale_rows()

    def bad_heads():
        w, s = wq()
        return bad(lambda: fp.permute_wq_b_(w, s, 0), w, s)

    def bad_scale_device():
        w, s = wq()
        s = s.cpu()
        return bad(lambda: fp.permute_wq_b_(w, s, 4), w, s)

    def cpu_bad_scale_rows_after_cuda_init():
        torch.ones(1, device="cuda").sum().item()
        w, s = wq(on="cpu")
        s = s[:128]
        return bad(lambda: fp.permute_wq_b_(w, s, 4), w, s)

    def bad_perm():
        x = rand((64, 64))
        perm = torch.arange(64)
        perm[5] = 7  # 7 twice, 5 never
        return bad(lambda: fp.permute_(x, perm.to(device)), x)

    def schema_error():  # raised by torch's argument parsing, before our code runs
        w, s = wq()
        return bad(lambda: torch.ops.flashmla_perm.permute_wq_b_(w, s, "four"), w, s)

    def bad_wo_a_scale():
        w, s = rand((16, 512), torch.float8_e4m3fn), rand((16, 15))
        return bad(lambda: fp.permute_wo_a_(w, s), w, s)

    return {"valid_first": valid, "bad_scale_rows_first": bad_scale_rows,
            "bad_scale_rows_after_valid": bad_scale_rows_after_valid, "bad_heads_first": bad_heads,
            "bad_scale_device_first": bad_scale_device,
            "cpu_bad_scale_rows_after_cuda_init": cpu_bad_scale_rows_after_cuda_init,
            "bad_perm_first": bad_perm, "schema_error_first": schema_error, "bad_wo_a_scale_first": bad_wo_a_scale}


def run_case(name, device):
    """Child: one case; one JSON line on stdout saying how it ended (short of a crash)."""
    try:
        said = case_functions(device)[name]()
        outcome = {"raised": None, "message": said or ""}
    except Exception as e:  # reported, and judged by the parent
        outcome = {"raised": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else ""}
    print("CASE_OUTCOME " + json.dumps(outcome), flush=True)


# --------------------------------------------------------------------------- native stacks

def build_preload(work):
    """bench/segv_backtrace.c as a shared object in `work`; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    out = os.path.join(work, "segv_backtrace.so")
    done = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", out, os.path.join(ROOT, "bench", "segv_backtrace.c")],
                          capture_output=True, text=True)
    return out if done.returncode == 0 else None


FRAME = re.compile(r"^(\S+?)\(([^)+]*)\+(0x[0-9a-f]+)\)\s*\[(0x[0-9a-f]+)\]$")
TOOL_TIMEOUT_S = 10


def tool_lines(argv, inputs=()):
    """A binutils tool's output lines, or [] if it fails or takes too long."""
    try:
        done = subprocess.run([*argv, *inputs], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.split("\n") if done.returncode == 0 else []


def native_stack(stderr):
    """segv_backtrace's frames from a child's stderr (those written before
    the end marker, or before the process died in the handler), resolved to
    function (file:line) by one addr2line call per object where a frame
    gives an offset in its object, demangled where it gives a symbol."""
    m = re.search(r"segv_backtrace: native stack at signal (\w+)\n(.*?)(?:segv_backtrace: end|\Z)", stderr, re.S)
    if not m:
        return None
    parsed = [(line.strip(), FRAME.match(line.strip())) for line in m.group(2).strip().splitlines()]
    by_object = {}  # object -> offsets to resolve
    for _, f in parsed:
        if f and not f.group(2) and os.path.exists(f.group(1)):
            by_object.setdefault(f.group(1), []).append(f.group(3))
    resolved = {}
    addr2line = shutil.which("addr2line")
    for obj, offsets in by_object.items():
        lines = tool_lines([addr2line, "-f", "-C", "-e", obj], offsets) if addr2line else []
        for i, off in enumerate(offsets):
            fn, where = (lines[2 * i], lines[2 * i + 1]) if 2 * i + 1 < len(lines) else ("??", "??")
            if fn != "??":
                resolved[(obj, off)] = fn + ("" if where.startswith("??") else f" ({where})")
    symbols = [f.group(2) for _, f in parsed if f and f.group(2)]
    demangled = dict(zip(symbols, tool_lines(["c++filt"], symbols))) if symbols and shutil.which("c++filt") else {}
    frames = []
    for line, f in parsed:
        if not f:
            frames.append(line)
            continue
        obj, sym, off, _ = f.groups()
        if sym:  # the offset is from the symbol
            frames.append(f"{os.path.basename(obj)} {demangled.get(sym) or sym}+{off}")
        else:
            frames.append(f"{os.path.basename(obj)}+{off} {resolved.get((obj, off), '')}".rstrip())
    return {"signal": m.group(1), "frames": frames}


def child_env(preload):
    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = " ".join(filter(None, [preload, env.get("LD_PRELOAD")]))
    return env


def ended(argv, preload):
    """Run argv; (rc, seconds, stdout, stderr, native stack or None)."""
    t0 = time.time()
    try:
        done = subprocess.run(argv, env=child_env(preload), capture_output=True, text=True, timeout=CASE_TIMEOUT_S,
                              cwd=ROOT)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", e.stdout or "", e.stderr or ""
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x for x in (out, err))
    return rc, round(time.time() - t0, 1), out, err, native_stack(err)


# --------------------------------------------------------------------------- the parent

def judge(name, expected, rc, out, err, stack):
    record = {"case": name, "rc": rc}
    if "CASE_OUTCOME " in out:  # what the case raised, even if the process died after it
        record.update(json.loads(out.split("CASE_OUTCOME ", 1)[1].splitlines()[0]))
    if rc != 0 or "CASE_OUTCOME " not in out:
        record["ok"] = False
        record["how"] = (f"died of {stack['signal']}" if stack else
                         f"killed by signal {-rc}" if isinstance(rc, int) and rc < 0 else f"exit {rc}")
        record["stderr_tail"] = err.split("segv_backtrace: native stack")[0].strip().splitlines()[-8:]
        if stack:
            record["native_stack"] = stack["frames"]
        return record
    if expected is None:
        record["ok"] = record["raised"] is None
    else:
        kinds, pattern = expected
        record["ok"] = bool(record["raised"] and re.fullmatch(kinds, record["raised"])
                            and re.search(pattern, record["message"]))
        record["expected"] = f"{kinds}: {pattern}"
    return record


def probe(device, preload, on_record):
    """Every case for `device`, all at once (one wave of process starts);
    on_record(record) as each ends, so that a step cut short keeps those."""
    wanted = [name for name, (cuda_only, _) in CASES.items() if device == "cuda" or not cuda_only]
    records = []
    with concurrent.futures.ThreadPoolExecutor(len(wanted)) as pool:
        futures = {pool.submit(ended, [sys.executable, os.path.abspath(__file__), "--case", name, "--device", device],
                               preload): name for name in wanted}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            rc, seconds, out, err, stack = future.result()
            records.append(dict(judge(name, CASES[name][1], rc, out, err, stack), seconds=seconds))
            on_record(records[-1], records)
    return sorted(records, key=lambda r: wanted.index(r["case"]))


def rerun_test(node, preload):
    """One pytest node in its own process; its native stack if it crashes."""
    # -s: pytest must not hold fd 2, where the stack is written as the process dies.
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:faulthandler", node]
    rc, seconds, out, err, stack = ended(argv, preload)
    print(f"{node}: exit {rc} after {seconds} s")
    print("\n".join((out + err).split("segv_backtrace: native stack")[0].strip().splitlines()[-15:]))
    if stack:
        print(f"native stack at {stack['signal']}:\n  " + "\n  ".join(stack["frames"]))
    return 0 if rc == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--pytest", metavar="NODE", help="rerun one test node; its native stack if it crashes")
    args = ap.parse_args()
    if args.case:
        run_case(args.case, args.device or "cpu")
        return 0
    with tempfile.TemporaryDirectory() as work:
        preload = build_preload(work)
        if not preload:
            print("NOTE no C compiler: a crash's native stack is not recorded")
        if args.pytest:
            return rerun_test(args.pytest, preload)
        device = args.device or ("cuda" if cuda_available() else "cpu")

        def save(records):
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"device": device, "native_stacks": preload is not None, "cases": records}, f, indent=2)

        def on_record(r, so_far):
            said = r.get("how") or (f"raised {r['raised']}: {r['message']}" if r.get("raised") else r.get("message")
                                    or "ok")
            print(f"  {'OK   ' if r['ok'] else 'WRONG'} {r['case']:<36} {said[:110]}  ({r['seconds']} s)", flush=True)
            for frame in r.get("native_stack", [])[:30]:
                print(f"        {frame}", flush=True)
            save(so_far)

        records = probe(device, preload, on_record)
        save(records)
    bad = [r["case"] for r in records if not r["ok"]]
    print(f"crash probe on {device}: {len(records) - len(bad)}/{len(records)} as expected"
          + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def cuda_available():
    """Asked in a child, so that this process never initialises CUDA."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True)
    return done.stdout.strip() == "True"


if __name__ == "__main__":
    sys.exit(main())
