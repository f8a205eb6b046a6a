"""Any layout in place: ``permute_`` on any dim of any non-overlapping view
(transposed, permuted dims, stepped slices, storage offsets, padded rows,
rank 1-5, every dtype), and the model ops on FlashMLA's packed layouts
(DeepGEMM's MN-major int32 scales, 3-D ``wo_a`` weights), byte for byte
against the reference, with the storage around every view left as it was."""

import math

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import reference as ref

from conftest import DEVICES, DTYPES, assert_same_bytes, expect_native_if_moves, expect_path, random_tensor

ops = torch.ops.flashmla_perm
FP8 = torch.float8_e4m3fn


# --------------------------------------------------------------------------- views


def _stepped(shape):
    """Dim i sliced as start::step with (start, step) = (0, 2) or (1, 3):
    ``t[::2, 1::3, ::2, ...]``. Returns the full sizes and the slices."""
    full, slices = [], []
    for i, s in enumerate(shape):
        start, step = (0, 2) if i % 2 == 0 else (1, 3)
        full.append(start + step * (s - 1) + 1 + i % 2)
        slices.append(slice(start, start + step * (s - 1) + 1, step))
    return full, tuple(slices)


def layout(shape, kind):
    """(number of base elements, f): f(base 1-D contiguous) is a view of `shape`."""
    shape, r = list(shape), len(shape)
    n = math.prod(shape)
    if kind == "contiguous":
        return n, lambda b: b.view(shape)
    if kind == "offset":
        return n + 18, lambda b: b[13 : 13 + n].view(shape)
    if kind == "padded":  # rows wider than the view: a column slice
        phys = shape[:-1] + [shape[-1] + 3]
        return math.prod(phys), lambda b: b.view(phys)[..., 1 : 1 + shape[-1]]
    if kind == "transposed":  # every dim reversed (t.t() at rank 2)
        rev = list(range(r))[::-1]
        return n, lambda b: b.view([shape[d] for d in rev]).permute(rev)
    if kind == "rolled":  # dims stored in the order (r-1, 0, 1, ..., r-2)
        order = [r - 1] + list(range(r - 1))
        inv = [order.index(d) for d in range(r)]
        return n, lambda b: b.view([shape[d] for d in order]).permute(inv)
    if kind == "stepped":
        full, slices = _stepped(shape)
        return math.prod(full), lambda b: b.view(full)[slices]
    if kind == "mixed":  # offset storage, dims reversed, stepped slices
        full, slices = _stepped(shape)
        rev = list(range(r))[::-1]
        m = math.prod(full)
        return m + 11, lambda b: b[7 : 7 + m].view([full[d] for d in rev]).permute(rev)[slices]
    raise ValueError(kind)


LAYOUTS = ["contiguous", "offset", "padded", "transposed", "rolled", "stepped", "mixed"]
SHAPES = {1: (37,), 2: (12, 10), 3: (5, 6, 7), 4: (3, 4, 2, 5), 5: (2, 3, 4, 2, 3)}


