"""Bad input: a clear error that names the argument, and every byte of every
tensor involved exactly as it was. Runs on whichever path is loaded (the
native ops, or the Python fallback when the reference is forced)."""

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import flashmla as fm

from conftest import DEVICES, assert_same_bytes, random_tensor

ops = torch.ops.flashmla_perm


def r(*shape, dtype=torch.uint8, device="cpu"):
    return random_tensor(shape, dtype, device)


def wq(rows=256, k=64, srows=None, device="cpu"):
    return r(rows, k, dtype=torch.float8_e4m3fn, device=device), r(srows or rows, k // 32, device=device)


def wo(rows=16, cols=512, scols=None, device="cpu"):
    return r(rows, cols, dtype=torch.float8_e4m3fn, device=device), r(rows, scols or cols // 32, device=device)


def packed_mn_major(rows, words, lead=(), device="cpu"):
    """A DeepGEMM scale: int32 [*lead, rows, words], stride(-2) == 1, rows padded to 4."""
    pad = (rows + 3) // 4 * 4
    return r(*lead, words, pad, dtype=torch.int32, device=device).transpose(-1, -2)[..., :rows, :]


def qb(h_q=4, d_q=32, k=256, words=2, scale=None):
    """permute_q_b_proj inputs (fine unless told otherwise)."""
    rows = h_q * d_q
    return r(rows, k, dtype=torch.float8_e4m3fn), packed_mn_major(rows, words) if scale is None else scale


def wv(n=2, out=6, cols=4096, scale=None):
    """permute_wv_proj inputs for wv_group_size 8, d_o 512 (fine unless told otherwise)."""
    return r(n, out, cols, dtype=torch.float8_e4m3fn), packed_mn_major(
        out, cols // 128, (n,)
    ) if scale is None else scale


def overlapping():
    """Elements that share memory where torch's own check gives up (TOO_HARD)."""
    return r(100).as_strided((4, 4), (3, 2))


def undecided():
    """Seven interleaved dims past the overlap search's budget (csrc/overlap.h)."""
    sizes, strides = zip(*UNDECIDED)
    return r(sum((m - 1) * p for m, p in UNDECIDED) + 1).as_strided(sizes, strides)


UNDECIDED = ((12, 264086), (11, 359980), (7, 188242), (11, 262292), (9, 210145), (4, 1111831), (8, 413239))


qbp = lambda *ws, h_q=4, d_q=32: fm.permute_q_b_proj(ws, h_q, d_q)
wvp = lambda *ws, g=8, d_o=512: fm.permute_wv_proj(ws, g, d_o)


def expanded():
    return r(1, 64).expand(8, 64)


def grad_tensor():
    return torch.randn(64, 32, requires_grad=True)


# (id, make tensors, call, exception, text the message must contain)
CASES = [
    (
        "wq_b heads do not divide rows",
        lambda: wq(),
        lambda w, s: fp.permute_wq_b_(w, s, 3),
        ValueError,
        "num_local_heads",
    ),
    ("wq_b zero heads", lambda: wq(), lambda w, s: fp.permute_wq_b_(w, s, 0), ValueError, "num_local_heads"),
    ("wq_b negative heads", lambda: wq(), lambda w, s: fp.permute_wq_b_(w, s, -2), ValueError, "num_local_heads"),
    (
        "wq_b head_dim not a multiple of 16",
        lambda: wq(rows=8 * 24),
        lambda w, s: fp.permute_wq_b_(w, s, 8),
        ValueError,
        "head_dim",
    ),
    (
        "wq_b scale rows mismatch",
        lambda: wq(srows=128),
        lambda w, s: fp.permute_wq_b_(w, s, 4),
        ValueError,
        "weight_scale",
    ),
    ("wq_b 1-D weight", lambda: (r(256), r(256, 2)), lambda w, s: fp.permute_wq_b_(w, s, 4), ValueError, "weight"),
    ("wq_b 0-D scale", lambda: (r(256, 64), r()), lambda w, s: fp.permute_wq_b_(w, s, 4), ValueError, "weight_scale"),
    (
        "wq_b weight and scale on different devices",
        lambda: (r(256, 64), torch.empty(256, 2, dtype=torch.uint8, device="meta")),
        lambda w, s: fp.permute_wq_b_(w, s, 4),
        ValueError,
        "weight_scale",
    ),
    (
        "wq_b weight requires grad",
        lambda: (grad_tensor(), r(64, 1)),
        lambda w, s: fp.permute_wq_b_(w, s, 4),
        ValueError,
        "weight",
    ),
    (
        "wq_b scale is the weight",
        lambda: (lambda w: (w, w))(r(256, 64)),
        lambda w, s: fp.permute_wq_b_(w, s, 4),
        ValueError,
        "share memory",
    ),
    (
        "wq_b scale inside the weight's bytes",
        lambda: (lambda b: (b[: 256 * 64].view(256, 64), b[64 : 64 + 256 * 2].view(256, 2)))(r(256 * 64)),
        lambda w, s: fp.permute_wq_b_(w, s, 4),
        ValueError,
        "share memory",
    ),
    (
        "wo_a scale overlapping the weight's end",
        lambda: (lambda b: (b[: 4 * 512].view(4, 512), b[4 * 512 - 8 : 4 * 512 + 56].view(4, 16)))(r(4 * 512 + 64)),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        "share memory",
    ),
    (
        "wo_a group does not divide columns",
        lambda: wo(cols=500),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        "heads_per_group",
    ),
    (
        "wo_a head_dim not a multiple of 32",
        lambda: wo(cols=8 * 48, scols=12),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        "head_dim",
    ),
    ("wo_a zero group", lambda: wo(), lambda w, s: fp.permute_wo_a_(w, s, 0), ValueError, "heads_per_group"),
    (
        "wo_a scale width mismatch",
        lambda: wo(scols=15),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        "weight_scale",
    ),
    (
        "wo_a scale rows mismatch",
        lambda: (r(16, 512), r(8, 16)),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        "weight_scale",
    ),
    ("wo_a 1-D weight", lambda: (r(512), r(16)), lambda w, s: fp.permute_wo_a_(w, s, 8), ValueError, "weight"),
    (
        "wo_a expanded weight",
        lambda: (expanded(), r(8, 2)),
        lambda w, s: fp.permute_wo_a_(w, s, 2),
        ValueError,
        "overlapping",
    ),
    ("q not 3-D", lambda: (r(4, 512, dtype=torch.bfloat16),), lambda q: fp.permute_q_to_fused(q), ValueError, "q"),
    (
        "q head_dim not a multiple of 16",
        lambda: (r(2, 4, 40, dtype=torch.bfloat16),),
        lambda q: fp.permute_q_to_fused(q),
        ValueError,
        "head_dim",
    ),
    ("perm too short", lambda: (r(64, 8),), lambda x: ops.permute_rows_(x, torch.randperm(63)), ValueError, "perm"),
    ("perm too long", lambda: (r(8, 64),), lambda x: ops.permute_cols_(x, torch.randperm(65)), ValueError, "perm"),
    (
        "perm duplicate index",
        lambda: (r(64, 8),),
        lambda x: ops.permute_rows_(x, torch.cat([torch.arange(63), torch.tensor([5])])),
        ValueError,
        "more than once",
    ),
    (
        "perm index out of range",
        lambda: (r(64, 8),),
        lambda x: ops.permute_rows_(x, torch.cat([torch.arange(63), torch.tensor([64])])),
        ValueError,
        "out of range",
    ),
    (
        "perm negative index",
        lambda: (r(8, 64),),
        lambda x: ops.permute_cols_(x, torch.cat([torch.tensor([-1]), torch.arange(1, 64)])),
        ValueError,
        "out of range",
    ),
    (
        "perm float dtype",
        lambda: (r(64, 8),),
        lambda x: ops.permute_rows_(x, torch.randperm(64).float()),
        TypeError,
        "perm",
    ),
    (
        "perm bool dtype",
        lambda: (r(8, 64),),
        lambda x: ops.permute_cols(x, torch.ones(64, dtype=torch.bool)),
        TypeError,
        "perm",
    ),
    (
        "perm 2-D",
        lambda: (r(64, 8),),
        lambda x: ops.permute_rows_(x, torch.randperm(64).view(8, 8)),
        ValueError,
        "perm",
    ),
    (
        "perm on another device",
        lambda: (r(64, 8),),
        lambda x: ops.permute_rows_(x, torch.empty(64, dtype=torch.long, device="meta")),
        ValueError,
        "perm",
    ),
    (
        "permute_rows_ of a 0-D tensor",
        lambda: (r(),),
        lambda x: ops.permute_rows_(x, torch.zeros(1, dtype=torch.long)),
        ValueError,
        "self",
    ),
    (
        "permute_rows_ of an expanded tensor",
        lambda: (expanded(),),
        lambda x: ops.permute_rows_(x, torch.randperm(8)),
        ValueError,
        "overlapping",
    ),
    # permute_: any dim, any layout; the same argument checks
    (
        "permute_ dim out of range",
        lambda: (r(4, 5),),
        lambda x: ops.permute_(x, torch.randperm(4), 2),
        ValueError,
        r"dim \(2\) is out of range for a 2-D self \(expected -2 to 1\)",
    ),
    (
        "permute_ negative dim out of range",
        lambda: (r(4, 5, 6),),
        lambda x: fp.permute_(x, torch.randperm(4), -4),
        ValueError,
        r"dim \(-4\) is out of range for a 3-D self \(expected -3 to 2\)",
    ),
    (
        "permute_ dim out of range on meta",
        lambda: (torch.empty(4, 5, device="meta"),),
        lambda x: ops.permute_(x, torch.randperm(4), -3),
        ValueError,
        "out of range",
    ),
    (
        "permute_ of a 0-D tensor",
        lambda: (r(),),
        lambda x: ops.permute_(x, torch.zeros(1, dtype=torch.long)),
        ValueError,
        "at least 1 dimension",
    ),
    (
        "permute_ perm of another dim's length",
        lambda: (r(4, 5).t(),),
        lambda x: fp.permute_(x, torch.randperm(4), 0),
        ValueError,
        "perm has 4 entries",
    ),
    (
        "permute_ perm not a permutation",
        lambda: (r(3, 8)[:, ::2],),
        lambda x: fp.permute_(x, torch.tensor([0, 1, 1, 2]), 1),
        ValueError,
        "more than once",
    ),
    (
        "permute_ perm float",
        lambda: (r(3, 8),),
        lambda x: fp.permute_(x, torch.randperm(8).float(), -1),
        TypeError,
        "perm",
    ),
    (
        "permute_ of an expanded tensor",
        lambda: (expanded(),),
        lambda x: fp.permute_(x, torch.randperm(64), 1),
        ValueError,
        "overlapping",
    ),
    (
        "permute_ of overlapping strides",
        lambda: (overlapping(),),
        lambda x: fp.permute_(x, torch.randperm(4), 1),
        ValueError,
        "overlapping",
    ),
    (
        "permute_ of a zero stride",
        lambda: (r(20).as_strided((4, 5), (0, 1)),),
        lambda x: fp.permute_(x, torch.randperm(5), 1),
        ValueError,
        "overlapping",
    ),
    (
        "permute_rows_ of overlapping strides",
        lambda: (overlapping(),),
        lambda x: ops.permute_rows_(x, torch.randperm(4)),
        ValueError,
        "overlapping",
    ),
    (
        "permute_ requiring grad",
        lambda: (grad_tensor(),),
        lambda x: fp.permute_(x, torch.randperm(64)),
        ValueError,
        "requires grad",
    ),
    # wo_a: 2-D or 3-D weight; the scale one element per 32 columns or, int32, one word per 128
    (
        "wo_a 4-D weight",
        lambda: (r(2, 2, 4, 512), r(2, 2, 4, 16)),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        r"weight must be 2-D or 3-D, got shape \[2, 2, 4, 512\]",
    ),
    (
        "wo_a scale rank differs",
        lambda: (r(2, 4, 512), r(8, 16)),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        r"weight_scale must be 3-D like weight, got shape \[8, 16\]",
    ),
    (
        "wo_a 3-D scale leading dims differ",
        lambda: (r(2, 4, 512), r(4, 2, 16)),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        r"weight_scale must have shape \[2, 4, 16\] \(one scale per 32 columns of weight\) or, int32, \[2, 4, 4\] \(four packed scales per word\), got \[4, 2, 16\]",
    ),
    (
        "wo_a packed scale of the wrong size",
        lambda: (r(16, 512), r(16, 3, dtype=torch.int32)),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        r"or, int32, \[16, 4\]",
    ),
    (
        "wo_a cols/128 scale not int32",
        lambda: (r(16, 512), r(16, 4)),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        r"weight_scale must have shape \[16, 16\]",
    ),
    (
        "wo_a cols/128 scale float32",
        lambda: (r(3, 16, 1024), r(3, 16, 8, dtype=torch.float32)),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        "weight_scale",
    ),
    (
        "wo_a packed scale needs cols % 128",
        lambda: (r(16, 96), torch.empty(16, 0, dtype=torch.int32)),
        lambda w, s: fp.permute_wo_a_(w, s, 3),
        ValueError,
        "weight_scale",
    ),
    (
        "wo_a 3-D head_dim not a multiple of 32",
        lambda: (r(2, 4, 8 * 48), r(2, 4, 12)),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        r"weight.size\(2\) / heads_per_group = 48",
    ),
    (
        "wo_a overlapping scale",
        lambda: (r(4, 512), r(64).as_strided((4, 16), (3, 2))),
        lambda w, s: fp.permute_wo_a_(w, s, 8),
        ValueError,
        "weight_scale has overlapping",
    ),
    (
        "wq_b overlapping weight",
        lambda: (r(400).as_strided((256, 64), (1, 2)), r(256, 2)),
        lambda w, s: fp.permute_wq_b_(w, s, 4),
        ValueError,
        "weight has overlapping",
    ),
    (
        "permute_ of strides the overlap search cannot decide",
        lambda: (undecided(),),
        lambda x: fp.permute_(x, torch.randperm(12), 0),
        ValueError,
        "cannot be proven apart",
    ),
    # permute_q_b_proj
    (
        "q_b_proj h_q * d_q overflows",
        lambda: qb(),
        lambda w, s: qbp(w, s, h_q=2**62, d_q=16),
        ValueError,
        r"weight has 128 rows but h_q \* d_q = ",
    ),
    (
        "q_b_proj one tensor",
        lambda: qb()[:1],
        lambda w: qbp(w),
        ValueError,
        r"weight_and_scale must be \(weight, scale\), got 1 tensors",
    ),
    ("q_b_proj three tensors", lambda: qb() + (r(4),), lambda *t: qbp(*t), ValueError, "got 3 tensors"),
    (
        "q_b_proj 3-D weight",
        lambda: (r(2, 64, 256, dtype=torch.float8_e4m3fn), packed_mn_major(128, 2)),
        qbp,
        ValueError,
        "weight must be 2-D",
    ),
    (
        "q_b_proj weight not fp8",
        lambda: (r(128, 256, dtype=torch.bfloat16), packed_mn_major(128, 2)),
        qbp,
        TypeError,
        r"weight must be float8_e4m3fn, got (torch.bfloat16|BFloat16)",
    ),
    ("q_b_proj zero h_q", lambda: qb(), lambda w, s: qbp(w, s, h_q=0), ValueError, "h_q must be positive"),
    ("q_b_proj negative d_q", lambda: qb(), lambda w, s: qbp(w, s, d_q=-32), ValueError, "d_q must be positive"),
    (
        "q_b_proj d_q not a multiple of 16",
        lambda: qb(h_q=4, d_q=40),
        lambda w, s: qbp(w, s, d_q=40),
        ValueError,
        r"d_q \(40\) must be a multiple of 16",
    ),
    (
        "q_b_proj rows differ from h_q * d_q",
        lambda: qb(),
        lambda w, s: qbp(w, s, h_q=8),
        ValueError,
        r"weight has 128 rows but h_q \* d_q = 256",
    ),
    (
        "q_b_proj scale uint8",
        lambda: qb(scale=r(128, 8)),
        qbp,
        TypeError,
        r"scale must be int32 \(packed ue8m0\), got (torch.uint8|Byte)",
    ),
    ("q_b_proj scale 1-D", lambda: qb(scale=r(128, dtype=torch.int32)), qbp, ValueError, "scale must be 2-D"),
    (
        "q_b_proj scale rows differ",
        lambda: qb(scale=packed_mn_major(64, 2)),
        qbp,
        ValueError,
        "scale has 64 rows but weight has 128",
    ),
    (
        "q_b_proj gran 64",
        lambda: qb(k=256, words=1),
        qbp,
        ValueError,
        r"scale has 1 words per row, so gran = K / \(4 \* W\) = 64 must be 32 or 128 \(K = 256\)",
    ),
    ("q_b_proj gran 16", lambda: qb(k=256, words=4), qbp, ValueError, "= 16 must be 32 or 128"),
    (
        "q_b_proj gran not whole",
        lambda: qb(k=256, words=3),
        qbp,
        ValueError,
        r"scale has 3 words per row, so gran = K / \(4 \* W\) must be 32 or 128 \(K = 256\)",
    ),
    (
        "q_b_proj no words",
        lambda: qb(scale=torch.empty(128, 0, dtype=torch.int32)),
        qbp,
        ValueError,
        "must be 32 or 128",
    ),
    (
        "q_b_proj scale row-major",
        lambda: qb(scale=r(128, 2, dtype=torch.int32)),
        qbp,
        ValueError,
        r"scale must be MN-major \(stride\(0\) == 1\), got strides \[2, 1\]",
    ),
    (
        "q_b_proj weight columns strided",
        lambda: (r(128, 512, dtype=torch.float8_e4m3fn)[:, ::2], packed_mn_major(128, 2)),
        qbp,
        ValueError,
        r"weight must have a contiguous last dimension \(stride\(-1\) == 1\), got strides \[512, 2\]",
    ),
    (
        "wv_proj weight columns strided",
        lambda: (r(2, 6, 8192, dtype=torch.float8_e4m3fn)[..., ::2], packed_mn_major(6, 32, (2,))),
        wvp,
        ValueError,
        r"weight must have a contiguous last dimension",
    ),
    (
        "wv_proj one row, scale not MN-major",
        lambda: (r(2, 1, 4096, dtype=torch.float8_e4m3fn), r(2, 1, 32, dtype=torch.int32)),
        wvp,
        ValueError,
        r"scale must be MN-major \(stride\(1\) == 1\), got strides \[32, 32, 1\]",
    ),
    (
        "q_b_proj scale on another device",
        lambda: qb(scale=torch.empty_strided((128, 2), (1, 128), dtype=torch.int32, device="meta")),
        qbp,
        ValueError,
        "scale is on meta but weight is on cpu",
    ),
    # permute_wv_proj
    ("wv_proj one tensor", lambda: wv()[:1], lambda w: wvp(w), ValueError, "got 1 tensors"),
    (
        "wv_proj 2-D weight",
        lambda: (r(6, 4096, dtype=torch.float8_e4m3fn), packed_mn_major(6, 32)),
        wvp,
        ValueError,
        "weight must be 3-D",
    ),
    (
        "wv_proj weight uint8",
        lambda: (r(2, 6, 4096), packed_mn_major(6, 32, (2,))),
        wvp,
        TypeError,
        r"weight must be float8_e4m3fn, got (torch.uint8|Byte)",
    ),
    ("wv_proj zero group", lambda: wv(), lambda w, s: wvp(w, s, g=0), ValueError, "wv_group_size must be positive"),
    ("wv_proj zero d_o", lambda: wv(), lambda w, s: wvp(w, s, d_o=0), ValueError, "d_o must be positive"),
    (
        "wv_proj d_o not a multiple of 32",
        lambda: wv(cols=8 * 48),
        lambda w, s: wvp(w, s, d_o=48),
        ValueError,
        r"d_o \(48\) must be a multiple of 32",
    ),
    (
        "wv_proj wv_group_size * d_o overflows",
        lambda: wv(),
        lambda w, s: wvp(w, s, g=2**62),
        ValueError,
        r"weight.size\(2\) \(4096\) must be wv_group_size \* d_o = ",
    ),
    (
        "wv_proj columns differ",
        lambda: wv(cols=2048),
        wvp,
        ValueError,
        r"weight.size\(2\) \(2048\) must be wv_group_size \* d_o = 4096",
    ),
    (
        "wv_proj columns not a multiple of 128",
        lambda: wv(cols=96, scale=r(2, 6, 1, dtype=torch.int32)),
        lambda w, s: wvp(w, s, g=1, d_o=96),
        ValueError,
        r"wv_group_size \* d_o \(96\) must be a multiple of 128",
    ),
    ("wv_proj scale uint8", lambda: wv(scale=r(2, 6, 128)), wvp, TypeError, "scale must be int32"),
    ("wv_proj scale 2-D", lambda: wv(scale=packed_mn_major(6, 32)), wvp, ValueError, "scale must be 3-D"),
    (
        "wv_proj scale per-32",
        lambda: wv(scale=packed_mn_major(6, 128, (2,))),
        wvp,
        ValueError,
        r"scale must have shape \[2, 6, 32\], got \[2, 6, 128\]",
    ),
    (
        "wv_proj scale groups differ",
        lambda: wv(scale=packed_mn_major(6, 32, (1,))),
        wvp,
        ValueError,
        r"scale must have shape \[2, 6, 32\], got \[1, 6, 32\]",
    ),
    (
        "wv_proj scale not MN-major",
        lambda: wv(scale=r(2, 6, 32, dtype=torch.int32)),
        wvp,
        ValueError,
        r"scale must be MN-major \(stride\(1\) == 1\), got strides \[192, 32, 1\]",
    ),
    (
        "wv_proj scale on another device",
        lambda: wv(scale=torch.empty_strided((2, 6, 32), (256, 1, 8), dtype=torch.int32, device="meta")),
        wvp,
        ValueError,
        "scale is on meta",
    ),
    (
        "permute_cols_ of a tensor requiring grad",
        lambda: (grad_tensor(),),
        lambda x: ops.permute_cols_(x, torch.randperm(32)),
        ValueError,
        "requires grad",
    ),
    (
        "permute_ perm None",
        lambda: (r(8, 4),),
        lambda x: ops.permute_(x, None, 0),
        ValueError,
        "perm is an undefined tensor",
    ),
]


def sparse(t):
    return t.to_sparse()


# Sparse tensors have no element bytes to move: refused by name, unchanged.
SPARSE_CASES = [
    ("permute_ self", lambda: (sparse(r(8, 4)), torch.randperm(8)), lambda x, p: ops.permute_(x, p, 0), "self"),
    ("permute_cols self", lambda: (sparse(r(8, 4)), torch.randperm(4)), lambda x, p: ops.permute_cols(x, p), "self"),
    ("permute_ perm", lambda: (r(8, 4), sparse(torch.randperm(8))), lambda x, p: ops.permute_(x, p, 0), "perm"),
    ("wq_b scale", lambda: (r(256, 64), sparse(r(256, 2))), lambda w, s: fp.permute_wq_b_(w, s, 4), "weight_scale"),
    ("permute_q q", lambda: (sparse(r(2, 4, 32, dtype=torch.bfloat16)),), lambda q: fp.permute_q_to_fused(q), "q"),
]


@pytest.mark.parametrize("case", SPARSE_CASES, ids=[c[0] for c in SPARSE_CASES])
def test_sparse_tensors_are_refused_by_name(case):
    _, make, call, name = case
    tensors = make()
    before = [t.to_dense().clone() for t in tensors]
    with pytest.raises(ValueError, match=f"{name} must be a dense \\(strided\\) tensor"):
        call(*tensors)
    for t, b in zip(tensors, before):
        assert_same_bytes(t.to_dense(), b)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_and_changes_nothing(case):
    _, make, call, exc, text = case
    tensors = make()
    before = [t.detach().clone() for t in tensors]
    with pytest.raises(exc, match=text):
        call(*tensors)
    for t, b in zip(tensors, before):
        if t.device.type != "meta":
            assert_same_bytes(t.detach(), b)


@pytest.mark.parametrize("device", DEVICES)
def test_model_errors_leave_both_tensors_untouched(device):
    """The second tensor's check fails: the first must not have moved."""
    w, s = wq(device=device)
    s = s[:128]
    w0, s0 = w.clone(), s.clone()
    with pytest.raises(ValueError, match="weight_scale"):
        fp.permute_wq_b_(w, s, 4)
    assert_same_bytes(w, w0)
    assert_same_bytes(s, s0)


def test_grad_is_fine_under_no_grad():
    w = torch.randn(256, 64, requires_grad=True)
    s = r(256, 2)
    expected = w.detach().clone()
    fp.reference.permute_rows_(expected, fp.q_fused_permutation(4, 64))
    with torch.no_grad():
        fp.permute_wq_b_(w, s, 4)
    assert_same_bytes(w.detach(), expected)
