#!/usr/bin/env python3
"""Load-time cost of permuting a whole model's wq_b and wo_a weights.

Kinds (one rank's shard at tensor-parallel size t, one item per layer):

  wq_b, wo_a          weight + ue8m0 scale, permuted in place
  wq_b_packed         wq_b with DeepGEMM's packed MN-major int32 scale
  wv_packed           the 3-D wv weight with its packed scale
  permute_q           Q activations [tokens, 64/t, 512] bf16, out of place
  permute_q_h128      the same with 128/t heads
  load                the four tensors of a layer loaded through their weight
                      loaders, checkpoint -> param (pinned host -> GPU on CUDA)
  generic             permute_ on one-shot large permutations of uint8 tensors:
                      [4Mi], [4Mi, 16] and [1Mi, 256] along 0, [16, 1Mi] along
                      1, a row each (kind generic:<shape>); `reference` is
                      torch's t.copy_(t.index_select(dim, perm)), `native` the
                      call with a perm it has planned (the same perm again),
                      `native_first` a fresh random perm each call (no plan)

Backends, side by side in one process, taking turns within each pass:
`copy` (a plain copy of the same bytes, for the weight kinds each layer into
buffers of its own, as a loader writes each layer into its own params; for
`load` the plain loader, vLLM's default_weight_loader), `reference` (the
plain torch gather; for `load`, vLLM's permute_on_load, reported as `vllm`)
and `native` (this package). Three baselines for the in-place weight kinds,
when --backends names them: `inplace` (torch's own elementwise kernel reads
every byte and writes it back in place: a bitwise or with 0 on the widest
integer words that tile the storage), `outofplace` (the same kernel into
each layer's own buffers; the ratio of the two is what streaming in place
costs on the device, apart from any permutation) and `copy_1buf` (the copy
into one set of buffers that every layer reuses, as the first device run's
copy did: a GPU's L2 then absorbs part of its writes).

Per (device, tp, kind, backend): the median wall time (host-inclusive) and
device time of a whole pass over the layers, effective bandwidth (the bytes
moved: each byte read once and written once, over the time), the ratios to
the copy, the speedup over the reference, and the extra peak memory of one
call (CPU: peak RSS of a fresh subprocess above its level just before the
call; CUDA: peak allocated above the level before). Device time on CUDA: the
pass captured in a CUDA graph and replayed (events), or, for a backend that
cannot be captured (it syncs or copies from the host), the sum of the device
activity torch.profiler records; on the CPU it is the wall time.

Every backend is checked byte for byte against the reference before it is
timed; a wrong one is reported as wrong, never timed, and the exit status is
1. The layers are distinct tensors of random bytes (no cache-resident reruns)
and warm-up is excluded.

Default: DeepSeek-V4.1-Flash at TP 1, 43 layers, every kind and backend
available here.
"""

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict

import torch