def bits(t):
    """Same-size integer view of t's elements, for exact comparisons."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def covered(n, f, device):
    """Boolean mask over the n base elements: those the view f(base) reaches."""
    mask = torch.zeros(n, dtype=torch.bool)
    mask[f(torch.arange(n)).reshape(-1)] = True
    return mask.to(device)


def assert_outside_unchanged(base, before, mask):
    outside = ~mask
    assert torch.equal(bits(base)[outside], bits(before)[outside]), "bytes outside the view moved"


def one_cycle(n, gen):
    order = torch.randperm(n, generator=gen)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


PERMS = {
    "random": lambda n, g: torch.randperm(n, generator=g),
    "reverse": lambda n, g: torch.arange(n - 1, -1, -1),
    "cycle": one_cycle,
    "int32": lambda n, g: torch.randperm(n, generator=g).to(torch.int32),
}


def check_permute_(base, f, perm, dim, device, call=None):
    """The op on f(base) against the reference on f(copy of base): the whole
    base compared, and everything outside the view checked to be as it was."""
    before = base.clone()
    expected = base.clone()
    ref.permute_(f(expected), perm.long(), dim)
    with expect_native_if_moves(device, perm):
        (call or fp.permute_)(f(base), perm, dim)
    assert_same_bytes(base, expected)
    assert_outside_unchanged(base, before, covered(base.numel(), f, device))


# --------------------------------------------------------------------------- permute_


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("rank", sorted(SHAPES))
def test_permute_any_dim_any_layout(device, rank, kind, dtype, gen):
    shape = SHAPES[rank]
    n, f = layout(shape, kind)
    base = random_tensor((n,), dtype, device, gen)
    for dim in range(-rank, rank):
        for make in PERMS.values():
            check_permute_(base, f, make(shape[dim], gen), dim, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "shape,kind,dims",
    [
        ((64, 1280), "transposed", (0, 1)),  # wq_b-sized rows, stored transposed
        ((4096, 40), "stepped", (0, -1)),  # DeepGEMM-like scale rows, stepped
        ((33, 17, 129), "rolled", (0, 1, 2)),  # odd extents, dims stored rolled
        ((8, 16, 512), "mixed", (-1, 1)),  # wo_a-like columns of a strided 3-D view
        ((3, 5000), "padded", (-1,)),  # long rows with padding
    ],
)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.int64])
def test_permute_larger_views(device, shape, kind, dims, dtype, gen):
    n, f = layout(shape, kind)
    base = random_tensor((n,), dtype, device, gen)
    for dim in dims:
        check_permute_(base, f, torch.randperm(shape[dim], generator=gen), dim, device)
        check_permute_(base, f, one_cycle(shape[dim], gen), dim, device, call=ops.permute_)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["contiguous", "transposed", "stepped", "mixed"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_rows_and_cols_are_permute_on_dims_0_and_minus_1(device, rank, kind, gen):
    shape = SHAPES[rank]
    n, f = layout(shape, kind)
    base = random_tensor((n,), torch.float8_e5m2, device, gen)
    for op, dim in ((ops.permute_rows_, 0), (ops.permute_cols_, -1)):
        perm = torch.randperm(shape[dim], generator=gen)
        a, b = base.clone(), base.clone()
        with expect_path(device):
            op(f(a), perm)
            fp.permute_(f(b), perm, dim)
        assert_same_bytes(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32])
def test_permute_then_inverse_is_identity(device, kind, dtype, gen):
    shape = SHAPES[4]
    n, f = layout(shape, kind)
    base = random_tensor((n,), dtype, device, gen)
    original = base.clone()
    for dim in range(-4, 4):
        perm = torch.randperm(shape[dim], generator=gen)
        if shape[dim] > 1:
            perm = one_cycle(shape[dim], gen)  # moves every index
        fp.permute_(f(base), perm, dim)
        assert not torch.equal(bits(base), bits(original))
        fp.permute_(f(base), fp.inverse_permutation(perm), dim)
        assert_same_bytes(base, original)


@pytest.mark.parametrize("device", DEVICES)
def test_permute_zero_size_and_size_one(device, gen):
    x = torch.empty((0, 16), dtype=torch.uint8, device=device)
    fp.permute_(x, torch.empty(0, dtype=torch.long), 0)
    fp.permute_(x, torch.randperm(16), 1)
    y = torch.empty((5, 0, 3), dtype=torch.uint8, device=device)
    fp.permute_(y, torch.randperm(5), 0)
    # zero-size with a zero stride (no elements, so nothing overlaps): a no-op too
    w = torch.empty(8, dtype=torch.uint8, device=device).as_strided((2, 0), (0, 1))
    fp.permute_(w, torch.tensor([1, 0]), 0)
    ops.permute_rows_(w, torch.tensor([1, 0]))
    z = random_tensor((1, 7, 1), torch.bfloat16, device, gen)
    z0 = z.clone()
    fp.permute_(z, torch.zeros(1, dtype=torch.long), -1)
    fp.permute_(z, torch.zeros(1, dtype=torch.long), 0)
    assert_same_bytes(z, z0)
    perm = torch.randperm(7, generator=gen)
    e = z.clone()
    ref.permute_(e, perm, 1)
    fp.permute_(z, perm, 1)
    assert_same_bytes(z, e)


@pytest.mark.parametrize("device", DEVICES)
def test_permute_opcheck_and_meta(device, gen):
    x = random_tensor((12, 10, 6), torch.uint8, device, gen)
    for dim in (0, 1, -1):
        torch.library.opcheck(ops.permute_.default, (x.clone(), torch.randperm(x.shape[dim], generator=gen), dim))
    torch.library.opcheck(ops.permute_.default, (x.clone().transpose(0, 2), torch.randperm(6), 0))
    m = torch.empty((8, 4), dtype=torch.bfloat16, device="meta").t()
    fp.permute_(m, torch.randperm(4), 0)
    with pytest.raises(ValueError, match="out of range"):
        fp.permute_(m, torch.randperm(4), 2)


# --------------------------------------------------------------------------- packed scales


def test_pack_and_unpack_follow_the_layout(gen):
    """Byte j of word w is K-block 4w + j: on this little-endian machine, the
    words' own bytes. Any strides in, contiguous out."""
    b = random_tensor((5, 3, 24), torch.uint8, gen=gen)
    words = ref.pack_ue8m0(b)
    assert words.dtype == torch.int32 and words.shape == (5, 3, 6) and words.is_contiguous()
    assert torch.equal(words, b.view(torch.int32))
    assert torch.equal(ref.unpack_ue8m0(words), b)
    assert torch.equal(ref.unpack_ue8m0(words.transpose(0, 1)), b.transpose(0, 1))
    assert int(ref.pack_ue8m0(torch.tensor([[1, 2, 3, 0x80]], dtype=torch.uint8))[0, 0]) == 0x80030201 - 2**32


