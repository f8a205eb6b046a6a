"""The ops under the CUDA runtime: a non-default stream, eight threads on their
own streams, CUDA graph capture and replay (with the plans evicted from the
cache in between), no host sync once the plans are built, a plan evicted
from the cache while another stream's kernels that use it are still queued,
perm tensors on the device, tensors over 2^31 bytes, every planned launch's
CTAs resident at once.
Bytes against the reference (computed on the CPU), never allclose. Skipped
without a GPU."""

import concurrent.futures
import contextlib
import os
import sys
import threading
import time
import zlib

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import reference as ref

from conftest import INFO, LAUNCH_CASES, assert_same_bytes, expect_path, poison, random_tensor
from flashmla_perm import _ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# What only the native CUDA path promises (the Python fallback copies its
# permutation host-to-device on every call, so it neither captures nor runs
# without a sync).
needs_kernels = pytest.mark.skipif(not INFO["cuda"], reason="needs the native module built with CUDA")

ops = torch.ops.flashmla_perm
FP8 = torch.float8_e4m3fn
TP8_HEADS = 8  # DeepSeek-V4.1: 64 heads / TP 8


def on_cuda_kernels():
    """expect_path("cuda") where the CUDA kernels are built (the calls inside
    must run them), nothing otherwise."""
    return expect_path("cuda") if INFO["cuda"] else contextlib.nullcontext()


_CYCLES_PER_MS = []


def sleep_ms(ms):
    """Queues a kernel that spins for about `ms` milliseconds on the current stream."""
    if not _CYCLES_PER_MS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        end.synchronize()
        _CYCLES_PER_MS.append(20_000_000 / max(start.elapsed_time(end), 1e-3))
    torch.cuda._sleep(int(ms * _CYCLES_PER_MS[0]))


