"""What torch promises of an in-place op, kept by every in-place op here, on
whichever path is loaded (the native ops, or the Python fallback when the
reference is forced): each tensor written has its version counter moved on
(so autograd refuses a backward through a tensor saved before it was
permuted), a tensor only read keeps its counter, an op that raises moves
no counter and no byte, and an inference tensor is written only in
inference mode."""

import pytest
import torch

from flashmla_perm import reference as ref

from conftest import DEVICES, assert_same_bytes, random_tensor

ops = torch.ops.flashmla_perm


def in_place_calls(device, gen):
    """(name, call, written tensors, expected bytes after, read-only tensors)
    for each in-place op, on random data."""
    x = random_tensor((24, 40), torch.uint8, device, gen)
    rows, cols = torch.randperm(24, generator=gen), torch.randperm(40, generator=gen)
    w, s = random_tensor((64, 96), torch.uint8, device, gen), random_tensor((64, 3), torch.uint8, device, gen)
    ow, os_ = random_tensor((16, 512), torch.uint8, device, gen), random_tensor((16, 16), torch.uint8, device, gen)

    def expected(fn, *ts):
        copies = [t.clone() for t in ts]
        fn(*copies)
        return copies

    dev_rows = rows.to(device)
    return [
        (
            "permute_",
            lambda t: ops.permute_(t, dev_rows, 0),
            [x.clone()],
            expected(lambda t: ref.permute_rows_(t, rows), x),
            [dev_rows],
        ),
        (
            "permute_rows_",
            lambda t: ops.permute_rows_(t, rows),
            [x.clone()],
            expected(lambda t: ref.permute_rows_(t, rows), x),
            [rows],
        ),
        (
            "permute_cols_",
            lambda t: ops.permute_cols_(t, cols),
            [x.clone()],
            expected(lambda t: ref.permute_cols_(t, cols), x),
            [cols],
        ),
        (
            "permute_wq_b_",
            lambda a, b: ops.permute_wq_b_(a, b, 2),
            [w.clone(), s.clone()],
            expected(lambda a, b: ref.permute_wq_b_(a, b, 2), w, s),
            [],
        ),
        (
            "permute_wo_a_",
            lambda a, b: ops.permute_wo_a_(a, b, 8, True),
            [ow.clone(), os_.clone()],
            expected(lambda a, b: ref.unpermute_wo_a_(a, b, 8), ow, os_),
            [],
        ),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_each_written_tensor_counts_the_write(device, gen):
    for name, call, written, expected, read in in_place_calls(device, gen):
        before = [t._version for t in written]
        read_before = [t._version for t in read]
        call(*written)
        for t, v, e in zip(written, before, expected):
            assert t._version > v, f"{name}: the written tensor's version stayed at {v}"
            assert_same_bytes(t, e)
        assert [t._version for t in read] == read_before, f"{name}: a tensor it only reads counted a write"


@pytest.mark.parametrize("device", DEVICES)
def test_backward_through_a_tensor_permuted_since_it_was_saved_refuses(device, gen):
    x = torch.randn(8, 4, generator=gen).to(device).requires_grad_()
    y = x * 1.0
    loss = (y * y).sum()  # saves y
    with torch.no_grad():
        ops.permute_rows_(y, torch.randperm(8, generator=gen))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("device", DEVICES)
def test_an_error_counts_no_write(device, gen):
    w, s = random_tensor((64, 96), torch.uint8, device, gen), random_tensor((32, 3), torch.uint8, device, gen)
    w0, s0 = w.clone(), s.clone()
    before = (w._version, s._version)
    with pytest.raises(ValueError, match="weight_scale"):
        ops.permute_wq_b_(w, s, 2)
    assert (w._version, s._version) == before
    assert_same_bytes(w, w0)
    assert_same_bytes(s, s0)


@pytest.mark.parametrize("device", DEVICES)
def test_an_inference_tensor_is_written_only_in_inference_mode(device, gen):
    perm = torch.randperm(24, generator=gen)
    with torch.inference_mode():
        x = random_tensor((24, 40), torch.uint8, device, gen)
        w = random_tensor((64, 96), torch.uint8, device, gen)
    normal_scale = random_tensor((64, 3), torch.uint8, device, gen)
    x0, w0, s0 = x.clone(), w.clone(), normal_scale.clone()
    with pytest.raises(ValueError, match="self is an inference tensor"):
        ops.permute_rows_(x, perm)
    with pytest.raises(ValueError, match="weight is an inference tensor"):
        ops.permute_wq_b_(w, normal_scale, 2)
    assert_same_bytes(x, x0)
    assert_same_bytes(w, w0)
    assert_same_bytes(normal_scale, s0)
    assert normal_scale._version == 0
    expected = x0.clone()
    ref.permute_rows_(expected, perm)
    with torch.inference_mode():
        ops.permute_rows_(x, perm)
    assert_same_bytes(x, expected)