@pytest.mark.parametrize("shape", [(7, 3), (16, 1), (2, 5, 4), (3, 1, 2)])
def test_mn_major(shape, gen):
    t = random_tensor(shape, torch.int32, gen=gen)
    m = ref.mn_major(t)
    rows, w = shape[-2], shape[-1]
    pad = (rows + 3) // 4 * 4
    assert m.shape == t.shape and m.stride()[-2:] == (1, pad)
    assert m.untyped_storage().nbytes() == math.prod(shape[:-2]) * w * pad * 4
    assert torch.equal(m, t)
    storage = m._base.view(-1, w, pad)
    assert (storage[..., rows:] == 0).all()  # the padding rows are zeros


def padded_mn_major(values, gen):
    """(storage, f): random int32 storage ``[..., W, align4(rows)]`` (padding
    random too, so a write there shows) and f(storage) its MN-major view of
    ``values``' shape, holding values."""
    *lead, rows, w = values.shape
    pad = (rows + 3) // 4 * 4
    storage = random_tensor((*lead, w, pad), torch.int32, values.device, gen)
    f = lambda s: s.transpose(-1, -2)[..., :rows, :]
    f(storage).copy_(values)
    assert f(storage).stride()[-2:] == (1, pad)
    return storage, f


def check_model_op(op, ref_op, args, extra, device, perm):
    """args: (base, f) pairs. The op on f(base)s against ref_op on copies; whole
    bases compared; bytes outside every view as they were."""
    bases = [b for b, _ in args]
    before = [b.clone() for b in bases]
    expected = [b.clone() for b in bases]
    ref_op(*[f(e) for e, (_, f) in zip(expected, args)], *extra)
    with expect_native_if_moves(device, perm):
        op(*[f(b) for b, f in args], *extra)
    for b, e, b0, (_, f) in zip(bases, expected, before, args):
        assert_same_bytes(b, e)
        flat = lambda t: t.reshape(-1)
        n = b.numel()
        mask = covered(n, lambda x: f(x.view(b.shape)), device)
        assert_outside_unchanged(flat(b), flat(b0), mask)


def plain(t):
    return t, lambda x: x