def model_tensors(gen, k=256, wo_rows=64, heads=TP8_HEADS, q_heads=64):
    """CPU tensors: a wq_b shard of `heads` heads (TP8 by default, K reduced) +
    scale, a wo_a shard (a few rows) + scale, Q activations of `q_heads` heads."""
    rows = heads * 512
    return [
        random_tensor((rows, k), FP8, gen=gen),
        random_tensor((rows, k // 32), gen=gen),
        random_tensor((wo_rows, 8 * 512), FP8, gen=gen),
        random_tensor((wo_rows, 8 * 512 // 32), gen=gen),
        random_tensor((4, q_heads, 512), torch.bfloat16, gen=gen),
    ]


def run_model_ops(t, heads=TP8_HEADS, group=8):
    """The three model ops on tensors `t` (as model_tensors lays them out):
    wq_b and wo_a in place; returns the fused Q."""
    fp.permute_wq_b_(t[0], t[1], heads)
    fp.permute_wo_a_(t[2], t[3], group)
    return fp.permute_q_to_fused(t[4])


def expected_model_ops(cpu, times=1, heads=TP8_HEADS, group=8):
    e = [x.clone() for x in cpu]
    for _ in range(times):
        ref.permute_wq_b_(e[0], e[1], heads)
        ref.permute_wo_a_(e[2], e[3], group)
    return e[:4] + [ref.permute_q_to_fused(cpu[4])]


def long_cycle(n, gen):
    order = torch.randperm(n, generator=gen)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def evict_plan_caches():
    """72 new keys of each kind, on the current stream: more than the 64 each
    plan cache holds, so every entry there before is evicted."""
    for h in range(2, 2 + 72):  # row plans: (heads, head_dim 16, forward)
        fp.permute_wq_b_(
            torch.zeros((h * 16, 16), dtype=torch.uint8, device="cuda"),
            torch.zeros((h * 16, 1), dtype=torch.uint8, device="cuda"),
            h,
        )
    for g in range(1, 1 + 72):  # column plans: (O and O chunk, g heads, head_dim 32)
        fp.permute_wo_a_(
            torch.zeros((2, g * 32), dtype=torch.uint8, device="cuda"),
            torch.zeros((2, g), dtype=torch.uint8, device="cuda"),
            g,
        )
    for h in range(1, 1 + 72):  # column plans: (Q, h heads, head_dim 16, bf16)
        fp.permute_q_to_fused(torch.zeros((1, h, 16), dtype=torch.bfloat16, device="cuda"))


def zero_free_small_blocks():
    """Takes 16 MiB of small blocks from the current stream's pool (the
    allocator hands out freed ones first) and zeroes them, so that plan
    arrays freed there and read later give wrong bytes. Zeros: bad indices still read in
    bounds, a late read gives wrong bytes rather than a fault. Returns the
    blocks (keep them until the reads are done)."""
    junk, total, i = [], 0, 0
    while total < 16 * 2**20:
        n = 512 * (1 + i % 64)
        junk.append(torch.zeros(n, dtype=torch.uint8, device="cuda"))
        total, i = total + n, i + 1
    return junk


def warm_up(fn, times=1):
    """Runs fn on a side stream first, as torch's docs ask before a capture."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


# --------------------------------------------------------------------------- streams


def test_ops_run_on_the_current_stream(gen):
    """On a side stream, the inputs are written behind a 50 ms sleep and the
    ops queued after them: an op launched on any other stream would read them
    before they are there."""
    cpu = model_tensors(gen)
    rows_x, rows_perm = random_tensor((3000, 48), gen=gen), long_cycle(3000, gen)
    cols_x, cols_perm = random_tensor((33, 1000), torch.bfloat16, gen=gen), torch.randperm(1000, generator=gen)
    cpu += [rows_x, cols_x]
    expected = expected_model_ops(cpu[:5])
    expected += [rows_x.clone(), cols_x.clone()]
    ref.permute_rows_(expected[5], rows_perm)
    ref.permute_cols_(expected[6], cols_perm)
    srcs = [t.cuda() for t in cpu]
    perms = rows_perm.cuda(), cols_perm.cuda()
    run_model_ops([t.clone() for t in srcs[:5]])  # plans built on the default stream
    torch.cuda.synchronize()

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        dst = [torch.empty_like(t) for t in srcs]
        sleep_ms(50)
        for d, src in zip(dst, srcs):
            d.copy_(src)
        with on_cuda_kernels():
            fq = run_model_ops(dst)
            # The generic ops copy a device perm to the host (a sync), so
            # these two check results on a side stream, not its ordering.
            ops.permute_rows_(dst[5], perms[0])
            ops.permute_cols_(dst[6], perms[1])
    s.synchronize()
    for got, want in zip(dst[:4] + [fq] + dst[5:], expected):
        assert_same_bytes(got, want)


def test_eight_threads_each_on_its_own_stream():
    """Eight threads, each on its own stream, permute distinct tensors (several
    head counts and widths, so plans are built concurrently too); all exact."""
    start = threading.Barrier(8)

    def job(i):
        g = torch.Generator().manual_seed(100 + i)
        heads = [2, 4, 8, 16][i % 4]
        cpu = [
            random_tensor((heads * 512, 64 + 32 * (i % 3)), FP8, gen=g),
            random_tensor((heads * 512, 2 + i % 3), gen=g),
            random_tensor((24 + i, 8 * 128 * (1 + i % 3)), FP8, gen=g),
            random_tensor((24 + i, 32 * (1 + i % 3)), gen=g),
            random_tensor((3, heads * 4, 512), torch.bfloat16, gen=g),
        ]
        e = [t.clone() for t in cpu]
        reps = 3
        for _ in range(reps):
            ref.permute_wq_b_(e[0], e[1], heads)
            ref.permute_wo_a_(e[2], e[3])
        expected = e[:4] + [ref.permute_q_to_fused(cpu[4]), cpu[4]]
        start.wait(timeout=60)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            t = [x.to("cuda") for x in cpu]
            for _ in range(reps):
                fp.permute_wq_b_(t[0], t[1], heads)
                fp.permute_wo_a_(t[2], t[3])
            fused = fp.permute_q_to_fused(t[4])
            back = fp.permute_q_from_fused(fused)
        s.synchronize()
        return t[:4] + [fused, back], expected

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for got, expected in pool.map(job, range(8)):
            for a, b in zip(got, expected):
                assert_same_bytes(a, b)


# --------------------------------------------------------------------------- perm on the device


@pytest.mark.parametrize("perm_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("kind", ["random", "cycle"])
@pytest.mark.parametrize("op", ["rows", "cols", "cols_out"])
def test_perm_tensor_on_the_device(op, kind, perm_dtype, gen):
    n = 3000 if op == "rows" else 1000
    perm = torch.randperm(n, generator=gen) if kind == "random" else long_cycle(n, gen)
    shape, dtype = ((n, 40), FP8) if op == "rows" else ((33, n), torch.bfloat16)
    x = random_tensor(shape, dtype, gen=gen)
    dperm = perm.to(perm_dtype).cuda()
    got = x.cuda()
    if op == "cols_out":
        poison("cuda", x.numel() * x.element_size())
        with on_cuda_kernels():
            out = ops.permute_cols(got, dperm)
        assert_same_bytes(out, ref.permute_cols(x, perm))
        assert_same_bytes(got, x)  # the input is left as it was
        return
    expected = x.clone()
    (ref.permute_rows_ if op == "rows" else ref.permute_cols_)(expected, perm)
    with on_cuda_kernels():
        (ops.permute_rows_ if op == "rows" else ops.permute_cols_)(got, dperm)
    assert_same_bytes(got, expected)


@pytest.mark.parametrize("op", ["rows", "cols"])
def test_bad_perm_on_the_device_raises_and_changes_nothing(op, gen):
    x = random_tensor((64, 64), gen=gen)
    got = x.cuda()
    perm = torch.arange(64)
    perm[5] = 7  # 7 twice, 5 never
    fn = ops.permute_rows_ if op == "rows" else ops.permute_cols_
    with pytest.raises(ValueError, match="more than once"):
        fn(got, perm.cuda())
    assert_same_bytes(got, x)


# --------------------------------------------------------------------------- graphs, syncs


@needs_kernels
@pytest.mark.parametrize("inverse", [False, True])
def test_graph_capture_and_replay_of_permute_q(inverse, gen):
    q = random_tensor((4, 64, 512), torch.bfloat16, "cuda", gen)  # the graph's static input
    ops.permute_q(q, inverse)  # builds the plan, uploads its arrays from the default stream's pool
    warm_up(lambda: ops.permute_q(q, inverse), times=2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.permute_q(q, inverse)
    evict_plan_caches()  # the graph must keep what it reads, cache or no cache
    junk = zero_free_small_blocks()
    for _ in range(2):
        new = random_tensor(q.shape, q.dtype, gen=gen)
        q.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bytes(out, ref.permute_q_from_fused(new) if inverse else ref.permute_q_to_fused(new))
    del junk


@needs_kernels
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("kind", ["wq_b", "wo_a"])
def test_graph_capture_and_replay_of_the_model_ops(kind, inverse, gen):
    cpu = model_tensors(gen)
    w0, s0 = cpu[:2] if kind == "wq_b" else cpu[2:4]
    w, s = w0.cuda(), s0.cuda()
    if kind == "wq_b":

        def fn(w, s, mod):
            (mod.unpermute_wq_b_ if inverse else mod.permute_wq_b_)(w, s, TP8_HEADS)
    else:

        def fn(w, s, mod):
            (mod.unpermute_wo_a_ if inverse else mod.permute_wo_a_)(w, s)

    fn(w, s, fp)  # builds the plans, uploads their arrays from the default stream's pool
    warm_up(lambda: fn(w, s, fp))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(w, s, fp)
    evict_plan_caches()  # the graph must keep what it reads, cache or no cache
    junk = zero_free_small_blocks()
    w.copy_(w0)  # start the replays from known bytes (a capture runs nothing)
    s.copy_(s0)
    ew, es = w0.clone(), s0.clone()
    for _ in range(2):  # each replay applies the op once more
        graph.replay()
        torch.cuda.synchronize()
        fn(ew, es, ref)
        assert_same_bytes(w, ew)
        assert_same_bytes(s, es)
    del junk


@needs_kernels
@pytest.mark.parametrize("perm_on", ["cuda", "cpu"])
def test_a_capture_that_needs_a_blocking_copy_says_so_and_moves_nothing(perm_on, gen):
    """Under capture, what needs a blocking copy raises before any byte moves,
    naming the warm-up: a CUDA perm whose values were never read (a
    device-to-host copy), a plan not yet on the device (its upload). Once the
    op has run outside capture, the same call captures and replays."""
    t = random_tensor((256, 64), torch.bfloat16, "cuda", gen)
    # Values no other call in the process used: the plans are cached by value,
    # so a permutation met before (the other parametrisation draws from the
    # same seed) would already be on the device and capture without a word.
    own = torch.Generator().manual_seed(zlib.crc32(f"refused capture, perm on {perm_on}".encode()))
    perm = torch.randperm(256, generator=own).to(perm_on)
    says = "perm is a CUDA tensor" if perm_on == "cuda" else "plan is not on"
    before = t.clone()
    with pytest.raises(RuntimeError, match=f"{says}.*capturing a CUDA graph.*warm-up"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            ops.permute_(t, perm, 0)
    torch.cuda.synchronize()
    assert_same_bytes(t, before)  # the refused capture moved nothing
    ops.permute_(t, perm, 0)  # the warm-up: values read, plan uploaded
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.permute_(t, perm, 0)
    t.copy_(before)
    graph.replay()
    torch.cuda.synchronize()
    assert_same_bytes(t, before.index_select(0, perm.to(t.device)))


@needs_kernels
def test_an_inference_perm_on_the_device_is_refused_under_capture_even_after_a_warm_up(gen):
    """An inference tensor has no version counter, so the module reads its
    values on every call: under capture that read is refused, warm-up or not."""
    t = random_tensor((256, 64), torch.bfloat16, "cuda", gen)
    with torch.inference_mode():
        perm = torch.randperm(256, generator=gen).cuda()
    ops.permute_(t, perm, 0)  # a warm-up, which does not help here
    before = t.clone()
    with pytest.raises(RuntimeError, match="inference tensor.*capturing a CUDA graph"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            ops.permute_(t, perm, 0)
    torch.cuda.synchronize()
    assert_same_bytes(t, before)


@needs_kernels
def test_no_host_sync_once_the_plans_are_built(gen):
    """After a first call (plans built, index arrays uploaded), the model ops
    neither synchronize through torch (sync debug mode "error") nor wait for
    their stream at all: they return while a 500 ms sleep is still queued
    ahead of them."""
    cpu = model_tensors(gen)
    t = [x.cuda() for x in cpu]
    run_model_ops(t)  # warm-up
    fp.permute_q_from_fused(t[4])
    torch.cuda.synchronize()
    expected = expected_model_ops(cpu, times=2)
    expected_back = ref.permute_q_from_fused(cpu[4])

    sleep_ms(500)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        t0 = time.perf_counter()
        fused = run_model_ops(t)
        back = fp.permute_q_from_fused(t[4])
        host_seconds = time.perf_counter() - t0
        still_queued = not torch.cuda.current_stream().query()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    assert still_queued and host_seconds < 0.25, (
        f"the calls took {host_seconds * 1e3:.0f} ms of host time with a 500 ms sleep queued: they waited for the GPU"
    )
    for got, want in zip(t[:4] + [fused], expected):
        assert_same_bytes(got, want)
    assert_same_bytes(back, expected_back)


# --------------------------------------------------------------------------- over 2^31 bytes

BIG = 2**31 + 2**20  # bytes: offsets past 2^31 are exercised


@pytest.mark.parametrize("kind", ["rows", "cols"])
def test_tensor_over_2_31_bytes_on_cuda(kind):
    """wq_b rows / wo_a columns of a CUDA weight over 2^31 bytes, every chunk
    checked against the closed-form permutation of the pattern it was filled
    with (no reference copy of the whole tensor)."""
    heads = 64
    cols = 65536 if kind == "rows" else 4096
    rows = heads * 528 if kind == "rows" else -(-BIG // cols)  # 2.2e9 bytes either way
    need = rows * cols + rows * (cols // 32)
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * need:
        pytest.skip(f"needs {3 * need / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    column_bytes = torch.randint(0, 256, (cols,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7)).cuda()

    def pattern(r, n):
        """Row r: per-column bytes plus a per-row value (uint8 wrap), its first
        4 bytes replaced by r itself, so that every row differs."""
        t = column_bytes[:n][None, :] + ((r * 131 + (r >> 8)) & 255).to(torch.uint8)[:, None]
        t[:, :4] = r.to(torch.int32)[:, None].view(torch.uint8)
        return t

    w = torch.empty((rows, cols), dtype=torch.uint8, device="cuda")
    s = torch.empty((rows, cols // 32), dtype=torch.uint8, device="cuda")
    assert w.numel() > 2**31
    chunk = max(1, 2**26 // cols)
    spans = [(a, min(a + chunk, rows)) for a in range(0, rows, chunk)]
    for a, b in spans:
        r = torch.arange(a, b, device="cuda")
        w[a:b] = pattern(r, cols)
        s[a:b] = pattern(r, cols // 32)
    try:
        if kind == "rows":
            with on_cuda_kernels():
                fp.permute_wq_b_(w, s, heads)
            perm = fp.q_fused_permutation(heads, rows // heads).cuda()
            for a, b in spans:
                assert torch.equal(w[a:b], pattern(perm[a:b], cols)), f"weight rows {a}:{b}"
                assert torch.equal(s[a:b], pattern(perm[a:b], cols // 32)), f"scale rows {a}:{b}"
        else:
            with on_cuda_kernels():
                fp.permute_wo_a_(w, s)
            perm, chunk_perm = fp.o_fused_permutation().cuda(), fp.o_fused_chunk_permutation().cuda()
            for a, b in spans:
                r = torch.arange(a, b, device="cuda")
                assert torch.equal(w[a:b], pattern(r, cols)[:, perm]), f"weight rows {a}:{b}"
                assert torch.equal(s[a:b], pattern(r, cols // 32)[:, chunk_perm]), f"scale rows {a}:{b}"
    finally:
        del w, s
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- plan cache eviction


@needs_kernels
def test_plan_evicted_while_its_kernels_are_queued(gen):
    """The plans' device arrays are uploaded on the default stream (warm-up),
    then used by kernels queued on s1 behind a 500 ms sleep. From s2, 70+ new
    keys of each kind evict those plans (64 per cache) while s1 still sleeps,
    and the default stream takes back and zeroes whatever small blocks its
    pool has free. s1's results must still be exact: the arrays have to live
    until the kernels that read them are done."""
    # Keys of its own (4 heads, groups of 16, 32 Q heads): the graph tests
    # keep their plans alive for good, and those could not be evicted.
    keys = dict(heads=4, group=16)
    cpu = model_tensors(gen, heads=4, q_heads=32)
    expected = expected_model_ops(cpu, **keys)
    srcs = [t.cuda() for t in cpu]
    run_model_ops([t.clone() for t in srcs], **keys)  # plans built, arrays allocated on the default stream
    torch.cuda.synchronize()

    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s1):
        dst = [torch.empty_like(t) for t in srcs]
        sleep_ms(500)
        for d, src in zip(dst, srcs):
            d.copy_(src)
        fused = run_model_ops(dst, **keys)
    with torch.cuda.stream(s2):
        evict_plan_caches()
    junk = zero_free_small_blocks()  # the default stream's, where the arrays were allocated
    still_queued = not s1.query()
    s1.synchronize()
    torch.cuda.synchronize()
    del junk
    assert still_queued, "s1's sleep ended before the eviction: the calls on s2 waited for the GPU"
    for got, want in zip(dst[:4] + [fused], expected):
        assert_same_bytes(got, want)


# --------------------------------------------------------------------------- launches: one wave


def sweep_plans():
    """The default plan and the device check's sweep plans, as fields."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "device"))
    import check
    import model

    fields = model.PLAN_FIELDS  # the executor's plan environment as gpu_launches' fields
    return [("default", {})] + [(label, {fields[k]: int(v) for k, v in env.items()}) for label, env, _ in check.SWEEP]


@needs_kernels
@pytest.mark.parametrize("label,plan", sweep_plans(), ids=[label for label, _ in sweep_plans()])
def test_every_planned_cta_is_resident_at_once(label, plan):
    """Each launch's CTAs per SM (csrc/launch.cpp ctas_per_sm, from this GPU's
    figures as the executor reads them) is what the CUDA runtime's occupancy
    calculator gives the compiled kernel at that launch's shared memory: a
    grid of SMs x ctas_per_sm then runs as one wave, as the performance model
    and the sweep assume. The kernels ask for the largest shared-memory
    carveout, but that is a hint: where the driver grants less, wo_a's 6 CTAs
    of 33 KiB (198 KiB) would not fit and a sixth of its grid would wait."""
    fields = {**_ops._C.cuda_device_fields(torch.cuda.current_device()), **plan}
    import model  # device/model.py, on sys.path since sweep_plans()

    cases = [(c.op.replace("_h128", ""), c.dims) for c in model.cases()] + LAUNCH_CASES
    checked = set()
    for op, dims in cases:
        for launch in _ops._C.gpu_launches(op, dims, fields):
            key = (launch["kernel"], launch["threads"], launch["smem_bytes"])
            resident = _ops._C.cuda_resident_ctas_per_sm(*key, torch.cuda.current_device())
            assert launch["ctas_per_sm"] == min(resident, fields["max_ctas_per_sm"]), (
                f"{op} {dims} under {label}: planned {launch['ctas_per_sm']} CTAs per SM, the occupancy "
                f"calculator gives {resident} ({launch})"
            )
            checked.add(key)
    # (No model op cuts a cycle, so none plans the save pass: save_heads has
    # no shared memory, and the harness checks the registers' count for all.)
    assert {kernel for kernel, _, _ in checked} == {"rows", "cols"}, checked
