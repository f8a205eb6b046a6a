"""A small case of each CUDA kernel, checked against the reference; run under
compute-sanitizer (memcheck, racecheck) by gpu_check.sh."""

import sys

import torch

import flashmla_perm as fp
from flashmla_perm import reference as ref

ops = torch.ops.flashmla_perm


def rand(shape, dtype=torch.uint8):
    return torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda").view(dtype)


def same(a, b):
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def main():
    torch.manual_seed(0)
    ok = True
    # row_kernel (Q permutation: whole cycles, no scratch), 16-byte and 1-byte moves
    for k in (64, 40):
        w, s = rand((4 * 512, k), torch.float8_e4m3fn), rand((4 * 512, max(1, k // 32)))
        ew, es = w.clone(), s.clone()
        ref.permute_wq_b_(ew, es, 4)
        fp.permute_wq_b_(w, s, 4)
        ok &= same(w, ew) and same(s, es)
    # save_heads_kernel + row_kernel with scratch: one long cycle
    x = rand((3000, 48))
    order = torch.randperm(3000)
    perm = torch.empty(3000, dtype=torch.long)
    perm[order] = order.roll(-1)
    e = x.clone()
    ref.permute_rows_(e, perm)
    ops.permute_rows_(x, perm.cuda())
    ok &= same(x, e)
    # col_kernel in place (wo_a weight: 16-byte moves; scale: bytes), at an odd offset too
    w, s = rand((64, 4096), torch.float8_e4m3fn), rand((64, 128))
    ew, es = w.clone(), s.clone()
    ref.permute_wo_a_(ew, es)
    fp.permute_wo_a_(w, s)
    ok &= same(w, ew) and same(s, es)
    wb, sb = rand((64 * 512 + 3,)), rand((64 * 16 + 1,))  # misaligned views: narrower moves
    ewb, esb = wb.clone(), sb.clone()
    ref.permute_wo_a_(ewb[3:].view(64, 512), esb[1:].view(64, 16), 2)
    fp.permute_wo_a_(wb[3:].view(64, 512), sb[1:].view(64, 16), 2)
    ok &= same(wb, ewb) and same(sb, esb)
    # col_kernel out of place (Q activations, bf16)
    q = torch.randn(7, 16, 128, device="cuda").bfloat16()
    ok &= same(fp.permute_q_to_fused(q), ref.permute_q_to_fused(q))
    torch.cuda.synchronize()
    print("sanitizer cases", "OK" if ok else "WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