Q_OPS = {False: (fp.permute_wq_b_, ref.permute_wq_b_), True: (fp.unpermute_wq_b_, ref.unpermute_wq_b_)}
O_OPS = {False: (fp.permute_wo_a_, ref.permute_wo_a_), True: (fp.unpermute_wo_a_, ref.unpermute_wo_a_)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("gran,k", [(32, 256), (128, 512)])
@pytest.mark.parametrize("h_q", [64, 32, 16, 8])  # TP 1, 2, 4, 8
def test_wq_b_with_deepgemm_mn_major_scale(device, h_q, gran, k, inverse, gen):
    rows = h_q * 512
    w = random_tensor((rows, k), FP8, device, gen)
    scale_bytes = random_tensor((rows, k // gran), torch.uint8, device, gen)
    storage, f = padded_mn_major(ref.pack_ue8m0(scale_bytes), gen)
    assert f(storage).shape == (rows, k // (4 * gran))
    op, ref_op = Q_OPS[inverse]
    perm = fp.q_fused_permutation(h_q, 512)
    check_model_op(op, ref_op, [plain(w), (storage, f)], (h_q,), device, perm)
    # packing commutes: the packed scale, unpacked, is the uint8 scale permuted alike
    w2 = random_tensor((rows, k), FP8, device, gen)
    op(w2, scale_bytes, h_q)
    assert_same_bytes(ref.unpack_ue8m0(f(storage)), scale_bytes)


def _wq_b_scales(rows, device, gen):
    """Scales of other strides and dtypes: (base, f) pairs."""
    t = random_tensor((40, rows), torch.float32, device, gen)
    yield t, lambda x: x.t()  # float32, transposed
    p = random_tensor((rows, 7), torch.int32, device, gen)
    yield p, lambda x: x[:, 1:4]  # int32, padded rows
    s = random_tensor((2 * rows, 9), torch.uint8, device, gen)
    yield s, lambda x: x[::2, ::3]  # uint8, stepped both ways
    o = random_tensor((rows * 5 + 9,), torch.float8_e8m0fnu, device, gen)
    yield o, lambda x: x[9:].view(rows, 5)  # storage offset


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inverse", [False, True])
def test_wq_b_with_other_strided_scales_and_weights(device, inverse, gen):
    h_q, rows, k = 8, 8 * 512, 96
    op, ref_op = Q_OPS[inverse]
    perm = fp.q_fused_permutation(h_q, 512)
    weights = [
        plain(random_tensor((rows, k), FP8, device, gen)),
        (random_tensor((k, rows), FP8, device, gen), lambda x: x.t()),
        (random_tensor((rows, k + 16), torch.bfloat16, device, gen), lambda x: x[:, 16:]),
    ]
    for i, scale in enumerate(_wq_b_scales(rows, device, gen)):
        check_model_op(op, ref_op, [weights[i % len(weights)], scale], (h_q,), device, perm)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("n_groups,out", [(8, 16), (4, 18), (2, 33), (1, 64)])  # TP 1, 2, 4, 8
def test_wo_a_3d_with_packed_mn_major_scale(device, n_groups, out, inverse, gen):
    w = random_tensor((n_groups, out, 8 * 512), FP8, device, gen)
    scale_bytes = random_tensor((n_groups, out, 128), torch.uint8, device, gen)
    storage, f = padded_mn_major(ref.pack_ue8m0(scale_bytes), gen)
    assert f(storage).shape == (n_groups, out, 32)
    w0 = w.clone()
    op, ref_op = O_OPS[inverse]
    perm = fp.o_fused_permutation(8, 512)
    check_model_op(op, ref_op, [plain(w), (storage, f)], (8,), device, perm)
    # packing commutes, and the 3-D op is the 2-D op on the stacked rows
    w2, s2 = w0.reshape(n_groups * out, -1), scale_bytes.reshape(n_groups * out, -1)
    ops.permute_wo_a_(w2, s2, 8, inverse)
    assert_same_bytes(ref.unpack_ue8m0(f(storage)), scale_bytes)
    assert_same_bytes(w2.view(w.shape), w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inverse", [False, True])
def test_wo_a_2d_with_packed_scale(device, inverse, gen):
    rows, group, head_dim = 40, 8, 512
    op, ref_op = O_OPS[inverse]
    perm = fp.o_fused_permutation(group, head_dim)
    w = random_tensor((rows, group * head_dim), FP8, device, gen)
    scale_bytes = random_tensor((rows, 128), torch.uint8, device, gen)
    packed = ref.pack_ue8m0(scale_bytes)  # row-major, contiguous
    check_model_op(op, ref_op, [plain(w), plain(packed)], (group,), device, perm)
    # packing commutes
    w2 = random_tensor((rows, group * head_dim), FP8, device, gen)
    op(w2, scale_bytes, group)
    assert_same_bytes(ref.unpack_ue8m0(packed), scale_bytes)
    # row-major with padded rows, MN-major, and a weight with padded rows
    padded = random_tensor((rows, 35), torch.int32, device, gen)
    wide = random_tensor((rows, group * head_dim + 64), FP8, device, gen)
    check_model_op(op, ref_op, [(wide, lambda x: x[:, 32:-32]), (padded, lambda x: x[:, 2:34])], (group,), device, perm)
    storage, f = padded_mn_major(packed, gen)
    check_model_op(op, ref_op, [plain(w), (storage, f)], (group,), device, perm)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group,head_dim", [(4, 32), (2, 64), (8, 128), (1, 512)])
def test_wo_a_packed_small_groups(device, group, head_dim, gen):
    """Packed scales of few words (one, for 128 columns) and groups of other sizes."""
    cols = group * head_dim
    w = random_tensor((3, 5, cols), FP8, device, gen)
    scale_bytes = random_tensor((3, 5, cols // 32), torch.uint8, device, gen)
    storage, f = padded_mn_major(ref.pack_ue8m0(scale_bytes), gen)
    perm = fp.o_fused_permutation(group, head_dim)
    check_model_op(fp.permute_wo_a_, ref.permute_wo_a_, [plain(w), (storage, f)], (group,), device, perm)
    fp.permute_wo_a_(random_tensor((3, 5, cols), FP8, device, gen), scale_bytes, group)
    assert_same_bytes(ref.unpack_ue8m0(f(storage)), scale_bytes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.float8_e8m0fnu, torch.int32, torch.float32])
def test_wo_a_3d_with_per_element_scale(device, scale_dtype, gen):
    """One scale element per 32 columns, any dtype (int32 too): elements move."""
    n_groups, out = 2, 24
    w_storage = random_tensor((out, n_groups, 8 * 512), FP8, device, gen)
    s = random_tensor((n_groups, out, 8 * 512 // 32), scale_dtype, device, gen)
    perm = fp.o_fused_permutation(8, 512)
    for inverse in (False, True):
        op, ref_op = O_OPS[inverse]
        check_model_op(op, ref_op, [(w_storage, lambda x: x.transpose(0, 1)), plain(s)], (8,), device, perm)
        check_model_op(
            op,
            ref_op,
            [
                plain(w_storage.transpose(0, 1).contiguous()),
                (s.transpose(1, 2).contiguous(), lambda x: x.transpose(1, 2)),
            ],
            (8,),
            device,
            perm,
        )


@pytest.mark.parametrize("device", DEVICES)
def test_model_ops_opcheck_with_packed_layouts(device, gen):
    # uint8 weights: opcheck compares with allclose, which float8 lacks
    w = random_tensor((2, 8, 1024), torch.uint8, device, gen)
    s = ref.mn_major(ref.pack_ue8m0(random_tensor((2, 8, 32), torch.uint8, device, gen)))
    torch.library.opcheck(ops.permute_wo_a_.default, (w, s, 4, False))
    qw = random_tensor((64, 256), torch.uint8, device, gen)
    qs = ref.mn_major(ref.pack_ue8m0(random_tensor((64, 8), torch.uint8, device, gen)))
    torch.library.opcheck(ops.permute_wq_b_.default, (qw, qs, 2, True))
