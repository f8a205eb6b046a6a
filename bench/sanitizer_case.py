"""A small case of each kernel kind, checked byte for byte against
flashmla_perm.reference; gpu_check.sh runs it under compute-sanitizer
(memcheck, racecheck) on CUDA, and on the CPU in its dry mode.

    python bench/sanitizer_case.py [cuda|cpu]     (default: cuda when available)

Exit status 0 when every case matches (and, with the native module built for
the device, its native path served the calls), 1 otherwise.
"""

import os
import sys

import torch

# Run as a script, only bench/ is on sys.path: the repository root goes first,
# so that the package built in place is the one imported.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashmla_perm as fp  # noqa: E402
from flashmla_perm import _ops  # noqa: E402
from flashmla_perm import reference as ref  # noqa: E402

ops = torch.ops.flashmla_perm
GEN = torch.Generator().manual_seed(0)


def rand(shape, dtype=torch.uint8, device="cpu"):
    """Random bytes (on the CPU generator, so every device gets the same) as `dtype`."""
    shape = list(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, shape[:-1] + [shape[-1] * esize], dtype=torch.uint8, generator=GEN)
    return raw.view(dtype).to(device)


def same(a, b):
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8).cpu(),
                       b.contiguous().reshape(-1).view(torch.uint8).cpu())


def poison(device, nbytes):
    """Fill memory the allocator is about to hand out: a byte an out-of-place
    kernel forgets to write then shows up."""
    torch.full((nbytes,), 0xA5, dtype=torch.uint8, device=device)


