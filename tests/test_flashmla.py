"""Drop-ins of FlashMLA's ``permute_q_b_proj`` / ``permute_wv_proj``
(flashmla_perm.flashmla) against the reference, byte for byte: the outputs'
shapes, strides and whole storage (padding rows zero), inputs untouched, on
the tensor-parallel shards of DeepSeek-V4.1, and the same bytes as vLLM's
layout once the packing is undone."""

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import flashmla as fm
from flashmla_perm import reference as ref

from conftest import DEVICES, assert_same_bytes, expect_path, poison, random_tensor

ops = torch.ops.flashmla_perm
FP8 = torch.float8_e4m3fn


def align4(n):
    return (n + 3) // 4 * 4


def mn_major_input(values, gen):
    """An MN-major int32 scale holding values, in storage whose padding is
    random (the drop-ins read the view only)."""
    *lead, rows, w = values.shape
    storage = random_tensor((*lead, w, align4(rows)), torch.int32, values.device, gen)
    view = storage.transpose(-1, -2)[..., :rows, :]
    view.copy_(values)
    return view


def q_b_inputs(h_q, d_q, k, gran, device, gen):
    rows = h_q * d_q
    weight = random_tensor((rows, k), FP8, device, gen)
    scale_bytes = random_tensor((rows, k // gran), torch.uint8, device, gen)
    return weight, mn_major_input(ref.pack_ue8m0(scale_bytes), gen), scale_bytes


def wv_inputs(n_groups, out, group, d_o, device, gen):
    weight = random_tensor((n_groups, out, group * d_o), FP8, device, gen)
    scale_bytes = random_tensor((n_groups, out, group * d_o // 32), torch.uint8, device, gen)
    return weight, mn_major_input(ref.pack_ue8m0(scale_bytes), gen), scale_bytes


def storage_bytes(t):
    """Every byte of t's storage (the padding too)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def check_outputs(got, expected, rows_dim_storage):
    """Shapes, strides, bytes of the views and of the whole scale storage;
    `rows_dim_storage` the scale storage's shape ``[..., W, align4(rows)]``."""
    (w, s), (ew, es) = got, expected
    assert w.is_contiguous() and w.shape == ew.shape and w.dtype == FP8
    assert_same_bytes(w, ew)
    assert s.dtype == torch.int32 and s.shape == es.shape
    assert s.stride() == es.stride(), (s.stride(), es.stride())
    *lead, words, pad = rows_dim_storage
    n = 1
    for x in lead:
        n *= x
    assert s.stride()[-2:] == (1, pad)
    assert s.untyped_storage().nbytes() == n * words * pad * 4
    assert_same_bytes(s, es)
    assert_same_bytes(storage_bytes(s), storage_bytes(es))
    rows = s.shape[-2]
    padding = storage_bytes(s).view(torch.int32).view(rows_dim_storage)[..., rows:]
    assert (padding == 0).all(), "padding rows of the output scale must be zero"


def run(fn, inputs, extra, device):
    """fn on inputs (poisoned allocator first), inputs checked untouched."""
    before = [storage_bytes(t).clone() for t in inputs]
    poison(device, sum(t.untyped_storage().nbytes() for t in inputs) + 4096)
    with expect_path(device):
        out = fn(inputs, *extra)
    assert isinstance(out, list) and len(out) == 2
    for t, b in zip(inputs, before):
        assert torch.equal(storage_bytes(t), b), "an input changed"
    return out


# --------------------------------------------------------------------------- permute_q_b_proj


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gran,k", [(32, 256), (128, 512)])
@pytest.mark.parametrize("h_q", [64, 32, 16, 8])  # TP 1, 2, 4, 8
@pytest.mark.parametrize("via", ["flashmla", "ops"])
def test_q_b_proj(device, h_q, gran, k, via, gen):
    weight, scale, scale_bytes = q_b_inputs(h_q, 512, k, gran, device, gen)
    rows, words = h_q * 512, k // (4 * gran)
    assert scale.shape == (rows, words)
    fn = fm.permute_q_b_proj if via == "flashmla" else lambda ws, *a: ops.permute_q_b_proj(list(ws), *a)
    got = run(fn, (weight, scale), (h_q, 512), device)
    expected = ref.permute_q_b_proj((weight, scale), h_q, 512)
    check_outputs(got, expected, (words, align4(rows)))
    # vLLM's layout, packing undone: the same bytes
    w2, s2 = weight.clone(), scale_bytes.clone()
    fp.permute_wq_b_(w2, s2, h_q)
    assert_same_bytes(got[0], w2)
    assert_same_bytes(ref.unpack_ue8m0(got[1]), s2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "h_q,d_q,k,gran",
    [
        (1, 16, 128, 32),  # one head (identity), one word per row
        (3, 48, 1024, 128),  # odd heads, two words
        (2, 64, 1280, 32),  # the model's K: ten words
        (128, 16, 128, 32),  # many heads of the smallest d_q
    ],
)
def test_q_b_proj_odd_shapes(device, h_q, d_q, k, gran, gen):
    weight, scale, _ = q_b_inputs(h_q, d_q, k, gran, device, gen)
    rows, words = h_q * d_q, k // (4 * gran)
    got = fm.permute_q_b_proj((weight, scale), h_q, d_q)
    check_outputs(got, ref.permute_q_b_proj((weight, scale), h_q, d_q), (words, align4(rows)))


@pytest.mark.parametrize("device", DEVICES)
def test_q_b_proj_one_word_takes_any_second_stride(device, gen):
    """W == 1: stride(1) is not looked at (a contiguous [rows, 1] passes)."""
    weight = random_tensor((4 * 32, 128), FP8, device, gen)
    scale = random_tensor((4 * 32, 1), torch.int32, device, gen)
    assert scale.stride() == (1, 1)
    got = fm.permute_q_b_proj((weight, scale), 4, 32)
    check_outputs(got, ref.permute_q_b_proj((weight, scale), 4, 32), (1, 128))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pitch", [4100, 4096 + 64, 2 * 4096])
def test_q_b_proj_takes_rows_padded_beyond_align4(device, pitch, gen):
    """FlashMLA checks stride(0) == 1 alone and reads words at stride(1): a
    scale with strides (1, 4100) for 4096 rows is its valid input, and ours."""
    rows, k, gran = 8 * 512, 256, 32
    weight = random_tensor((rows, k), FP8, device, gen)
    words = k // (4 * gran)
    storage = random_tensor((words, pitch), torch.int32, device, gen)
    scale = storage.t()[:rows]
    assert scale.stride() == (1, pitch)
    got = fm.permute_q_b_proj((weight, scale), 8, 512)
    check_outputs(got, ref.permute_q_b_proj((weight, scale), 8, 512), (words, align4(rows)))


@pytest.mark.parametrize("device", DEVICES)
def test_drop_ins_read_weights_at_any_row_pitch_and_inputs_may_share_memory(device, gen):
    """Inputs are only read: FlashMLA needs the last dim contiguous, nothing
    else; weight and scale carved from one buffer are fine."""
    rows, k = 2 * 64, 256
    buffer = random_tensor((rows, 2 * k), torch.uint8, device, gen)
    weight = buffer[:, :k].view(FP8)  # rows at a pitch of 2 K
    # MN-major words over the weight's own bytes
    scale = torch.as_strided(buffer.view(-1).view(torch.int32), (rows, 2), (1, rows), 16)
    before = buffer.clone()
    got = fm.permute_q_b_proj((weight, scale), 2, 64)
    check_outputs(got, ref.permute_q_b_proj((weight, scale), 2, 64), (2, align4(rows)))
    assert_same_bytes(buffer, before)
    wv_weight = random_tensor((2, 6, 2 * 4096), FP8, device, gen)[..., :4096]
    wv_scale = mn_major_input(ref.pack_ue8m0(random_tensor((2, 6, 128), torch.uint8, device, gen)), gen)
    got = fm.permute_wv_proj((wv_weight, wv_scale), 8, 512)
    check_outputs(got, ref.permute_wv_proj((wv_weight, wv_scale), 8, 512), (2, 32, align4(6)))


# --------------------------------------------------------------------------- permute_wv_proj


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_groups,out", [(8, 16), (4, 18), (2, 33), (1, 64)])  # TP 1, 2, 4, 8
@pytest.mark.parametrize("via", ["flashmla", "ops"])
def test_wv_proj(device, n_groups, out, via, gen):
    weight, scale, scale_bytes = wv_inputs(n_groups, out, 8, 512, device, gen)
    assert scale.shape == (n_groups, out, 32) and scale.stride(1) == 1
    fn = fm.permute_wv_proj if via == "flashmla" else lambda ws, *a: ops.permute_wv_proj(list(ws), *a)
    got = run(fn, (weight, scale), (8, 512), device)
    expected = ref.permute_wv_proj((weight, scale), 8, 512)
    check_outputs(got, expected, (n_groups, 32, align4(out)))
    # vLLM's layout, packing undone: the same bytes
    w2, s2 = weight.clone(), scale_bytes.clone()
    fp.permute_wo_a_(w2, s2, 8)
    assert_same_bytes(got[0], w2)
    assert_same_bytes(ref.unpack_ue8m0(got[1]), s2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "n_groups,out,group,d_o",
    [
        (1, 1, 8, 512),  # one output row: stride(1) is not looked at
        (3, 5, 4, 32),  # one word per row
        (2, 7, 1, 512),  # one head: the identity
        (1, 3, 16, 64),  # other group sizes
    ],
)
def test_wv_proj_odd_shapes(device, n_groups, out, group, d_o, gen):
    weight, scale, _ = wv_inputs(n_groups, out, group, d_o, device, gen)
    words = group * d_o // 128
    got = fm.permute_wv_proj((weight, scale), group, d_o)
    check_outputs(got, ref.permute_wv_proj((weight, scale), group, d_o), (n_groups, words, align4(out)))


@pytest.mark.parametrize("device", DEVICES)
def test_strided_weights_are_fine(device, gen):
    """The weights may have any strides (the outputs are contiguous)."""
    wide = random_tensor((256, 160), FP8, device, gen)
    weight = wide[:, 16:144]
    scale = mn_major_input(random_tensor((256, 1), torch.int32, device, gen), gen)
    check_outputs(fm.permute_q_b_proj((weight, scale), 8, 32), ref.permute_q_b_proj((weight, scale), 8, 32), (1, 256))
    t = random_tensor((6, 2, 1024), FP8, device, gen).transpose(0, 1)
    s = mn_major_input(random_tensor((2, 6, 8), torch.int32, device, gen), gen)
    check_outputs(fm.permute_wv_proj((t, s), 2, 512), ref.permute_wv_proj((t, s), 2, 512), (2, 8, 8))


# --------------------------------------------------------------------------- fake kernels


def finite_fp8(t, gen):
    """t with every NaN byte (0x7f / 0xff in e4m3) replaced by a random finite
    one: opcheck compares outputs of separate runs as values, and NaN != NaN."""
    b = t.view(torch.uint8).clone()
    nan = (b & 0x7F) == 0x7F
    b[nan] = torch.randint(0, 0x7F, (int(nan.sum()),), dtype=torch.uint8, generator=gen).to(b.device)
    return b.view(torch.float8_e4m3fn)


# opcheck's test_schema multiplies the outputs, and torch has no float8
# multiply ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'): the
# drop-ins take float8 weights only (as FlashMLA), so they run every other
# opcheck test; the bytes are compared by the tests above.
DROP_IN_OPCHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_drop_ins(device, gen):
    for op, (weight, scale, _), extra in [
        (ops.permute_q_b_proj.default, q_b_inputs(4, 32, 256, 32, device, gen), (4, 32)),
        (ops.permute_wv_proj.default, wv_inputs(2, 6, 8, 512, device, gen), (8, 512)),
    ]:
        torch.library.opcheck(op, ([finite_fp8(weight, gen), scale], *extra), test_utils=DROP_IN_OPCHECKS)


@pytest.mark.parametrize("device", DEVICES)
def test_meta_outputs_have_the_real_strides(device, gen):
    for fn, real_inputs, extra in [
        (fm.permute_q_b_proj, q_b_inputs(8, 64, 512, 128, device, gen)[:2], (8, 64)),
        (fm.permute_wv_proj, wv_inputs(3, 10, 8, 512, device, gen)[:2], (8, 512)),
    ]:
        meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in real_inputs]
        real, fake = fn(real_inputs, *extra), fn(meta, *extra)
        for r, f in zip(real, fake):
            assert f.device.type == "meta"
            assert (f.shape, f.stride(), f.dtype) == (r.shape, r.stride(), r.dtype)
