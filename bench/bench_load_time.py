#!/usr/bin/env python3
"""Load-time cost of permuting a whole model's wq_b and wo_a weights.

Kinds (one rank's shard at TP t, one item per layer): wq_b, wo_a (weight +
ue8m0 scale, in place); wq_b_packed, wv_packed (DeepGEMM's packed MN-major
int32 scale); permute_q, permute_q_h128 (Q [tokens, 64/t or 128/t, 512] bf16,
out of place); load (a layer's four tensors through their weight loaders);
generic (permute_ on large uint8 tensors, a row per shape: generic:<shape>).

Backends, taking turns within each pass: copy (the same bytes, each layer into
buffers of its own; for load, vLLM's default_weight_loader), reference
(torch's gather; for load, vLLM's permute_on_load, reported as vllm), native
(this package; generic adds native_first, a fresh perm each call) and, for the
in-place weight kinds, the baselines inplace, outofplace and copy_1buf.

Every backend is checked byte for byte against the reference before it is
timed (a wrong one is reported, not timed, and the exit status is 1). Per
row: medians of wall and device time per pass (CUDA: graph replay, or
torch.profiler where a pass cannot be captured), bandwidth, ratios to the
copy and the reference, and one call's extra peak memory (fresh subprocess).
docs/performance.md has the method. Default: DeepSeek-V4.1-Flash, TP 1, 43
layers, every kind and backend available here.
"""

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict

import torch

# Run as a script, only bench/ is on sys.path: the repository root goes first,
# so that the package built in place is the one imported.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import flashmla_perm  # noqa: E402
from flashmla_perm import reference  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "device"))
from card import record_cuda_card  # noqa: E402