# Run as a script, only bench/ is on sys.path: the repository root goes first,
# so that the package built in place is the one imported.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashmla_perm  # noqa: E402
from flashmla_perm import reference  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "device"))
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
    p.add_argument(
        "--tp", type=int, nargs="+", default=[1], choices=[1, 2, 4, 8], help="tensor-parallel sizes, e.g. --tp 1 2 4 8"
    )
    p.add_argument("--layers", type=int, default=43, help="layers carrying wq_b/wo_a (40 + 3 MTP)")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--head-dim", type=int, default=512)
    p.add_argument("--q-lora-rank", type=int, default=1280, help="K of wq_b")
    p.add_argument("--o-lora-rank", type=int, default=1024, help="rows of wo_a per group")
    p.add_argument("--group", type=int, default=8, help="heads per wo_a group")
    p.add_argument("--tokens", type=int, default=4096, help="tokens of the permute_q kinds")
    p.add_argument("--weight-dtype", default="float8_e4m3fn")
    p.add_argument("--scale-dtype", default="uint8", help="uint8 or float8_e8m0fnu")
    p.add_argument("--reps", type=int, default=5, help="timed passes over the model")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--devices", default=None, help="default: cpu, and cuda when present")
    p.add_argument(
        "--backends",
        default="reference,native",
        help="besides the copy; for the load kind `reference` is vLLM's permute_on_load; "
        "the in-place weight kinds also take the baselines inplace, outofplace and copy_1buf",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory probes")
    p.add_argument(
        "--kernel-times",
        action="store_true",
        help="after the timed passes, one more pass per backend under torch.profiler: "
        "each kernel's launches, total and mean device time per op (CPU: top-level ops)",
    )
    p.add_argument("--json", metavar="PATH", help="every number, rewritten as each kind finishes")
    p.add_argument("--memory-probe", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = {
        k
        for k in args.kinds.split(",")
        if k.split(":")[0] != "generic" or k not in ("generic", *(f"generic:{c}" for c in GENERIC_CASES))
    } - set(KINDS)
    if unknown:
        p.error(f"unknown kinds {sorted(unknown)} (known: {', '.join(KINDS)})")
    return args


# --------------------------------------------------------------------------- tensors


def shapes(args, kind, tp):
    """(weight shape, scale shape, the op's integer argument) of one rank's shard.
    The packed kinds' scales are int32, one word per 128 weight columns."""
    cols = args.group * args.head_dim
    groups = args.heads // args.group
    groups_here = max(groups // tp, 1)  # below one group per rank, each rank holds one
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
    pad = (rows + 3) // 4 * 4
    storage = torch.zeros((*lead, words, pad), dtype=torch.int32, device=device)
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
#
# A case is what one (device, tp, kind) times: the items of a pass (one per
# layer) and, per backend, a function of one item. `check(backend)` says
# whether the backend gives the reference's bytes, on an item of its own.


@dataclasses.dataclass
class Case:
    items: list
    fns: Dict[str, Callable]  # "copy" first: the baseline
    item_bytes: int  # bytes of one item's tensors; a pass moves 2x that per item, at the least
    check: Callable[[str], bool]
    capturable: frozenset  # backends whose pass a CUDA graph can capture (no sync, no host copy)
    reference: str = "reference"
    note: str = ""  # printed once: where the backends came from


def layer_buffers(layers, device):
    """Per layer, a buffer per tensor of its storage's size: its own, as a
    loader writes each layer into params of its own. Poisoned, so that their
    pages exist before anything is timed."""
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


# Baselines that are not the product (see the docstring): not permutations,
# so not checked against the reference, and no memory probe. copy_1buf is the
# copy into one set of buffers that every layer reuses, as the first device
# run's copy was: on a GPU whose L2 holds much of a layer, the previous
# layer's dirty lines absorb writes that the copy into each layer's own
# buffers (the `copy`) sends to DRAM.
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
    own_buffers = lambda layer: own[id(layer)]  # noqa: E731 (items stay alive with the case)
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
    heads = (Q_KINDS[kind] or args.heads) // tp
    shape = (args.tokens, heads, args.head_dim)
    items = [random_like_bytes(shape, torch.bfloat16, device) for _ in range(min(layers, Q_ITEMS))]
    out = torch.empty_like(items[0])
    ops = {"reference": reference.permute_q_to_fused, "native": flashmla_perm.permute_q_to_fused}

    def check(name):
        q = random_like_bytes(shape, torch.bfloat16, device)
        return same_bytes([ops[name](q)], [reference.permute_q_to_fused(q)])

    fns = {"copy": out.copy_, **{b: ops[b] for b in backends if b in ops}}  # no baselines out of place
    return Case(items, fns, tensors_bytes(items[:1]), check, frozenset({"copy", "native"}))


# --------------------------------------------------------------------------- the load kind
#
# As vLLM's DeepSeek-V4.1 layer does it: each param carries a weight_loader
# (vLLM's default_weight_loader: param.data.copy_(loaded_weight)), wrapped once
# by permute_on_load(param, perm, dim) in the layer's __init__; loading a
# checkpoint tensor calls param.weight_loader(param, loaded_weight).


def plain_loader(param, loaded_weight):
    """vLLM's default_weight_loader, for a machine without vLLM."""
    assert param.size() == loaded_weight.size()
    param.data.copy_(loaded_weight)


def permute_on_load_equivalent(param, perm, dim):
    """vLLM 0.33.0's permute_on_load (composed_weight_loader(loader, gather)),
    for a machine without vLLM."""
    loader = param.weight_loader

    def gather(t):
        return t.view(torch.uint8).index_select(dim, perm.to(t.device)).view(t.dtype)

    def composed_loader(param, loaded_weight):
        loader(param, loaded_weight)
        param.data.copy_(gather(param))

    param.weight_loader = composed_loader


# What importing vLLM 0.33.0 logs at ERROR on a machine without its GPU
# stack (its warnings, the missing vllm._C among them, are dropped by level).
# Loading uses none of that stack: nothing is wrong, but the line reads so.
GPU_STACK_ERRORS = re.compile(r"^Failed to import Triton kernels\b")


@contextlib.contextmanager
def quiet_vllm_import():
    """Keeps what importing vLLM says about its GPU stack out of the output.
    vLLM 0.33.0 reads VLLM_LOGGING_LEVEL only when an engine configures its
    logging, never at import: until then its loggers have no handler, and
    Python prints their warnings and errors bare on sys.stderr. So, during
    the import, vLLM's logger is held at ERROR, and so is the torch logger
    that warns that Triton is missing; sys.stderr goes to a buffer, written
    back without the line above. Everything else still
    shows: other lines, any exception, and what native code writes (a
    crash's report), which never passes through sys.stderr. A user who sets
    VLLM_LOGGING_LEVEL gets vLLM's import exactly as vLLM prints it."""
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


def load_specs(args, tp):
    """(shape, dtype, perm, dim) of a layer's four params, as vLLM's layer wraps them."""
    q_perm = reference.q_fused_permutation(args.heads // tp, args.head_dim)
    o_perm = reference.o_fused_permutation(args.group, args.head_dim)
    o_chunk_perm = reference.o_fused_chunk_permutation(args.group, args.head_dim)
    wq_b, wq_b_scale, _ = shapes(args, "wq_b", tp)
    wo_a, wo_a_scale, _ = shapes(args, "wo_a", tp)
    return [
        (wq_b, args.weight_dtype, q_perm, 0),
        (wq_b_scale, args.scale_dtype, q_perm, 0),
        (wo_a, args.weight_dtype, o_perm, 1),
        (wo_a_scale, args.scale_dtype, o_chunk_perm, 1),
    ]


def load_ways(backends):
    """{backend: permute_on_load to wrap its params with, or None}, the copy
    first, and a note on where they came from. Imports vLLM (seconds) only
    when its way is asked for."""
    loader, ways, notes = plain_loader, {"copy": None}, []
    if "reference" in backends:
        loader, ways["vllm"], source = vllm_loaders()
        notes.append(f"load: vllm = permute_on_load of {source}")
    if "native" in backends:
        if hasattr(flashmla_perm, "permute_on_load"):
            ways["native"] = flashmla_perm.permute_on_load
        else:
            notes.append("load: native skipped: this flashmla_perm has no permute_on_load")
    return loader, ways, "; ".join(notes)


def checkpoint_tensor(shape, dtype, device):
    """Random bytes where a checkpoint tensor is: on CUDA in pinned host
    memory (made on the device: the CPU's generator is slow), else on the CPU."""
    t = random_like_bytes(shape, dtype, device)
    if not device.startswith("cuda"):
        return t
    pinned = torch.empty(shape, dtype=t.dtype, pin_memory=True)
    pinned.copy_(t)
    return pinned


def load_case(args, tp, device, backends, layers):
    """Each layer: its four checkpoint tensors (random bytes; on CUDA in
    pinned host memory) and, per way, four fresh params wrapped once. The
    ways' params share one storage per layer: every load overwrites all of
    it, and three full copies of the model would not fit a small machine."""
    loader, ways, note = load_ways(backends)
    specs = load_specs(args, tp)

    def checkpoint():
        return [checkpoint_tensor(shape, dtype, device) for shape, dtype, _, _ in specs]

    def storage():  # zeros, not empty: the pages exist before any timed load
        return [torch.zeros(shape, dtype=getattr(torch, dtype), device=device) for shape, dtype, _, _ in specs]

    def params(wrap, tensors):
        out = []
        for t, (_, _, perm, dim) in zip(tensors, specs):
            p = torch.nn.Parameter(t, requires_grad=False)  # shares t's storage
            p.weight_loader = loader
            if wrap is not None:
                wrap(p, perm, dim)
            out.append(p)
        return out

    def load(ps, ckpt):
        for p, c in zip(ps, ckpt):
            p.weight_loader(p, c)

    checkpoints = [checkpoint() for _ in range(layers)]
    storages = [storage() for _ in range(layers)]
    fns = {}
    for name, wrap in ways.items():
        per_layer = {i: params(wrap, storages[i]) for i in range(layers)}
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

    return Case(
        list(range(layers)), fns, tensors_bytes(checkpoints[0]), check, frozenset(), reference="vllm", note=note
    )


def generic_case(args, kind, device, backends):
    """permute_ on one large uint8 tensor, a fresh random perm each call
    (native_first: no plan cached, nor anything of the perm) or the same perm
    again (native: its plan found; reference: torch's gather + copy). The
    items are calls on one tensor (tp and --layers do not apply): a pass is
    --reps calls' worth of perms drawn before it is timed."""
    shape, dim = GENERIC_CASES[kind.split(":", 1)[1]]
    t = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    out = torch.empty_like(t)
    n = shape[dim]
    perm = torch.randperm(n, device=device)
    items = [0, 1]
    # Perms never used, drawn before anything is timed: native_first takes
    # one a call (the warm-up call, then each pass's).
    fresh = (
        [torch.randperm(n, device=device) for _ in range(1 + len(items) * args.reps)] if "native" in backends else []
    )

    def first(_):
        flashmla_perm.permute_(t, fresh.pop(), dim)

    ops = {
        "reference": lambda _: t.copy_(t.index_select(dim, perm)),
        "native": lambda _: flashmla_perm.permute_(t, perm, dim),
        "native_first": first,
    }

    def check(name):
        x = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
        p = torch.randperm(n, device=device)
        expected = x.index_select(dim, p)
        flashmla_perm.permute_(x, p, dim)
        ok = torch.equal(x, expected)
        flashmla_perm.permute_(x, p, dim)  # again: through its plan
        return ok and torch.equal(x, expected.index_select(dim, p))

    names = [b for b in backends if b in ops]
    if "native" in names:
        names.append("native_first")
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
    wanted = args.backends.split(",")
    native = flashmla_perm.build_info()["native"]
    return [b for b in wanted if b in ("reference", *BASELINES) or (b == "native" and native)]


# --------------------------------------------------------------------------- timing


def wall_seconds(device, run):
    """Host-inclusive time of run(): from an idle device to an idle device."""
    sync(device)
    t0 = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - t0


def event_seconds(run):
    """Device time of run() on the current stream (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def capture_graph(run):
    """run() captured in a CUDA graph; returns the replay. The warm-up on a
    side stream first is what torch.cuda.graph asks for (lazy init off the
    capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def profile_totals(run, cuda):
    """{name: (count, microseconds)} of one run() under torch.profiler: every
    device activity (kernels, memcpy, memset) on CUDA, the top-level ops on
    the CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
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
            replay = capture_graph(run_pass)
            return (lambda: event_seconds(replay)), "graph"
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
    for name, fn in case.fns.items():  # warm-up: plans, allocator, page faults
        fn(case.items[0])
    sync(device)
    timers = {name: device_timer(device, run, name in case.capturable) for name, run in passes.items()}
    wall = {name: [] for name in passes}
    dev = {name: [] for name in passes}
    for rep in range(args.reps):
        for name, run in passes.items():
            progress(f"{label} pass {rep + 1}/{args.reps}: {name}")
            wall[name].append(wall_seconds(device, run))
            timer, _ = timers[name]
            dev[name].append(timer() if timer else wall[name][-1])
    return {name: (wall[name], dev[name], timers[name][1]) for name in passes}


# --------------------------------------------------------------------------- kernel times


def short_kernel_name(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::|flashmla_perm::|at::native::", "", name)
    return re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", name)  # the parameter list


def kernel_times(case, device, kind, tp, label):
    """One extra pass per backend under torch.profiler, apart from the timed
    passes (whose numbers it does not touch): each device activity by name,
    with its launches, total and mean device time per op call (one call per
    item). On the CPU: the top-level ops, by CPU time."""
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
            rows.append(
                {
                    **key,
                    "kernel": kernel,
                    "time": "device" if cuda else "cpu",
                    "launches": count,
                    "ops": ops,
                    "launches_per_op": count / ops,
                    "total_us_per_op": us / ops,
                    "mean_us": us / count,
                }
            )
    return rows


def print_kernel_times(rows, top=6):
    print()
    print(
        f"kernel times (torch.profiler, one extra pass per backend; per op = per layer call; "
        f"the {top} longest of each, all in --json)"
    )
    head = f"{'device':6} {'kind':14} {'tp':>2} {'backend':9} {'launch/op':>9} {'us/op':>9} {'mean us':>9}  kernel"
    print(head)
    print("-" * len(head))
    shown = {}
    for r in rows:
        key = (r["device"], r["kind"], r["tp"], r["backend"])
        shown[key] = shown.get(key, 0) + 1
        if shown[key] > top:
            continue
        lead = f"{r['device']:6} {r['kind']:14} {r['tp']:2} {r['backend']:9}"
        if "error" in r:
            print(f"{lead} {r['error']}")
            continue
        print(
            f"{lead} {r['launches_per_op']:9.2f} {r['total_us_per_op']:9.1f} {r['mean_us']:9.1f}  "
            f"{short_kernel_name(r['kernel'])}"
        )


# --------------------------------------------------------------------------- memory


def read_hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def memory_probe(spec):
    """Runs in a fresh subprocess: extra peak memory of one call (one layer),
    above the tensors it works on (for `load`: the params and the checkpoint)."""
    args = parse_args(spec["argv"])
    kind, tp, device, backend = spec["kind"], spec["tp"], spec["device"], spec["backend"]
    option = {"copy": [], "vllm": ["reference"]}.get(backend, [backend])  # its --backends name
    case = make_case(args, kind, tp, device, option, layers=2)
    if backend == "native_first":  # the fresh perms come with the native backend
        case = make_case(args, kind, tp, device, ["native"], layers=2)
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
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--memory-probe", spec], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- report


def summarize(args, key, case, times, memory):
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


TABLE_HEAD = (
    f"{'device':6} {'kind':14} {'tp':>2} {'backend':9} {'ms/layer':>9} {'dev ms':>8} {'how':8} "
    f"{'GB/s':>7} {'x copy':>7} {'x c dev':>7} {'vs ref':>7} {'extra mem':>15}"
)


def print_rows(rows):
    for r in rows:
        mem = (
            f"{r['extra_peak_bytes'] / MiB:7.1f} MiB {r['extra_peak_fraction']:4.2f}x"
            if "extra_peak_bytes" in r
            else ""
        )
        vs = f"{r['speedup_vs_reference']:6.1f}x" if "speedup_vs_reference" in r else ""
        print(
            f"{r['device']:6} {r['kind']:14} {r['tp']:2} {r['backend']:9} {r['ms_per_layer']:9.3f} "
            f"{r['device_ms_per_layer']:8.3f} {r['device_time']:8} {r['gbytes_per_s']:7.2f} "
            f"{r['x_copy']:6.2f}x {r['x_copy_device']:6.2f}x {vs:>7} {mem:>15}",
            flush=True,
        )


def print_wrong(key, backend):
    print(
        f"{key['device']:6} {key['kind']:14} {key['tp']:2} {backend:9} "
        f"WRONG: bytes differ from the reference; not timed",
        flush=True,
    )


def write_json(path, doc):
    """The whole document, replaced atomically: a run killed later keeps it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


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
            print_wrong(key, name)
    times = time_case(args, case, device, label)
    if args.kernel_times:
        doc["kernel_times"] += kernel_times(case, device, kind, tp, label)
    memory = (
        {}
        if args.no_memory
        else {b: measure_memory(argv, kind, tp, device, b) for b in case.fns if b not in ("copy", *BASELINES)}
    )
    rows = summarize(args, key, case, times, memory)
    progress(f"{label} done")
    print_rows(rows)
    doc["rows"] += rows


def cpu_name():
    """The CPU's model name (Linux), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        if m:
            return f"{m.group(1).strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    import platform

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
    doc = {
        "args": vars(args),
        "build_info": info,
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "card": None,
        "rows": [],
        "wrong": [],
        "kernel_times": [],
        "notes": [],
    }
    card = record_cuda_card(doc) if "cuda" in devices and torch.cuda.is_available() else None
    print(
        f"cpu: {doc['cpu']}"
        + (
            f"; cuda: {card['name']}, {card['sms']} SMs, {card['peak_tbps']} TB/s peak ({card['source']})"
            if card
            else ""
        )
        + (f"; cuda card not read: {doc['card_error']}" if "card_error" in doc else "")
    )
    print(TABLE_HEAD)
    print("-" * len(TABLE_HEAD), flush=True)
    for device in devices:
        for tp in args.tp:
            for kind in [
                k
                for ks in args.kinds.split(",")
                for k in ([f"generic:{c}" for c in GENERIC_CASES] if ks == "generic" else [ks])
            ]:
                run_kind(args, argv, {"device": device, "kind": kind, "tp": tp}, backends, doc)
                if args.json:
                    write_json(args.json, doc)
    if args.kernel_times:
        print_kernel_times(doc["kernel_times"])
    return 1 if doc["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
