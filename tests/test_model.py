"""The public functions (same names and results as the reference) on the
DeepSeek-V4.1 shard shapes and on odd ones, byte for byte."""

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import reference as ref

from conftest import DEVICES, DTYPES, assert_same_bytes, expect_native_if_moves, expect_path, poison, random_tensor

# DeepSeek-V4.1-Flash: 64 heads, head_dim 512, q_lora_rank 1280, o_lora_rank 1024, 8 groups.
HEADS, HEAD_DIM, Q_LORA, O_LORA, GROUPS = 64, 512, 1280, 1024, 8


def wq_b_shard(
    tp, device, gen, weight_dtype=torch.float8_e4m3fn, scale_dtype=torch.uint8, heads=HEADS, head_dim=HEAD_DIM, k=Q_LORA
):
    rows = heads // tp * head_dim
    return (
        random_tensor((rows, k), weight_dtype, device, gen),
        random_tensor((rows, k // 32), scale_dtype, device, gen),
    )


def wo_a_shard(
    tp,
    device,
    gen,
    weight_dtype=torch.float8_e4m3fn,
    scale_dtype=torch.uint8,
    group=8,
    head_dim=HEAD_DIM,
    rows_per_group=O_LORA,
):
    rows = GROUPS // tp * rows_per_group
    return (
        random_tensor((rows, group * head_dim), weight_dtype, device, gen),
        random_tensor((rows, group * head_dim // 32), scale_dtype, device, gen),
    )


def check_wq_b(w, s, heads, device):
    ew, es = w.clone(), s.clone()
    ref.permute_wq_b_(ew, es, heads)
    with expect_path(device):
        fp.permute_wq_b_(w, s, heads)
    assert_same_bytes(w, ew)
    assert_same_bytes(s, es)


def check_wo_a(w, s, group, device):
    ew, es = w.clone(), s.clone()
    ref.permute_wo_a_(ew, es, group)
    with expect_native_if_moves(device, fp.o_fused_permutation(group, w.shape[1] // group)):
        fp.permute_wo_a_(w, s, group)
    assert_same_bytes(w, ew)
    assert_same_bytes(s, es)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.float8_e8m0fnu])
def test_deepseek_shards(device, tp, scale_dtype, gen):
    w, s = wq_b_shard(tp, device, gen, scale_dtype=scale_dtype)
    check_wq_b(w, s, HEADS // tp, device)
    w, s = wo_a_shard(tp, device, gen, scale_dtype=scale_dtype)
    check_wo_a(w, s, GROUPS, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype(device, dtype, gen):
    w, s = wq_b_shard(8, device, gen, weight_dtype=dtype, heads=16, k=96)
    check_wq_b(w, s, 2, device)
    w, s = wo_a_shard(8, device, gen, weight_dtype=dtype, rows_per_group=40)
    check_wo_a(w, s, GROUPS, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "heads,head_dim,k",
    [
        (1, 512, 64),  # one head: the Q permutation is the identity
        (3, 32, 40),  # rows not a multiple of any tile, 40-byte rows
        (5, 256, 1000),  # row bytes not a multiple of 16
        (128, 512, 32),  # 128 heads: longer cycles
        (2, 16, 8),  # smallest head_dim
    ],
)
def test_odd_wq_b(device, heads, head_dim, k, gen):
    w, s = wq_b_shard(1, device, gen, heads=heads, head_dim=head_dim, k=k)
    w, s = w, s[:, : max(1, k // 32)]
    ew, es = w.clone(), s.clone()
    ref.permute_wq_b_(ew, es, heads)
    fp.permute_wq_b_(w, s, heads)
    assert_same_bytes(w, ew)
    assert_same_bytes(s, es)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group,head_dim,rows", [(1, 512, 9), (8, 32, 33), (8, 256, 7), (3, 96, 100), (16, 64, 5)])
def test_odd_wo_a(device, group, head_dim, rows, gen):
    w = random_tensor((rows, group * head_dim), torch.float8_e4m3fn, device, gen)
    s = random_tensor((rows, group * head_dim // 32), torch.uint8, device, gen)
    check_wo_a(w, s, group, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize(
    "kind,weight_shape,scale_shape,heads",
    [
        ("wq_b", (0, 64), (0, 2), 8),  # no rows: head_dim 0
        ("wq_b", (256, 0), (256, 0), 4),  # rows of no bytes
        ("wo_a", (4, 0), (4, 0), 8),  # no columns: head_dim 0
        ("wo_a", (0, 512), (0, 16), 8),  # no rows
    ],
)
def test_empty_shards_are_left_as_the_reference_leaves_them(
    device, inverse, kind, weight_shape, scale_shape, heads, gen
):
    w = random_tensor(weight_shape, torch.float8_e4m3fn, device, gen)
    s = random_tensor(scale_shape, torch.uint8, device, gen)
    name = ("un" if inverse else "") + f"permute_{kind}_"
    ew, es = w.clone(), s.clone()
    getattr(ref, name)(ew, es, heads)
    getattr(fp, name)(w, s, heads)
    assert w.shape == ew.shape and s.shape == es.shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [1, 7, 16])
def test_views_with_storage_offset(device, offset, gen):
    rows, k = 8 * 64, 72
    base = random_tensor((rows * k + offset + 5,), torch.float8_e4m3fn, device, gen)
    sbase = random_tensor((rows * 2 + offset + 5,), torch.uint8, device, gen)
    eb, es = base.clone(), sbase.clone()
    view = lambda b, n: b[offset : offset + rows * n].view(rows, n)
    ref.permute_wq_b_(view(eb, k), view(es, 2), 8)
    fp.permute_wq_b_(view(base, k), view(sbase, 2), 8)
    assert_same_bytes(base, eb)
    assert_same_bytes(sbase, es)

    wbase = random_tensor((30 * 512 + offset,), torch.float8_e4m3fn, device, gen)
    wsbase = random_tensor((30 * 16 + offset,), torch.uint8, device, gen)
    ew, ews = wbase.clone(), wsbase.clone()
    v = lambda b, n: b[offset : offset + 30 * n].view(30, n)
    ref.permute_wo_a_(v(ew, 512), v(ews, 16), 2)
    fp.permute_wo_a_(v(wbase, 512), v(wsbase, 16), 2)
    assert_same_bytes(wbase, ew)
    assert_same_bytes(wsbase, ews)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tp", [1, 8])
def test_forward_then_inverse_is_identity(device, tp, gen):
    w, s = wq_b_shard(tp, device, gen)
    w0, s0 = w.clone(), s.clone()
    fp.permute_wq_b_(w, s, HEADS // tp)
    assert not torch.equal(w.view(torch.uint8), w0.view(torch.uint8))
    fp.unpermute_wq_b_(w, s, HEADS // tp)
    assert_same_bytes(w, w0)
    assert_same_bytes(s, s0)
    w, s = wo_a_shard(tp, device, gen)
    w0, s0 = w.clone(), s.clone()
    fp.permute_wo_a_(w, s)
    assert not torch.equal(s, s0)
    fp.unpermute_wo_a_(w, s)
    assert_same_bytes(w, w0)
    assert_same_bytes(s, s0)


@pytest.mark.parametrize("device", DEVICES)
def test_unpermute_matches_reference_inverse(device, gen):
    w, s = wq_b_shard(8, device, gen)
    ew, es = w.clone(), s.clone()
    ref.unpermute_wq_b_(ew, es, 8)
    fp.unpermute_wq_b_(w, s, 8)
    assert_same_bytes(w, ew)
    assert_same_bytes(s, es)
    w, s = wo_a_shard(8, device, gen)
    ew, es = w.clone(), s.clone()
    ref.unpermute_wo_a_(ew, es)
    fp.unpermute_wo_a_(w, s)
    assert_same_bytes(w, ew)
    assert_same_bytes(s, es)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("n,h,d", [(5, 64, 512), (1, 1, 16), (3, 8, 48), (0, 4, 32)])
def test_q_activations(device, dtype, n, h, d, gen):
    q = random_tensor((n, h, d), dtype, device, gen)
    poison(device, q.numel() * q.element_size())
    fused = fp.permute_q_to_fused(q)
    assert_same_bytes(fused, ref.permute_q_to_fused(q))
    back = fp.permute_q_from_fused(fused)
    assert_same_bytes(back, q)
    assert_same_bytes(back, ref.permute_q_from_fused(fused))


@pytest.mark.parametrize("device", DEVICES)
def test_q_activations_from_a_strided_view(device, gen):
    big = random_tensor((4, 16, 128), torch.bfloat16, device, gen)
    q = big[:, ::2, :64]
    assert_same_bytes(fp.permute_q_to_fused(q), ref.permute_q_to_fused(q))