WEIGHT_KINDS = ("wq_b", "wo_a", "wq_b_packed", "wv_packed")
Q_KINDS = {"permute_q": None, "permute_q_h128": 128}  # kind -> heads before TP (None: --heads)
# generic: (shape, dim) a row each, uint8 (the unit's bytes are what matters).
GENERIC_CASES = {
    "[4Mi]": ((4 << 20,), 0),
    "[4Mi,16]": ((4 << 20, 16), 0),
    "[16,1Mi]": ((16, 1 << 20), 1),
    "[1Mi,256]": ((1 << 20, 256), 0),
}
KINDS = (*WEIGHT_KINDS, *Q_KINDS, "load", "generic")
PACKED_COLUMNS = 128  # weight columns one packed int32 scale word covers (4 x 32)
Q_ITEMS = 4  # distinct Q tensors per pass: each is far larger than any cache
MiB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--tp", type=int, nargs="+", default=[1], choices=[1, 2, 4, 8], help="tensor-parallel sizes, e.g. --tp 1 2 4 8")
    add("--layers", type=int, default=43, help="layers carrying wq_b/wo_a (40 + 3 MTP)")
    add("--heads", type=int, default=64)
    add("--head-dim", type=int, default=512)
    add("--q-lora-rank", type=int, default=1280, help="K of wq_b")
    add("--o-lora-rank", type=int, default=1024, help="rows of wo_a per group")
    add("--group", type=int, default=8, help="heads per wo_a group")
    add("--tokens", type=int, default=4096, help="tokens of the permute_q kinds")
    add("--weight-dtype", default="float8_e4m3fn")
    add("--scale-dtype", default="uint8", help="uint8 or float8_e8m0fnu")
    add("--reps", type=int, default=5, help="timed passes over the model")
    add("--kinds", default=",".join(KINDS))
    add("--devices", default=None, help="default: cpu, and cuda when present")
    add("--backends", default="reference,native", help="besides the copy; also inplace,outofplace,copy_1buf")
    add("--no-memory", action="store_true", help="skip the peak-memory probes")
    add("--kernel-times", action="store_true", help="then a pass per backend under torch.profiler, by kernel")
    add("--json", metavar="PATH", help="every number, rewritten as each kind finishes")
    add("--memory-probe", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = set(args.kinds.split(",")) - {*KINDS, *(f"generic:{c}" for c in GENERIC_CASES)}
    if unknown:
        p.error(f"unknown kinds {sorted(unknown)} (known: {', '.join(KINDS)})")
    return args


# --------------------------------------------------------------------------- tensors


def shapes(args, kind, tp):
    """(weight shape, scale shape, the op's integer argument) of one rank's shard.
    The packed kinds' scales are int32, one word per 128 weight columns."""
    cols = args.group * args.head_dim
    groups_here = max(args.heads // args.group // tp, 1)  # below one group per rank, each rank holds one
    if kind in ("wq_b", "wq_b_packed"):
        rows, k = args.heads // tp * args.head_dim, args.q_lora_rank
        per = PACKED_COLUMNS if kind == "wq_b_packed" else 32
        return (rows, k), (rows, k // per), args.heads // tp
    if kind == "wo_a":
        rows = groups_here * args.o_lora_rank
        return (rows, cols), (rows, cols // 32), args.group
    if kind == "wv_packed":
        lead = (groups_here, args.o_lora_rank)
        return (*lead, cols), (*lead, cols // PACKED_COLUMNS), args.group
    raise ValueError(f"no weight shapes for kind {kind!r}")


def random_like_bytes(shape, dtype, device):
    """A `shape` tensor of `dtype` filled with random bytes (never zeros)."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    size = torch.empty((), dtype=dtype).element_size()
    t = torch.empty((*shape[:-1], shape[-1] * size), dtype=torch.uint8, device=device).random_(0, 256)
    return t.view(dtype)


def mn_major_words(shape, device):
    """Random int32 words ``[..., rows, W]`` in DeepGEMM's MN-major storage:
    ``[..., W, align4(rows)]`` seen through its transpose (padding rows zero)."""
    *lead, rows, words = shape
    storage = torch.zeros((*lead, words, (rows + 3) // 4 * 4), dtype=torch.int32, device=device)
    view = storage.transpose(-1, -2)[..., :rows, :]
    view.copy_(random_like_bytes((*lead, rows, 4 * words), "uint8", device).view(torch.int32))
    return view


def make_layer(args, kind, tp, device):
    wshape, sshape, _ = shapes(args, kind, tp)
    weight = random_like_bytes(wshape, args.weight_dtype, device)
    if kind.endswith("_packed"):
        return weight, mn_major_words(sshape, device)
    return weight, random_like_bytes(sshape, args.scale_dtype, device)


def as_bytes(t):
    """Every byte of t's storage (a packed scale's padding too), as one flat view."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def tensors_bytes(tensors):
    return sum(as_bytes(t).numel() for t in tensors)


def same_bytes(a, b):
    return all(torch.equal(as_bytes(x), as_bytes(y)) for x, y in zip(a, b))


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- cases


@dataclasses.dataclass
class Case:
    """What one (device, tp, kind) times: the items of a pass (one per layer)
    and, per backend, a function of one item."""

    items: list
    fns: Dict[str, Callable]  # "copy" first: the baseline
    item_bytes: int  # bytes of one item's tensors; a pass moves 2x that per item, at the least
    check: Callable[[str], bool]  # whether a backend gives the reference's bytes, on an item of its own
    capturable: frozenset  # backends whose pass a CUDA graph can capture (no sync, no host copy)
    reference: str = "reference"
    note: str = ""  # printed once: where the backends came from


def layer_buffers(layers, device):
    """Per layer, a buffer per tensor of its storage's size, as a loader writes each
    layer into params of its own. Poisoned: their pages exist before any timing."""
    return {
        id(layer): [torch.full((tensors_bytes([t]),), 0xA5, dtype=torch.uint8, device=device) for t in layer]
        for layer in layers
    }


def copy_into(buffers_of):
    """A plain copy of a layer's bytes into buffers_of(layer), of the same sizes."""

    def run(tensors):
        for dst, src in zip(buffers_of(tensors), tensors):
            dst.copy_(as_bytes(src))

    return run


# Baselines, not the product: torch's elementwise kernel streaming every byte
# in place or into each layer's own buffers, and the copy into one set of
# buffers every layer reuses (a GPU's L2 then absorbs part of its writes). Not
# permutations: not checked against the reference, no memory probe.
BASELINES = ("inplace", "outofplace", "copy_1buf")


def words(t):
    """t's whole storage as the widest integer words that tile it (and are
    aligned), so that an elementwise kernel streams it in wide vectors."""
    b = as_bytes(t)
    for dtype in (torch.int64, torch.int32, torch.int16):
        size = torch.empty((), dtype=dtype).element_size()
        if b.numel() % size == 0 and b.data_ptr() % size == 0:
            return b.view(dtype)
    return b


def stream_in_place(tensors):
    for t in tensors:
        words(t).bitwise_or_(0)


def stream_into(buffers_of):
    def run(tensors):
        for dst, src in zip(buffers_of(tensors), tensors):
            w = words(src)
            torch.bitwise_or(w, 0, out=dst.view(w.dtype))

    return run


def weight_fn(name, kind, arg):
    mod = reference if name == "reference" else flashmla_perm
    fn = mod.permute_wq_b_ if kind.startswith("wq_b") else mod.permute_wo_a_
    return lambda layer: fn(layer[0], layer[1], arg)


def weight_case(args, kind, tp, device, backends, layers):
    """The in-place weight ops: each layer a (weight, scale) pair."""
    _, _, arg = shapes(args, kind, tp)
    items = [make_layer(args, kind, tp, device) for _ in range(layers)]
    own = layer_buffers(items, device)
    own_buffers = lambda layer: own[id(layer)]  # items stay alive with the case
    shared = layer_buffers(items[:1], device)[id(items[0])] if "copy_1buf" in backends else None

    def check(name):
        layer = make_layer(args, kind, tp, device)
        expected = [t.clone() for t in layer]
        weight_fn("reference", kind, arg)(expected)
        weight_fn(name, kind, arg)(layer)
        return same_bytes(layer, expected)

    baselines = {
        "inplace": stream_in_place,
        "outofplace": stream_into(own_buffers),
        "copy_1buf": copy_into(lambda layer: shared),
    }
    fns = {
        "copy": copy_into(own_buffers),
        **{b: baselines[b] if b in BASELINES else weight_fn(b, kind, arg) for b in backends},
    }
    return Case(items, fns, tensors_bytes(items[0]), check, frozenset({"copy", "native", *BASELINES}))


def q_case(args, kind, tp, device, backends, layers):
    """Q activations, permuted out of place (the copy: into a preallocated tensor)."""
    shape = (args.tokens, (Q_KINDS[kind] or args.heads) // tp, args.head_dim)
    items = [random_like_bytes(shape, torch.bfloat16, device) for _ in range(min(layers, Q_ITEMS))]
    out = torch.empty_like(items[0])
    ops = {"reference": reference.permute_q_to_fused, "native": flashmla_perm.permute_q_to_fused}

    def check(name):
        q = random_like_bytes(shape, torch.bfloat16, device)
        return same_bytes([ops[name](q)], [reference.permute_q_to_fused(q)])

    fns = {"copy": out.copy_, **{b: ops[b] for b in backends if b in ops}}  # no baselines out of place
    return Case(items, fns, tensors_bytes(items[:1]), check, frozenset({"copy", "native"}))


# --------------------------------------------------------------------------- the load kind
# As vLLM's DeepSeek-V4.1 layer does it: each param's weight_loader, wrapped
# once by permute_on_load(param, perm, dim), is called with each checkpoint tensor.


def plain_loader(param, loaded_weight):
    """vLLM's default_weight_loader, for a machine without vLLM."""
    assert param.size() == loaded_weight.size()
    param.data.copy_(loaded_weight)


def permute_on_load_equivalent(param, perm, dim):
    """vLLM 0.33.0's permute_on_load (composed_weight_loader(loader, gather)), for a machine without vLLM."""
    loader = param.weight_loader

    def composed_loader(param, loaded_weight):
        loader(param, loaded_weight)
        param.data.copy_(param.view(torch.uint8).index_select(dim, perm.to(param.device)).view(param.dtype))

    param.weight_loader = composed_loader


# What importing vLLM 0.33.0 logs at ERROR on a machine without its GPU stack
# (which loading does not use): nothing is wrong, but the line reads so.
GPU_STACK_ERRORS = re.compile(r"^Failed to import Triton kernels\b")


@contextlib.contextmanager
def quiet_vllm_import():
    """During the import, vLLM's logger and torch's Triton one held at ERROR
    (with no handler yet, they print bare on sys.stderr) and sys.stderr
    buffered, then written back without GPU_STACK_ERRORS' lines: all else
    still shows. VLLM_LOGGING_LEVEL set: vLLM's import as vLLM prints it."""
    if "VLLM_LOGGING_LEVEL" in os.environ:
        yield
        return
    loggers = [logging.getLogger(name) for name in ("vllm", "torch._library.triton")]
    levels = [logger.level for logger in loggers]
    buffer = io.StringIO()
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with contextlib.redirect_stderr(buffer):
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        sys.stderr.write("".join(s for s in buffer.getvalue().splitlines(True) if not GPU_STACK_ERRORS.match(s)))
        sys.stderr.flush()


def vllm_loaders():
    """(default_weight_loader, permute_on_load, where they came from): vLLM's
    own where it is installed, else the exact equivalents above."""
    try:
        with quiet_vllm_import():
            import vllm
            from vllm.model_executor.model_loader.weight_utils import default_weight_loader
            from vllm.models.deepseek_v41.common.ops import fused_layout
    except ImportError as e:
        return plain_loader, permute_on_load_equivalent, f"the bench's equivalent (no vLLM: {e})"
    # This package's vLLM plugin replaces permute_on_load when vLLM loads its
    # plugins: the timed function must be vLLM's own.
    if fused_layout.permute_on_load.__module__ != fused_layout.__name__:
        raise SystemExit(f"vLLM's permute_on_load has been replaced by {fused_layout.permute_on_load.__module__}'s")
    return default_weight_loader, fused_layout.permute_on_load, f"vllm {vllm.__version__}"


def load_case(args, tp, device, backends, layers):
    """Each layer: its four checkpoint tensors and, per way (the copy, vLLM's,
    the native), four fresh params wrapped once with its permute_on_load. The
    ways' params share one storage per layer: every load overwrites all of
    it, and three full copies of the model would not fit a small machine."""
    loader, ways, notes, cuda = plain_loader, {"copy": None}, [], device.startswith("cuda")
    if "reference" in backends:  # imports vLLM (seconds) only when its way is asked for
        loader, ways["vllm"], source = vllm_loaders()
        notes.append(f"load: vllm = permute_on_load of {source}")
    if "native" in backends:
        if hasattr(flashmla_perm, "permute_on_load"):
            ways["native"] = flashmla_perm.permute_on_load
        else:
            notes.append("load: native skipped: this flashmla_perm has no permute_on_load")
    q_perm = reference.q_fused_permutation(args.heads // tp, args.head_dim)
    wq_b, wq_b_scale, _ = shapes(args, "wq_b", tp)
    wo_a, wo_a_scale, _ = shapes(args, "wo_a", tp)
    specs = [  # (shape, dtype, perm, dim) of a layer's four params, as vLLM's layer wraps them
        (wq_b, args.weight_dtype, q_perm, 0),
        (wq_b_scale, args.scale_dtype, q_perm, 0),
        (wo_a, args.weight_dtype, reference.o_fused_permutation(args.group, args.head_dim), 1),
        (wo_a_scale, args.scale_dtype, reference.o_fused_chunk_permutation(args.group, args.head_dim), 1),
    ]

    def checkpoint():  # random bytes; on CUDA in pinned host memory, made on the device (the CPU's RNG is slow)
        made = (random_like_bytes(shape, dtype, device) for shape, dtype, _, _ in specs)
        return [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t) if cuda else t for t in made]

    def storage():  # zeros, not empty: the pages exist before any timed load
        return [torch.zeros(shape, dtype=getattr(torch, dtype), device=device) for shape, dtype, _, _ in specs]

    def params(wrap, tensors):
        ps = [torch.nn.Parameter(t, requires_grad=False) for t in tensors]  # each shares its tensor's storage
        for p, (_, _, perm, dim) in zip(ps, specs):
            p.weight_loader = loader
            if wrap is not None:
                wrap(p, perm, dim)
        return ps

    def load(ps, ckpt):
        for p, c in zip(ps, ckpt):
            p.weight_loader(p, c)

    checkpoints = [checkpoint() for _ in range(layers)]
    storages = [storage() for _ in range(layers)]
    fns = {}
    for name, wrap in ways.items():
        per_layer = [params(wrap, s) for s in storages]
        fns[name] = lambda i, per_layer=per_layer: load(per_layer[i], checkpoints[i])

    def check(name):
        """The way's params hold the checkpoint permuted by the package's
        reference functions (so the native and vLLM ways agree byte for byte)."""
        ckpt, dst = checkpoint(), storage()
        load(params(ways[name], dst), ckpt)
        expected = [c.to(device, copy=True) for c in ckpt]
        reference.permute_wq_b_(expected[0], expected[1], args.heads // tp)
        reference.permute_wo_a_(expected[2], expected[3], args.group)
        return same_bytes(dst, expected)

    note = "; ".join(notes)
    return Case(list(range(layers)), fns, tensors_bytes(checkpoints[0]), check, frozenset(), "vllm", note)


def generic_case(args, kind, device, backends):
    """permute_ on one large uint8 tensor: the same perm again (native: its plan
    found; reference: torch's gather + copy) or, native_first, a fresh random
    perm each call (no plan). Items are calls (tp and --layers do not apply)."""
    shape, dim = GENERIC_CASES[kind.split(":", 1)[1]]
    t = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    out = torch.empty_like(t)
    n = shape[dim]
    perm = torch.randperm(n, device=device)
    items = [0, 1]
    # Perms drawn before anything is timed, one a native_first call: the
    # warm-up's, then each pass's (on CUDA the profiler's probe pass first, and
    # each timed pass twice: its wall time, then the profiler's), then --kernel-times'.
    runs = (1 + 2 * args.reps if device.startswith("cuda") else args.reps) + args.kernel_times
    draws = 1 + len(items) * runs if "native" in backends else 0
    fresh = [torch.randperm(n, device=device) for _ in range(draws)]
    ops = {
        "reference": lambda _: t.copy_(t.index_select(dim, perm)),
        "native": lambda _: flashmla_perm.permute_(t, perm, dim),
        "native_first": lambda _: flashmla_perm.permute_(t, fresh.pop(), dim),
    }

    def check(name):
        x = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
        p = torch.randperm(n, device=device)
        expected = x.index_select(dim, p)
        flashmla_perm.permute_(x, p, dim)
        ok = torch.equal(x, expected)
        flashmla_perm.permute_(x, p, dim)  # again: through its plan
        return ok and torch.equal(x, expected.index_select(dim, p))

    names = [b for b in backends if b in ops] + (["native_first"] if "native" in backends else [])
    fns = {"copy": lambda _: out.copy_(t), **{b: ops[b] for b in names}}
    return Case(items, fns, t.numel(), check, frozenset({"copy", "native"}))


def make_case(args, kind, tp, device, backends, layers):
    if kind == "load":
        return load_case(args, tp, device, backends, layers)
    if kind.startswith("generic:"):
        return generic_case(args, kind, device, backends)
    if kind in Q_KINDS:
        return q_case(args, kind, tp, device, backends, layers)
    return weight_case(args, kind, tp, device, backends, layers)


def available_backends(args):
    native = flashmla_perm.build_info()["native"]
    return [b for b in args.backends.split(",") if b in ("reference", *BASELINES) or (b == "native" and native)]


# --------------------------------------------------------------------------- timing


def wall_seconds(device, run):
    """Host-inclusive time of run(): from an idle device to an idle device."""
    sync(device)
    t0 = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - t0


def graph_timer(run):
    """run() captured in a CUDA graph (after a warm-up on a side stream, as
    torch.cuda.graph asks); returns a callable: one replay's device seconds."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()

    def seconds():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return seconds


def profile_totals(run, cuda):
    """{name: (count, microseconds)} of one run() under torch.profiler: every device
    activity (kernels, memcpy, memset) on CUDA, the top-level ops on the CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    totals = {}
    for e in prof.events():
        if (e.device_type == DeviceType.CUDA) if cuda else (e.cpu_parent is None):
            count, us = totals.get(e.name, (0, 0.0))
            totals[e.name] = (count + 1, us + e.time_range.elapsed_us())
    return totals


def profiled_device_seconds(run):
    """The device activity of run(), summed: idle gaps between kernels (a
    backend that syncs has them) are not counted."""
    totals = profile_totals(run, cuda=True)
    if not totals:
        raise RuntimeError("torch.profiler recorded no device activity (is CUPTI available?)")
    return sum(us for _, us in totals.values()) / 1e6


def device_timer(device, run_pass, capturable):
    """(a callable giving one pass's device seconds, how). On the CPU there
    is no device: None, and the device time is the wall time."""
    if not device.startswith("cuda"):
        return None, "wall"
    if capturable:
        try:
            return graph_timer(run_pass), "graph"
        except RuntimeError as e:  # a backend that syncs inside: say so, and profile it instead
            progress(f"graph capture failed ({first_line(e)}); torch.profiler instead")
            torch.cuda.synchronize()
    try:
        profiled_device_seconds(run_pass)  # CUPTI may be missing: find out before the timed passes
    except Exception as e:
        return None, f"wall (profiler failed: {first_line(e)})"
    return (lambda: profiled_device_seconds(run_pass)), "profiler"


def first_line(e):
    return (str(e).splitlines() or [type(e).__name__])[0]


def progress(msg):
    if sys.stderr.isatty() or os.environ.get("BENCH_PROGRESS", "1") == "1":
        sys.stderr.write(f"\r\033[K{msg}" if sys.stderr.isatty() else f"{msg}\n")
        sys.stderr.flush()


def one_pass(fn, items):
    def run():
        for item in items:
            fn(item)  # an out-of-place result is dropped at once, as a caller would

    return run


def time_case(args, case, device, label):
    """{backend: (wall seconds per pass, device seconds per pass, how the
    device time was taken)}, `args.reps` passes each, backends interleaved
    so that drift hits every backend alike."""
    passes = {name: one_pass(fn, case.items) for name, fn in case.fns.items()}
    for fn in case.fns.values():  # warm-up: plans, allocator, page faults
        fn(case.items[0])
    sync(device)
    timers = {name: device_timer(device, run, name in case.capturable) for name, run in passes.items()}
    times = {name: ([], [], how) for name, (_, how) in timers.items()}
    for rep in range(args.reps):
        for name, run in passes.items():
            progress(f"{label} pass {rep + 1}/{args.reps}: {name}")
            wall, dev, _ = times[name]
            wall.append(wall_seconds(device, run))
            timer = timers[name][0]
            dev.append(timer() if timer else wall[-1])
    return times


# --------------------------------------------------------------------------- kernel times


def kernel_times(case, device, kind, tp, label):
    """One extra pass per backend under torch.profiler, after the timed ones:
    each device activity (CPU: top-level op) by name, its launches, total and
    mean time per op call (one call per item)."""
    cuda = device.startswith("cuda")
    rows = []
    for name, fn in case.fns.items():
        if name in BASELINES:  # torch's own kernel: a profiler pass (seconds on a GPU) would tell nothing
            continue
        progress(f"{label} kernel times: {name}")
        key = {"device": device, "kind": kind, "tp": tp, "backend": name}
        try:
            totals = profile_totals(one_pass(fn, case.items), cuda)
        except Exception as e:  # a profiler without CUPTI, say: report it, time nothing
            rows.append({**key, "error": f"{type(e).__name__}: {e}"})
            continue
        if not totals:
            why = "no device activity recorded (is CUPTI available?)" if cuda else "no ops recorded"
            rows.append({**key, "error": why})
        ops = len(case.items)
        for kernel, (count, us) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            row = {**key, "kernel": kernel, "time": "device" if cuda else "cpu", "launches": count, "ops": ops}
            rows.append({**row, "launches_per_op": count / ops, "total_us_per_op": us / ops, "mean_us": us / count})
    return rows


def short_kernel_name(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::|flashmla_perm::|at::native::", "", name)
    return re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", name)  # the parameter list


def print_kernel_times(rows, top=6):
    print(
        "\nkernel times (torch.profiler, one extra pass per backend; per op = per layer call; "
        f"the {top} longest of each, all in --json)"
    )
    head = f"{ROW_HEAD} {'launch/op':>9} {'us/op':>9} {'mean us':>9}  kernel"
    print(head)
    print("-" * len(head))
    shown = {}
    for r in rows:
        key = (r["device"], r["kind"], r["tp"], r["backend"])
        shown[key] = shown.get(key, 0) + 1
        if shown[key] > top:
            continue
        if "error" in r:
            print(f"{row_lead(r)} {r['error']}")
            continue
        figures = f"{r['launches_per_op']:9.2f} {r['total_us_per_op']:9.1f} {r['mean_us']:9.1f}"
        print(f"{row_lead(r)} {figures}  {short_kernel_name(r['kernel'])}")


# --------------------------------------------------------------------------- memory


def read_hwm_bytes():
    with open("/proc/self/status") as f:
        return int(re.search(r"^VmHWM:\s*(\d+) kB", f.read(), re.M).group(1)) * 1024


def memory_probe(spec):
    """Runs in a fresh subprocess: extra peak memory of one call (one layer),
    above the tensors it works on (for `load`: the params and the checkpoint)."""
    args = parse_args(spec["argv"])
    kind, tp, device, backend = spec["kind"], spec["tp"], spec["device"], spec["backend"]
    # Its --backends name (native_first's fresh perms come with the native backend).
    option = {"copy": [], "vllm": ["reference"], "native_first": ["native"]}.get(backend, [backend])
    case = make_case(args, kind, tp, device, option, layers=2)
    fn = case.fns[backend]
    fn(case.items[0])  # warm-up: plans and allocator pools exist already
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(case.items[1])
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - before
    else:
        # A child inherits its parent's ru_maxrss: reset the peak to the
        # current RSS, then read the high-water mark after the call.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = read_hwm_bytes()
        fn(case.items[1])
        extra = read_hwm_bytes() - before
    print(json.dumps({"extra_bytes": max(extra, 0), "tensor_bytes": case.item_bytes}))


def measure_memory(argv, kind, tp, device, backend):
    spec = json.dumps({"argv": argv, "kind": kind, "tp": tp, "device": device, "backend": backend})
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-probe", spec]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- report


def summarize(key, case, times, memory):
    """One row per backend: key (device, kind, tp) + its numbers."""
    items = len(case.items)
    moved = 2 * case.item_bytes  # per item: every byte read once and written once, at the least
    copy_wall, copy_dev = (statistics.median(s) for s in times["copy"][:2])
    ref = times.get(case.reference)
    rows = []
    for name, (wall, dev, how) in times.items():
        model, model_dev = statistics.median(wall), statistics.median(dev)
        row = {
            **key,
            "backend": name,
            "ms_per_layer": model / items * 1e3,
            "device_ms_per_layer": model_dev / items * 1e3,
            "device_time": how,
            "seconds_per_model": model,
            "seconds_per_layer": model / items,
            "layers": items,
            "samples_seconds_per_model": wall,
            "samples_device_seconds_per_model": dev,
            "bytes_per_layer": case.item_bytes,
            "bytes_moved_per_layer": moved,
            "gbytes_per_s": moved * items / model / 1e9,
            "gbytes_per_s_device": moved * items / model_dev / 1e9,
            "x_copy": model / copy_wall,
            "x_copy_device": model_dev / copy_dev,
        }
        if ref and name not in ("copy", case.reference, *BASELINES):
            row["speedup_vs_reference"] = statistics.median(ref[0]) / model
            row["speedup_vs_reference_device"] = statistics.median(ref[1]) / model_dev
        if name in memory:
            row["extra_peak_bytes"] = memory[name]["extra_bytes"]
            row["extra_peak_fraction"] = memory[name]["extra_bytes"] / case.item_bytes
        rows.append(row)
    return rows


ROW_HEAD = f"{'device':6} {'kind':14} {'tp':>2} {'backend':9}"
TABLE_HEAD = (
    f"{ROW_HEAD} {'ms/layer':>9} {'dev ms':>8} {'how':8} "
    f"{'GB/s':>7} {'x copy':>7} {'x c dev':>7} {'vs ref':>7} {'extra mem':>15}"
)


def row_lead(r):
    return f"{r['device']:6} {r['kind']:14} {r['tp']:2} {r['backend']:9}"


def print_rows(rows):
    for r in rows:
        vs = f"{r['speedup_vs_reference']:6.1f}x" if "speedup_vs_reference" in r else ""
        mem = ""
        if "extra_peak_bytes" in r:
            mem = f"{r['extra_peak_bytes'] / MiB:7.1f} MiB {r['extra_peak_fraction']:4.2f}x"
        print(
            f"{row_lead(r)} {r['ms_per_layer']:9.3f} {r['device_ms_per_layer']:8.3f} {r['device_time']:8} "
            f"{r['gbytes_per_s']:7.2f} {r['x_copy']:6.2f}x {r['x_copy_device']:6.2f}x {vs:>7} {mem:>15}",
            flush=True,
        )


def write_json(path, doc):
    """The whole document, replaced atomically: a run killed later keeps it."""
    with open(f"{path}.tmp", "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(f"{path}.tmp", path)


# --------------------------------------------------------------------------- main


def run_kind(args, argv, key, backends, doc):
    """Check, time and report one (device, kind, tp); its rows go into doc."""
    device, kind, tp = key["device"], key["kind"], key["tp"]
    label = f"[{device} {kind} tp{tp}]"
    progress(f"{label} making {args.layers} layers of random bytes")
    case = make_case(args, kind, tp, device, backends, args.layers)
    if case.note and case.note not in doc["notes"]:
        doc["notes"].append(case.note)
        print(case.note, flush=True)
    # Everything but the copy and the package's reference functions (the
    # oracle itself); for `load` that includes vLLM's way.
    for name in [b for b in case.fns if b not in ("copy", "reference", *BASELINES)]:
        if not case.check(name):
            del case.fns[name]
            doc["wrong"].append({**key, "backend": name})
            print(f"{row_lead(doc['wrong'][-1])} WRONG: bytes differ from the reference; not timed", flush=True)
    times = time_case(args, case, device, label)
    if args.kernel_times:
        doc["kernel_times"] += kernel_times(case, device, kind, tp, label)
    probed = [] if args.no_memory else [b for b in case.fns if b not in ("copy", *BASELINES)]
    memory = {b: measure_memory(argv, kind, tp, device, b) for b in probed}
    rows = summarize(key, case, times, memory)
    progress(f"{label} done")
    print_rows(rows)
    doc["rows"] += rows


def cpu_name():
    """The CPU's model name (Linux), else the platform's word for it."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        if m:
            return f"{m.group(1).strip()}, {os.cpu_count()} cores"
    return platform.processor() or platform.machine()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.memory_probe:
        return memory_probe(json.loads(args.memory_probe))
    devices = args.devices.split(",") if args.devices else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    backends = available_backends(args)
    info = flashmla_perm.build_info()
    print(
        f"flashmla_perm {info['version']}, native={info['native']} cuda={info['cuda']}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        f"model: {args.layers} layers, {args.heads} heads x {args.head_dim}, TP {args.tp}, "
        f"weights {args.weight_dtype}, scales {args.scale_dtype} (the packed kinds: int32 MN-major), "
        f"Q {args.tokens} tokens bf16; median of {args.reps} passes"
    )
    if "native" in args.backends and "native" not in backends:
        print(f"native backend unavailable: {info['native_error']}")
    # Which machine gave the figures: a ratio from one card is not another's.
    doc = {"args": vars(args), "build_info": info, "torch": torch.__version__, "cpu": cpu_name(), "card": None}
    doc.update(rows=[], wrong=[], kernel_times=[], notes=[])
    card = record_cuda_card(doc) if "cuda" in devices and torch.cuda.is_available() else None
    machine = f"cpu: {doc['cpu']}"
    if card:
        machine += f"; cuda: {card['name']}, {card['sms']} SMs, {card['peak_tbps']} TB/s peak"
    if "card_error" in doc:
        machine += f"; cuda card not read: {doc['card_error']}"
    print(machine)
    print(TABLE_HEAD)
    print("-" * len(TABLE_HEAD), flush=True)
    kinds = []
    for k in args.kinds.split(","):
        kinds += [f"generic:{c}" for c in GENERIC_CASES] if k == "generic" else [k]
    for device in devices:
        for tp in args.tp:
            for kind in kinds:
                run_kind(args, argv, {"device": device, "kind": kind, "tp": tp}, backends, doc)
                if args.json:
                    write_json(args.json, doc)
    if args.kernel_times:
        print_kernel_times(doc["kernel_times"])
    return 1 if doc["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
