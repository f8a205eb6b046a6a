#!/usr/bin/env python3
"""Load-time cost of permuting a whole model's wq_b and wo_a weights.

For each tensor kind (wq_b weight + scale, wo_a weight + scale, and FlashMLA's
own layouts: wq_b with DeepGEMM's packed MN-major int32 scale, the 3-D wv
weight with its packed scale), device and
backend (`reference`: the plain torch gather; `native`: this package's ops),
side by side in one process with a plain copy of the same bytes between two
preallocated buffers:

  median time per layer and per model, effective bandwidth (2 x bytes / time),
  the ratio to the copy, the speedup over the reference, and the extra peak
  memory of one call (CPU: peak RSS of a fresh subprocess above its level just
  before the call; CUDA: peak allocated above the level before).

Every backend is checked byte for byte against the reference before it is
timed; a wrong one is reported as wrong and never timed. The model's layers
are distinct tensors (no cache-resident reruns), warm-up is excluded, and CUDA
is timed with events.

Default: DeepSeek-V4.1-Flash at tensor-parallel size 1, 43 layers, every
backend available here.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch

# Run as a script, only bench/ is on sys.path: the repository root goes first,
# so that the package built in place is the one imported.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashmla_perm  # noqa: E402
from flashmla_perm import reference  # noqa: E402

KINDS = ("wq_b", "wo_a", "wq_b_packed", "wv_packed")
PACKED_COLUMNS = 128  # weight columns one packed int32 scale word covers (4 x 32)
MiB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=1, choices=[1, 2, 4, 8], help="tensor-parallel size")
    p.add_argument("--layers", type=int, default=43, help="layers carrying wq_b/wo_a (40 + 3 MTP)")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--head-dim", type=int, default=512)
    p.add_argument("--q-lora-rank", type=int, default=1280, help="K of wq_b")
    p.add_argument("--o-lora-rank", type=int, default=1024, help="rows of wo_a per group")
    p.add_argument("--group", type=int, default=8, help="heads per wo_a group")
    p.add_argument("--weight-dtype", default="float8_e4m3fn")
    p.add_argument("--scale-dtype", default="uint8", help="uint8 or float8_e8m0fnu")
    p.add_argument("--reps", type=int, default=5, help="timed passes over the model")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--devices", default=None, help="default: cpu, and cuda when present")
    p.add_argument("--backends", default="reference,native")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory probes")
    p.add_argument("--kernel-times", action="store_true",
                   help="after the timed passes, one more pass per backend under torch.profiler: "
                        "each kernel's launches, total and mean device time per op (CPU: top-level ops)")
    p.add_argument("--json", metavar="PATH", help="write every number here")
    p.add_argument("--plot", metavar="PATH", help="PNG of time per model (needs matplotlib)")
    p.add_argument("--memory-probe", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --------------------------------------------------------------------------- tensors

def shapes(args, kind):
    """(weight shape, scale shape, the op's integer argument) of one rank's shard.
    The packed kinds' scales are int32, one word per 128 weight columns."""
    cols = args.group * args.head_dim
    groups = args.heads // args.group
    groups_here = max(groups // args.tp, 1)  # below one group per rank, each rank holds one
    if kind in ("wq_b", "wq_b_packed"):
        rows, k = args.heads // args.tp * args.head_dim, args.q_lora_rank
        per = PACKED_COLUMNS if kind == "wq_b_packed" else 32
        return (rows, k), (rows, k // per), args.heads // args.tp
    if kind == "wo_a":
        rows = groups_here * args.o_lora_rank
        return (rows, cols), (rows, cols // 32), args.group
    if kind == "wv_packed":
        lead = (groups_here, args.o_lora_rank)
        return (*lead, cols), (*lead, cols // PACKED_COLUMNS), args.group
    raise ValueError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")


def random_like_bytes(shape, dtype, device):
    t = torch.empty(shape, dtype=torch.uint8, device=device).random_(0, 256)
    return t.view(getattr(torch, dtype))


def mn_major_words(shape, device):
    """Random int32 words ``[..., rows, W]`` in DeepGEMM's MN-major storage:
    ``[..., W, align4(rows)]`` seen through its transpose (padding rows zero)."""
    *lead, rows, words = shape
    pad = (rows + 3) // 4 * 4
    storage = torch.zeros((*lead, words, pad), dtype=torch.int32, device=device)
    view = storage.transpose(-1, -2)[..., :rows, :]
    view.copy_(random_like_bytes((*lead, rows, 4 * words), "uint8", device).view(torch.int32))
    return view


def make_layer(args, kind, device):
    wshape, sshape, _ = shapes(args, kind)
    weight = random_like_bytes(wshape, args.weight_dtype, device)
    if kind.endswith("_packed"):
        return weight, mn_major_words(sshape, device)
    return weight, random_like_bytes(sshape, args.scale_dtype, device)


def as_bytes(t):
    """Every byte of t's storage (a packed scale's padding too), as one flat view."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def layer_bytes(layer):
    return sum(as_bytes(t).numel() for t in layer)


# --------------------------------------------------------------------------- backends

def backend_fn(name, kind, arg):
    mod = reference if name == "reference" else flashmla_perm
    fn = mod.permute_wq_b_ if kind.startswith("wq_b") else mod.permute_wo_a_
    return lambda layer: fn(layer[0], layer[1], arg)


def available_backends(args):
    wanted = args.backends.split(",")
    native = flashmla_perm.build_info()["native"]
    return [b for b in wanted if b == "reference" or (b == "native" and native)]


def check_against_reference(args, kind, device, backend):
    """True when `backend` gives the reference's bytes on one fresh layer."""
    _, _, arg = shapes(args, kind)
    layer = make_layer(args, kind, device)
    expected = [t.clone() for t in layer]
    backend_fn("reference", kind, arg)(expected)
    backend_fn(backend, kind, arg)(layer)
    return all(torch.equal(as_bytes(a), as_bytes(b)) for a, b in zip(layer, expected))


# --------------------------------------------------------------------------- timing

class Timer:
    """Wall time on the CPU; CUDA events on a GPU (synchronised once per pass)."""

    def __init__(self, device):
        self.cuda = device.startswith("cuda")

    def pass_seconds(self, fn, items):
        if not self.cuda:
            total = 0.0
            for item in items:
                t0 = time.perf_counter()
                fn(item)
                total += time.perf_counter() - t0
            return total
        events = []
        for item in items:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(item)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return sum(s.elapsed_time(e) for s, e in events) / 1e3


def copy_fn(buffers):
    """A plain copy of a layer's bytes into preallocated buffers of the same size."""
    def run(layer):
        for dst, src in zip(buffers, layer):
            dst.copy_(as_bytes(src))
    return run


def progress(msg):
    if sys.stderr.isatty() or os.environ.get("BENCH_PROGRESS", "1") == "1":
        sys.stderr.write(f"\r\033[K{msg}" if sys.stderr.isatty() else f"{msg}\n")
        sys.stderr.flush()


def time_kind(args, kind, device, backends):
    _, _, arg = shapes(args, kind)
    progress(f"[{device} {kind}] making {args.layers} layers of random bytes")
    layers = [make_layer(args, kind, device) for _ in range(args.layers)]
    buffers = [torch.empty(layer_bytes([t]), dtype=torch.uint8, device=device) for t in layers[0]]
    fns = {"copy": copy_fn(buffers), **{b: backend_fn(b, kind, arg) for b in backends}}
    timer = Timer(device)
    for name, fn in fns.items():  # warm-up: plans, allocator, page faults
        fn(layers[0])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = {name: [] for name in fns}
    for rep in range(args.reps):
        for name, fn in fns.items():  # interleaved, so drift hits every backend alike
            progress(f"[{device} {kind}] pass {rep + 1}/{args.reps}: {name}")
            seconds[name].append(timer.pass_seconds(fn, layers))
    kernels = kernel_times(device, kind, fns, layers) if args.kernel_times else []
    return seconds, layer_bytes(layers[0]), kernels


# --------------------------------------------------------------------------- kernel times

def short_kernel_name(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::|flashmla_perm::|at::native::", "", name)
    return re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", name)  # the parameter list


def kernel_times(device, kind, fns, layers):
    """One extra pass over `layers` per backend under torch.profiler, apart
    from the timed passes (whose numbers it does not touch). On CUDA: every
    device activity (kernels, memcpy, memset) by name, with its launches, total
    and mean device time, per op call (one call per layer). On the CPU: the
    top-level ops, by CPU time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    rows = []
    for name, fn in fns.items():
        progress(f"[{device} {kind}] kernel times: {name}")
        try:
            with profile(activities=activities) as prof:
                for layer in layers:
                    fn(layer)
                if cuda:
                    torch.cuda.synchronize()
            events = prof.events()
        except Exception as e:  # a profiler without CUPTI, say: report it, time nothing
            rows.append({"device": device, "kind": kind, "backend": name, "error": f"{type(e).__name__}: {e}"})
            continue
        totals = {}
        for e in events:
            if (e.device_type == DeviceType.CUDA) if cuda else (e.cpu_parent is None):
                count, us = totals.get(e.name, (0, 0.0))
                totals[e.name] = (count + 1, us + e.time_range.elapsed_us())
        if not totals:
            rows.append({"device": device, "kind": kind, "backend": name,
                         "error": "no device activity recorded (is CUPTI available?)" if cuda else "no ops recorded"})
        for kernel, (count, us) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            rows.append({
                "device": device, "kind": kind, "backend": name, "kernel": kernel,
                "time": "device" if cuda else "cpu", "launches": count, "ops": len(layers),
                "launches_per_op": count / len(layers), "total_us_per_op": us / len(layers),
                "mean_us": us / count,
            })
    return rows


def print_kernel_times(rows, top=6):
    print()
    print(f"kernel times (torch.profiler, one extra pass per backend; per op = per layer call; "
          f"the {top} longest of each, all in --json)")
    head = f"{'device':6} {'kind':11} {'backend':9} {'launch/op':>9} {'us/op':>9} {'mean us':>9}  kernel"
    print(head)
    print("-" * len(head))
    shown = {}
    for r in rows:
        key = (r["device"], r["kind"], r["backend"])
        shown[key] = shown.get(key, 0) + 1
        if shown[key] > top:
            continue
        if "error" in r:
            print(f"{r['device']:6} {r['kind']:11} {r['backend']:9} {r['error']}")
            continue
        print(f"{r['device']:6} {r['kind']:11} {r['backend']:9} {r['launches_per_op']:9.2f} "
              f"{r['total_us_per_op']:9.1f} {r['mean_us']:9.1f}  {short_kernel_name(r['kernel'])}")


# --------------------------------------------------------------------------- memory

def read_hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def memory_probe(spec):
    """Runs in a fresh subprocess: extra peak memory of one call."""
    args = parse_args(spec["argv"])
    kind, device, backend = spec["kind"], spec["device"], spec["backend"]
    _, _, arg = shapes(args, kind)
    fn = backend_fn(backend, kind, arg)
    fn(make_layer(args, kind, device))  # warm-up: plans and allocator pools exist already
    layer = make_layer(args, kind, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(layer)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - before
    else:
        # A child inherits its parent's ru_maxrss: reset the peak to the
        # current RSS, then read the high-water mark after the call.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = read_hwm_bytes()
        fn(layer)
        extra = read_hwm_bytes() - before
    print(json.dumps({"extra_bytes": max(extra, 0), "tensor_bytes": layer_bytes(layer)}))


def measure_memory(argv, kind, device, backend):
    spec = json.dumps({"argv": argv, "kind": kind, "device": device, "backend": backend})
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-probe", spec],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- report

def summarize(args, device, kind, seconds, nbytes, memory):
    copy = statistics.median(seconds["copy"])
    rows = []
    for name, samples in seconds.items():
        model = statistics.median(samples)
        row = {
            "device": device, "kind": kind, "backend": name,
            "seconds_per_model": model, "seconds_per_layer": model / args.layers,
            "samples_seconds_per_model": samples,
            "bytes_per_layer": nbytes, "gbytes_per_s": 2 * nbytes * args.layers / model / 1e9,
            "x_copy": model / copy,
        }
        if name != "copy" and "reference" in seconds:
            row["speedup_vs_reference"] = statistics.median(seconds["reference"]) / model
        if name in memory:
            row["extra_peak_bytes"] = memory[name]["extra_bytes"]
            row["extra_peak_fraction"] = memory[name]["extra_bytes"] / nbytes
        rows.append(row)
    return rows


def print_table(rows, wrong):
    head = f"{'device':6} {'kind':11} {'backend':9} {'ms/layer':>9} {'s/model':>8} {'GB/s':>7} {'x copy':>7} {'vs ref':>7} {'extra mem':>15}"
    print(head)
    print("-" * len(head))
    for r in rows:
        mem = (f"{r['extra_peak_bytes'] / MiB:7.1f} MiB {r['extra_peak_fraction']:4.2f}x"
               if "extra_peak_bytes" in r else "")
        vs = f"{r['speedup_vs_reference']:6.1f}x" if "speedup_vs_reference" in r else ""
        print(f"{r['device']:6} {r['kind']:11} {r['backend']:9} {r['seconds_per_layer'] * 1e3:9.2f} "
              f"{r['seconds_per_model']:8.3f} {r['gbytes_per_s']:7.2f} {r['x_copy']:6.2f}x {vs:>7} {mem:>15}")
    for w in wrong:
        print(f"{w['device']:6} {w['kind']:11} {w['backend']:9} WRONG: bytes differ from the reference; not timed")


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot: matplotlib is not installed; no {path}", file=sys.stderr)
        return
    labels = [f"{r['device']} {r['kind']}\n{r['backend']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.9), 4))
    ax.bar(range(len(rows)), [r["seconds_per_model"] for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("seconds per model (median)")
    ax.set_yscale("log")
    ax.set_title("flashmla_perm: load-time permutation cost")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.memory_probe:
        return memory_probe(json.loads(args.memory_probe))
    devices = args.devices.split(",") if args.devices else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    backends = available_backends(args)
    info = flashmla_perm.build_info()
    print(f"flashmla_perm {info['version']}, native={info['native']} cuda={info['cuda']}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"model: {args.layers} layers, {args.heads} heads x {args.head_dim}, TP {args.tp}, "
          f"weights {args.weight_dtype}, scales {args.scale_dtype} (the packed kinds: int32 MN-major); median of {args.reps} passes")
    if "native" in args.backends and "native" not in backends:
        print(f"native backend unavailable: {info['native_error']}")
    rows, wrong, kernels = [], [], []
    for device in devices:
        for kind in args.kinds.split(","):
            good = []
            for b in backends:
                if b == "reference" or check_against_reference(args, kind, device, b):
                    good.append(b)
                else:
                    wrong.append({"device": device, "kind": kind, "backend": b})
            seconds, nbytes, kernel_rows = time_kind(args, kind, device, good)
            kernels += kernel_rows
            memory = {} if args.no_memory else {
                b: measure_memory(argv, kind, device, b) for b in good}
            rows += summarize(args, device, kind, seconds, nbytes, memory)
    progress("done")
    print()
    print_table(rows, wrong)
    if args.kernel_times:
        print_kernel_times(kernels)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "build_info": info, "torch": torch.__version__,
                       "rows": rows, "wrong": wrong, "kernel_times": kernels}, f, indent=2)
    if args.plot:
        plot(rows, args.plot)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
