"""A small case of each kernel kind, checked byte for byte against
flashmla_perm.reference; the device check runs it under compute-sanitizer
(memcheck, racecheck) on CUDA, and on the CPU in its dry mode.

    python device/sanitizer_case.py [cuda|cpu]     (default: cuda when available)

Exit status 0 when every case matches and the native path served the calls.
"""

import os
import sys

import torch

# The repository root first: the package built in place is the one imported.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashmla_perm as fp  # noqa: E402
from flashmla_perm import _ops  # noqa: E402
from flashmla_perm import reference as ref  # noqa: E402

ops = torch.ops.flashmla_perm
GEN = torch.Generator().manual_seed(0)
F8 = torch.float8_e4m3fn


def rand(shape, dtype=torch.uint8, device="cpu"):
    """Random bytes (from the CPU generator: every device gets the same) as `dtype`."""
    esize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, [*shape[:-1], shape[-1] * esize], dtype=torch.uint8, generator=GEN)
    return raw.view(dtype).to(device)


def same(a, b):
    return torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8).cpu(), b.contiguous().reshape(-1).view(torch.uint8).cpu()
    )


def in_place(ours, theirs, *tensors):
    """ours(*tensors) against theirs(*copies), every tensor's bytes after."""
    copies = [t.clone() for t in tensors]
    ours(*tensors)
    theirs(*copies)
    return all(same(t, c) for t, c in zip(tensors, copies))


def poisoned(dev, nbytes):
    """Fill memory the allocator is about to hand out: a byte an out-of-place kernel forgets shows."""
    torch.full((nbytes,), 0xA5, dtype=torch.uint8, device=dev)


def long_cycle(n):
    order = torch.randperm(n, generator=GEN)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def cases(dev):
    def wq_b(heads, k):
        w, s = rand((heads * 512, k), F8, dev), rand((heads * 512, max(1, k // 32)), device=dev)
        return in_place(
            lambda *t: fp.permute_wq_b_(*t, heads), lambda *t: ref.permute_wq_b_(*t, heads), w, s
        ) and in_place(lambda *t: fp.unpermute_wq_b_(*t, heads), lambda *t: ref.unpermute_wq_b_(*t, heads), w, s)

    def wo_a(rows, group):
        w, s = rand((rows, group * 512), F8, dev), rand((rows, group * 16), device=dev)
        return in_place(
            lambda *t: fp.permute_wo_a_(*t, group), lambda *t: ref.permute_wo_a_(*t, group), w, s
        ) and in_place(lambda *t: fp.unpermute_wo_a_(*t, group), lambda *t: ref.unpermute_wo_a_(*t, group), w, s)

    def wo_a_misaligned():  # views at odd byte offsets; the bytes around them must not move
        wb, sb = rand((64 * 512 + 3,), device=dev), rand((64 * 16 + 1,), device=dev)
        return in_place(
            lambda w, s: fp.permute_wo_a_(w[3:].view(64, 512), s[1:].view(64, 16), 2),
            lambda w, s: ref.permute_wo_a_(w[3:].view(64, 512), s[1:].view(64, 16), 2),
            wb,
            sb,
        )

    def packed_wv():  # 3-D wv weight, packed MN-major int32 scale
        w = rand((2, 6, 4096), F8, dev)
        s = rand((2, 32, 8), torch.int32, dev).transpose(1, 2)[:, :6]
        return in_place(lambda *t: fp.permute_wo_a_(*t, 8), lambda *t: ref.permute_wo_a_(*t, 8), w, s)

    def permute_q():
        q = rand((3, 64, 512), torch.bfloat16, dev)
        poisoned(dev, q.numel() * 2)
        fused = fp.permute_q_to_fused(q)
        poisoned(dev, q.numel() * 2)
        return same(fused, ref.permute_q_to_fused(q)) and same(fp.permute_q_from_fused(fused), q)

    def q_b_proj():
        w, s = rand((8 * 64, 512), F8, dev), rand((4, 8 * 64), torch.int32, dev).t()  # gran 32, MN-major
        poisoned(dev, 2 * w.numel())
        got, want = fp.flashmla.permute_q_b_proj((w, s), 8, 64), ref.permute_q_b_proj((w, s), 8, 64)
        return all(same(a, b) for a, b in zip(got, want))

    def rows(shape, perm, dtype):  # the save-heads pass and row tiles with scratch
        return in_place(
            lambda x: ops.permute_rows_(x, perm.to(dtype).to(dev)),
            lambda x: ref.permute_rows_(x, perm),
            rand(shape, device=dev),
        )

    def cols(shape, dtype, perm):
        x = rand(shape, dtype, dev)
        ok = in_place(lambda t: ops.permute_cols_(t, perm.to(dev)), lambda t: ref.permute_cols_(t, perm), x.clone())
        poisoned(dev, x.numel() * x.element_size())
        return ok and same(ops.permute_cols(x, perm.to(dev)), ref.permute_cols(x, perm))

    def strided(dim, dtype):  # a transposed, stepped view at a storage offset
        view = lambda b: b[5:].view(6, 18, 7).permute(2, 0, 1)[:, :, ::2]  # noqa: E731  [7, 6, 9]
        p = torch.randperm((7, 6, 9)[dim], generator=GEN)
        return in_place(
            lambda b: fp.permute_(view(b), p, dim),
            lambda b: ref.permute_(view(b), p, dim),
            rand((5 + 6 * 18 * 7,), dtype, dev),
        )

    return [
        ("permute_ dim 1 of a transposed stepped bf16 view", lambda: strided(1, torch.bfloat16)),
        ("permute_ dim 0 of the same view, uint8", lambda: strided(0, torch.uint8)),
        ("wq_b TP8 rows [4096, 256] + scale, forward and inverse", lambda: wq_b(8, 256)),
        ("wq_b 4 heads, K=40 (narrow moves)", lambda: wq_b(4, 40)),
        ("wo_a TP8 [24, 4096] + scale, forward and inverse", lambda: wo_a(24, 8)),
        ("wo_a views at odd offsets", wo_a_misaligned),
        ("wo_a 3-D wv + packed MN-major scale", packed_wv),
        ("permute_q_b_proj 8 heads x 64, packed scale", q_b_proj),
        ("permute_q 64 heads x 512, 3 tokens, to and from fused", permute_q),
        ("permute_rows_ one 3000-cycle, int64 perm", lambda: rows((3000, 48), long_cycle(3000), torch.long)),
        (
            "permute_rows_ random perm, int32",
            lambda: rows((5000, 40), torch.randperm(5000, generator=GEN), torch.int32),
        ),
        (
            "permute_cols(_) uint8 [33, 1000]",
            lambda: cols((33, 1000), torch.uint8, torch.randperm(1000, generator=GEN)),
        ),
        (
            "permute_cols(_) bf16 [7, 5, 96]",
            lambda: cols((7, 5, 96), torch.bfloat16, torch.randperm(96, generator=GEN)),
        ),
    ]


def main(argv):
    device = argv[0] if argv else ("cuda" if torch.cuda.is_available() else "cpu")
    info = fp.build_info()
    print(f"flashmla_perm {info}; torch {torch.__version__}; device {device}")
    before, results = _ops.path_counts(), []
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
    kind = "cuda" if device.startswith("cuda") else "cpu"
    served = _ops.path_counts()[kind] - before[kind]
    if info["native"] and (info["cuda"] or kind == "cpu") and served == 0:
        print(f"no call ran the native {kind} path: the sanitizer checked none of our kernels")
        results.append(False)
    print(f"sanitizer cases on {device}: {sum(results)}/{len(results)} OK" + ("" if all(results) else ": WRONG"))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