def long_cycle(n):
    order = torch.randperm(n, generator=GEN)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def cases(dev):
    """(name, function returning True when the bytes match the reference)."""

    def wq_b(heads, k, inverse=False):
        def run():
            rows = heads * 512
            w, s = rand((rows, k), torch.float8_e4m3fn, dev), rand((rows, max(1, k // 32)), device=dev)
            ew, es = w.clone(), s.clone()
            ref.permute_wq_b_(ew, es, heads)
            fp.permute_wq_b_(w, s, heads)
            ok = same(w, ew) and same(s, es)
            if inverse:
                ref.unpermute_wq_b_(ew, es, heads)
                fp.unpermute_wq_b_(w, s, heads)
                ok = ok and same(w, ew) and same(s, es)
            return ok
        return run

    def wo_a(rows, group, head_dim, inverse=False):
        def run():
            cols = group * head_dim
            w, s = rand((rows, cols), torch.float8_e4m3fn, dev), rand((rows, cols // 32), device=dev)
            ew, es = w.clone(), s.clone()
            ref.permute_wo_a_(ew, es, group)
            fp.permute_wo_a_(w, s, group)
            ok = same(w, ew) and same(s, es)
            if inverse:
                ref.unpermute_wo_a_(ew, es, group)
                fp.unpermute_wo_a_(w, s, group)
                ok = ok and same(w, ew) and same(s, es)
            return ok
        return run

    def wo_a_misaligned():
        # views at odd byte offsets: narrower moves; bytes around the views must not move
        wb, sb = rand((64 * 512 + 3,), device=dev), rand((64 * 16 + 1,), device=dev)
        ewb, esb = wb.clone(), sb.clone()
        ref.permute_wo_a_(ewb[3:].view(64, 512), esb[1:].view(64, 16), 2)
        fp.permute_wo_a_(wb[3:].view(64, 512), sb[1:].view(64, 16), 2)
        return same(wb, ewb) and same(sb, esb)

    def permute_q(tokens, heads, head_dim):
        def run():
            q = rand((tokens, heads, head_dim), torch.bfloat16, dev)
            poison(dev, q.numel() * 2)
            fused = fp.permute_q_to_fused(q)
            ok = same(fused, ref.permute_q_to_fused(q))
            poison(dev, q.numel() * 2)
            return ok and same(fp.permute_q_from_fused(fused), q)
        return run

    def rows_(shape, perm, perm_dtype, perm_on_device):
        def run():
            x = rand(shape, device=dev)
            e = x.clone()
            ref.permute_rows_(e, perm)
            p = perm.to(perm_dtype)
            ops.permute_rows_(x, p.to(dev) if perm_on_device else p)
            return same(x, e)
        return run

    def cols_(shape, dtype, perm, perm_dtype, perm_on_device):
        def run():
            x = rand(shape, dtype, dev)
            e = x.clone()
            ref.permute_cols_(e, perm)
            p = perm.to(perm_dtype)
            ops.permute_cols_(x, p.to(dev) if perm_on_device else p)
            return same(x, e)
        return run

    def cols(shape, dtype, perm):
        def run():
            x = rand(shape, dtype, dev)
            poison(dev, x.numel() * x.element_size())
            return same(ops.permute_cols(x, perm.to(dev)), ref.permute_cols(x, perm))
        return run

    def strided(dim, dtype):
        """permute_ of a transposed, stepped view at a storage offset (multi-dim lines)."""
        def run():
            base = rand((5 + 6 * 9 * 2 * 7,), dtype, dev)
            e = base.clone()
            view = lambda b: b[5:].view(6, 9 * 2, 7).permute(2, 0, 1)[:, :, ::2]  # [7, 6, 9]
            p = torch.randperm(view(base).shape[dim], generator=GEN)
            ref.permute_(view(e), p, dim)
            fp.permute_(view(base), p, dim)
            return same(base, e)
        return run

    def packed_wv(n_groups, out):
        """3-D wv weight and its packed MN-major int32 scale (bytes across words)."""
        def run():
            w = rand((n_groups, out, 4096), torch.float8_e4m3fn, dev)
            s = rand((n_groups, 32, (out + 3) // 4 * 4), torch.int32, dev).transpose(1, 2)[:, :out]
            ew, es = w.clone(), s.clone()
            fp.permute_wo_a_(w, s, 8)
            ref.permute_wo_a_(ew, es, 8)
            return same(w, ew) and same(s, es)
        return run

    def drop_ins():
        def run():
            w = rand((8 * 64, 512), torch.float8_e4m3fn, dev)
            s = rand((4, 8 * 64), torch.int32, dev).t()  # gran 32, MN-major
            poison(dev, 2 * w.numel())
            got, want = fp.flashmla.permute_q_b_proj((w, s), 8, 64), ref.permute_q_b_proj((w, s), 8, 64)
            return all(same(a, b) for a, b in zip(got, want))
        return run

    return [
        # any layout: the row kernel on a strided dim, the column kernel on rows at multi-dim offsets
        ("permute_ dim 1 of a [7, 6, 9] transposed stepped bf16 view", strided(1, torch.bfloat16)),
        ("permute_ dim 0 of the same view, uint8", strided(0, torch.uint8)),
        # FlashMLA's layouts: packed int32 scales
        ("wo_a 3-D wv [2, 6, 4096] + packed MN-major scale", packed_wv(2, 6)),
        ("permute_q_b_proj 8 heads x 64, packed scale", drop_ins()),
        # row kernel, Q permutation (whole cycles, no scratch): TP8 wq_b rows (K cut to 256
        # to keep racecheck quick), 16-byte moves, and back
        ("wq_b TP8 rows [4096, 256] + scale, forward and inverse", wq_b(8, 256, inverse=True)),
        ("wq_b 4 heads, K=40 (narrow moves)", wq_b(4, 40)),
        # column kernel in place: TP8 wo_a (a few rows), 32-byte runs; scale bytes
        ("wo_a TP8 [24, 4096] + scale, forward and inverse", wo_a(24, 8, 512, inverse=True)),
        ("wo_a views at odd offsets", wo_a_misaligned),
        # column kernel out of place: Q activations, 64 heads
        ("permute_q 64 heads x 512, 3 tokens, to and from fused", permute_q(3, 64, 512)),
        # save-heads + row kernels with scratch: one long cycle, and a random permutation
        ("permute_rows_ one 3000-cycle, int64 perm on the device", rows_((3000, 48), long_cycle(3000), torch.long, True)),
        ("permute_rows_ random perm, CPU int32 perm", rows_((5000, 40), torch.randperm(5000, generator=GEN), torch.int32, False)),
        # column kernel with random permutations
        ("permute_cols_ random perm, uint8 [33, 1000]", cols_((33, 1000), torch.uint8, torch.randperm(1000, generator=GEN), torch.long, True)),
        ("permute_cols_ random perm, bf16 [7, 5, 96], int32 perm", cols_((7, 5, 96), torch.bfloat16, torch.randperm(96, generator=GEN), torch.int32, False)),
        ("permute_cols random perm, float32 [17, 300]", cols((17, 300), torch.float32, torch.randperm(300, generator=GEN))),
    ]


def main(argv):
    device = argv[0] if argv else ("cuda" if torch.cuda.is_available() else "cpu")
    info = fp.build_info()
    print(f"flashmla_perm {info}; torch {torch.__version__}; device {device}")
    before = _ops.path_counts()
    results = []
    for name, run in cases(device):
        try:
            ok = bool(run())
        except Exception as e:  # report every case, then fail
            print(f"  {name}: {type(e).__name__}: {e}")
            ok = False
        results.append(ok)
        print(f"  {'OK   ' if ok else 'WRONG'} {name}")
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    after = _ops.path_counts()
    served = {k: after[k] - before[k] for k in after}
    print(f"calls served by each path: {served}")
    native_here = info["native"] and (info["cuda"] if device.startswith("cuda") else True)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if native_here and served[kind] == 0:
        print(f"no call ran the native {kind} path: the sanitizer checked none of our kernels")
        results.append(False)
    print(f"sanitizer cases on {device}: {sum(results)}/{len(results)} OK"
          + ("" if all(results) else ": WRONG"))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
