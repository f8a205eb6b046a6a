"""Bad input: a clear error that names the argument, and every byte of every
tensor involved exactly as it was. Runs on whichever path is loaded (the
native ops, or the Python fallback when the reference is forced)."""

import pytest
import torch

import flashmla_perm as fp

from conftest import DEVICES, assert_same_bytes, random_tensor

ops = torch.ops.flashmla_perm


def r(*shape, dtype=torch.uint8, device="cpu"):
    return random_tensor(shape, dtype, device)


def wq(rows=256, k=64, srows=None, device="cpu"):
    return r(rows, k, dtype=torch.float8_e4m3fn, device=device), r(srows or rows, k // 32, device=device)


def wo(rows=16, cols=512, scols=None, device="cpu"):
    return r(rows, cols, dtype=torch.float8_e4m3fn, device=device), r(rows, scols or cols // 32, device=device)


def expanded():
    return r(1, 64).expand(8, 64)


def grad_tensor():
    return torch.randn(64, 32, requires_grad=True)


# (id, make tensors, call, exception, text the message must contain)
CASES = [
    ("wq_b heads do not divide rows", lambda: wq(), lambda w, s: fp.permute_wq_b_(w, s, 3), ValueError, "num_local_heads"),
    ("wq_b zero heads", lambda: wq(), lambda w, s: fp.permute_wq_b_(w, s, 0), ValueError, "num_local_heads"),
    ("wq_b negative heads", lambda: wq(), lambda w, s: fp.permute_wq_b_(w, s, -2), ValueError, "num_local_heads"),
    ("wq_b head_dim not a multiple of 16", lambda: wq(rows=8 * 24), lambda w, s: fp.permute_wq_b_(w, s, 8), ValueError, "head_dim"),
    ("wq_b scale rows mismatch", lambda: wq(srows=128), lambda w, s: fp.permute_wq_b_(w, s, 4), ValueError, "weight_scale"),
    ("wq_b 1-D weight", lambda: (r(256), r(256, 2)), lambda w, s: fp.permute_wq_b_(w, s, 4), ValueError, "weight"),
    ("wq_b 0-D scale", lambda: (r(256, 64), r()), lambda w, s: fp.permute_wq_b_(w, s, 4), ValueError, "weight_scale"),
    ("wq_b weight and scale on different devices", lambda: (r(256, 64), torch.empty(256, 2, dtype=torch.uint8, device="meta")), lambda w, s: fp.permute_wq_b_(w, s, 4), ValueError, "weight_scale"),
    ("wq_b weight requires grad", lambda: (grad_tensor(), r(64, 1)), lambda w, s: fp.permute_wq_b_(w, s, 4), ValueError, "weight"),
    ("wq_b scale is the weight", lambda: (lambda w: (w, w))(r(256, 64)), lambda w, s: fp.permute_wq_b_(w, s, 4), ValueError, "share memory"),
    ("wo_a group does not divide columns", lambda: wo(cols=500), lambda w, s: fp.permute_wo_a_(w, s, 8), ValueError, "heads_per_group"),
    ("wo_a head_dim not a multiple of 32", lambda: wo(cols=8 * 48, scols=12), lambda w, s: fp.permute_wo_a_(w, s, 8), ValueError, "head_dim"),
    ("wo_a zero group", lambda: wo(), lambda w, s: fp.permute_wo_a_(w, s, 0), ValueError, "heads_per_group"),
    ("wo_a scale width mismatch", lambda: wo(scols=15), lambda w, s: fp.permute_wo_a_(w, s, 8), ValueError, "weight_scale"),
    ("wo_a scale rows mismatch", lambda: (r(16, 512), r(8, 16)), lambda w, s: fp.permute_wo_a_(w, s, 8), ValueError, "weight_scale"),
    ("wo_a 1-D weight", lambda: (r(512), r(16)), lambda w, s: fp.permute_wo_a_(w, s, 8), ValueError, "weight"),
    ("wo_a expanded weight", lambda: (expanded(), r(8, 2)), lambda w, s: fp.permute_wo_a_(w, s, 2), ValueError, "overlapping"),
    ("q not 3-D", lambda: (r(4, 512, dtype=torch.bfloat16),), lambda q: fp.permute_q_to_fused(q), ValueError, "q"),
    ("q head_dim not a multiple of 16", lambda: (r(2, 4, 40, dtype=torch.bfloat16),), lambda q: fp.permute_q_to_fused(q), ValueError, "head_dim"),
    ("perm too short", lambda: (r(64, 8),), lambda x: ops.permute_rows_(x, torch.randperm(63)), ValueError, "perm"),
    ("perm too long", lambda: (r(8, 64),), lambda x: ops.permute_cols_(x, torch.randperm(65)), ValueError, "perm"),
    ("perm duplicate index", lambda: (r(64, 8),), lambda x: ops.permute_rows_(x, torch.cat([torch.arange(63), torch.tensor([5])])), ValueError, "more than once"),
    ("perm index out of range", lambda: (r(64, 8),), lambda x: ops.permute_rows_(x, torch.cat([torch.arange(63), torch.tensor([64])])), ValueError, "out of range"),
    ("perm negative index", lambda: (r(8, 64),), lambda x: ops.permute_cols_(x, torch.cat([torch.tensor([-1]), torch.arange(1, 64)])), ValueError, "out of range"),
    ("perm float dtype", lambda: (r(64, 8),), lambda x: ops.permute_rows_(x, torch.randperm(64).float()), TypeError, "perm"),
    ("perm bool dtype", lambda: (r(8, 64),), lambda x: ops.permute_cols(x, torch.ones(64, dtype=torch.bool)), TypeError, "perm"),
    ("perm 2-D", lambda: (r(64, 8),), lambda x: ops.permute_rows_(x, torch.randperm(64).view(8, 8)), ValueError, "perm"),
    ("perm on another device", lambda: (r(64, 8),), lambda x: ops.permute_rows_(x, torch.empty(64, dtype=torch.long, device="meta")), ValueError, "perm"),
    ("permute_rows_ of a 0-D tensor", lambda: (r(),), lambda x: ops.permute_rows_(x, torch.zeros(1, dtype=torch.long)), ValueError, "self"),
    ("permute_rows_ of an expanded tensor", lambda: (expanded(),), lambda x: ops.permute_rows_(x, torch.randperm(8)), ValueError, "overlapping"),
    ("permute_cols_ of a tensor requiring grad", lambda: (grad_tensor(),), lambda x: ops.permute_cols_(x, torch.randperm(32)), ValueError, "requires grad"),
]


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
