"""Prepared permutations: Permutation, permute_on_load (without vLLM: vLLM's
own code is in test_vllm.py), plans found again by the generic ops, the
plan caches' hits and bounds, path_counts."""

import inspect

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import _ops

from conftest import DEVICES, DTYPES, NATIVE, assert_same_bytes, expect_path, random_tensor

native_only = pytest.mark.skipif(not NATIVE or _ops.FORCE_REFERENCE, reason="the plan caches are native")


def random_perm(n, gen):
    return torch.randperm(n, generator=gen)


def gathered(t, perm, dim):
    """The reference: the gather on the bytes."""
    return t.clone().index_select(dim, perm.to(t.device))


def stats():
    return _ops._C.plan_stats()


# ---- Permutation ----------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((96, 40), 0), ((24, 96), 1), ((6, 40, 5), 1), ((5, 6, 40), -1)])
def test_permutation_applies_in_place(device, dtype, shape, dim, gen):
    n = shape[dim]
    perm = random_perm(n, gen)
    t = random_tensor(shape, dtype, device, gen)
    expected = gathered(t, perm, dim)
    storage = t.data_ptr()
    with expect_path(device):
        fp.Permutation(perm).apply_(t, dim)
    assert_same_bytes(t, expected)
    assert t.data_ptr() == storage


@pytest.mark.parametrize("device", DEVICES)
def test_permutation_inverse_undoes_it(device, gen):
    p = fp.Permutation(random_perm(300, gen))
    t = random_tensor((300, 33), torch.float8_e4m3fn, device, gen)
    before = t.clone()
    p.apply_(t, 0)
    p.inverse().apply_(t, 0)
    assert_same_bytes(t, before)


def test_permutation_from_a_list_int32_and_itself(gen):
    values = random_perm(64, gen)
    t = random_tensor((64, 8), torch.uint8, "cpu", gen)
    expected = gathered(t, values, 0)
    for source in (values.tolist(), values.int(), fp.Permutation(values)):
        u = t.clone()
        fp.Permutation(source).apply_(u)
        assert_same_bytes(u, expected)
    assert len(fp.Permutation(values)) == 64
    assert torch.equal(fp.Permutation(values).indices, values)


def test_an_empty_permutation_from_an_empty_list():
    """[] reads as float32 in torch.as_tensor: still the permutation of nothing."""
    p = fp.Permutation([])
    assert len(p) == 0 and p.indices.dtype == torch.int64
    t = torch.empty(0, 3, dtype=torch.uint8)
    p.apply_(t)
    with pytest.raises(TypeError, match="perm"):
        fp.Permutation(torch.empty(0))  # a float tensor says what it is


def test_permutation_owns_its_values(gen):
    """Changing the caller's tensor afterwards changes nothing."""
    values = random_perm(50, gen)
    p = fp.Permutation(values)
    kept = values.clone()
    values.copy_(torch.arange(50))
    t = random_tensor((50, 3), torch.uint8, "cpu", gen)
    expected = gathered(t, kept, 0)
    p.apply_(t)
    assert_same_bytes(t, expected)


@pytest.mark.parametrize(
    "perm,error,words",
    [
        (torch.tensor([0.0, 1.0]), TypeError, "perm must be int64 or int32"),
        (torch.tensor([True, False]), TypeError, "perm must be int64 or int32"),
        (torch.tensor([[0, 1]]), ValueError, "perm must be 1-D"),
        (torch.tensor([0, 0, 2]), ValueError, "appears more than once"),
        (torch.tensor([0, 3, 1]), ValueError, "out of range"),
        (torch.tensor([-1, 0]), ValueError, "out of range"),
    ],
)
def test_permutation_refuses_bad_perm(perm, error, words):
    with pytest.raises(error, match=words) as info:
        fp.Permutation(perm)
    assert "Permutation: perm" in str(info.value)


def test_permutation_apply_checks_the_tensor(gen):
    p = fp.Permutation(random_perm(8, gen))
    t = random_tensor((8, 4), torch.uint8, "cpu", gen)
    before = t.clone()
    with pytest.raises(ValueError, match="perm has 8 entries but the permuted dimension has 4"):
        p.apply_(t, 1)
    with pytest.raises(ValueError, match="dim"):
        p.apply_(t, 2)
    with pytest.raises(ValueError, match="overlapping memory"):
        p.apply_(torch.zeros(1, 4, dtype=torch.uint8).expand(8, 4))
    assert_same_bytes(t, before)


# ---- plans found again ----------------------------------------------------


@native_only
@pytest.mark.parametrize(
    "op,dim",
    [
        (fp.permute_, 0),
        (fp.permute_, 1),
        (torch.ops.flashmla_perm.permute_cols_, None),
        (torch.ops.flashmla_perm.permute_rows_, None),
    ],
)
def test_generic_ops_build_a_plan_once(op, dim, gen):
    """43 layers through one permutation: one plan. A fresh tensor with the
    same values finds it too; different values build another."""
    _ops._C.clear_plan_caches()  # (other tests drew the same permutations)
    perm = random_perm(96, gen)
    call = (lambda t, p: op(t, p, dim)) if dim is not None else op
    on_dim = 0 if op is torch.ops.flashmla_perm.permute_rows_ else (1 if dim is None else dim)
    shape = (96, 96)
    t = random_tensor(shape, torch.uint8, "cpu", gen)
    call(t, perm)
    built = stats()["built"]
    for layer in range(43):
        t = random_tensor(shape, torch.uint8, "cpu", gen)
        expected = gathered(t, perm, on_dim)
        call(t, perm.clone() if layer % 2 else perm)
        assert_same_bytes(t, expected)
    assert stats()["built"] == built
    other = random_perm(96, gen)
    t = random_tensor(shape, torch.uint8, "cpu", gen)
    expected = gathered(t, other, on_dim)
    call(t, other)
    assert_same_bytes(t, expected)
    assert stats()["built"] == built + 1


@native_only
def test_a_perm_changed_in_place_is_planned_again(gen):
    perm = random_perm(64, gen)
    t = random_tensor((64, 5), torch.uint8, "cpu", gen)
    fp.permute_(t, perm)
    perm.copy_(random_perm(64, gen))  # same tensor, new values
    t = random_tensor((64, 5), torch.uint8, "cpu", gen)
    expected = gathered(t, perm, 0)
    fp.permute_(t, perm)
    assert_same_bytes(t, expected)


@native_only
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_device_perm_is_found_by_the_tensor_and_its_version(gen):
    perm = random_perm(64, gen).cuda()
    t = random_tensor((64, 5), torch.uint8, "cuda", gen)
    fp.permute_(t, perm)
    built = stats()["built"]
    for _ in range(3):
        t = random_tensor((64, 5), torch.uint8, "cuda", gen)
        expected = gathered(t, perm, 0)
        fp.permute_(t, perm)
        assert_same_bytes(t, expected)
    assert stats()["built"] == built
    perm.copy_(random_perm(64, gen).cuda())  # bumps its version
    t = random_tensor((64, 5), torch.uint8, "cuda", gen)
    expected = gathered(t, perm, 0)
    fp.permute_(t, perm)
    assert_same_bytes(t, expected)
    fp.permute_(perm, random_perm(64, gen).cuda())  # this package's own write bumps it too
    t = random_tensor((64, 5), torch.uint8, "cuda", gen)
    expected = gathered(t, perm, 0)
    fp.permute_(t, perm)
    assert_same_bytes(t, expected)


@native_only
@pytest.mark.parametrize("device", DEVICES)
def test_one_permutation_in_both_forms(device, gen):
    """A prepared permutation keeps no copy of its values: its second form
    is built from the caller's values (a CPU perm) or from its first plan (a
    device perm found by the tensor: no device-to-host copy), and a fresh
    perm with the same values is recognised through either plan."""
    _ops._C.clear_plan_caches()
    perm = random_perm(96, gen).to(device)
    for dim in (0, 1, 0, 1):  # rows form, then the gather map, then both found
        t = random_tensor((96, 96), torch.uint8, device, gen)
        expected = gathered(t, perm.cpu(), dim)
        fp.permute_(t, perm, dim)
        assert_same_bytes(t, expected)
    built = stats()["built"]
    for dim in (1, 0):
        t = random_tensor((96, 96), torch.uint8, device, gen)
        expected = gathered(t, perm.cpu(), dim)
        fp.permute_(t, perm.cpu().clone(), dim)
        assert_same_bytes(t, expected)
    assert stats()["built"] == built


@native_only
def test_model_ops_build_their_plans_once(gen):
    """A second layer of the same kind builds nothing (counted, not inferred
    from the cache's size)."""
    from test_model import wo_a_shard, wq_b_shard

    for shard, op in ((wq_b_shard, fp.permute_wq_b_), (wo_a_shard, fp.permute_wo_a_)):
        op(*shard(8, "cpu", gen, k=64), 8) if op is fp.permute_wq_b_ else op(*shard(4, "cpu", gen))
        built = stats()["built"]
        for _ in range(5):
            op(*shard(8, "cpu", gen, k=64), 8) if op is fp.permute_wq_b_ else op(*shard(4, "cpu", gen))
        assert stats()["built"] == built


@native_only
def test_plan_caches_are_bounded():
    """Whatever ran before: emptied, then filled past capacity (64 each)."""
    _ops._C.clear_plan_caches()
    assert stats()["model_plans"] == 0 and stats()["prepared"] == 0
    for heads in range(1, 100):
        fp.permute_q_to_fused(torch.ones(1, heads, 16, dtype=torch.bfloat16))
    for n in range(2, 102):
        fp.permute_(torch.ones(n, dtype=torch.uint8), torch.arange(n).roll(1))
    assert 64 <= stats()["model_plans"] <= 2 * 64
    assert stats()["prepared"] == 64


@native_only
def test_plan_caches_evict_the_least_recently_used():
    """Full caches (64 prepared permutations; 64 model plans) keep what was
    used last and drop what was used longest ago: counted by plans built."""
    _ops._C.clear_plan_caches()

    def permute(n):  # a prepared permutation of n (by value), and its plan
        fp.permute_(torch.ones(n, dtype=torch.uint8), torch.arange(n).roll(1))

    def permute_q(heads):  # a model plan (the Q permutation of `heads` heads)
        fp.permute_q_to_fused(torch.ones(1, heads, 16, dtype=torch.bfloat16))

    for call, first in ((permute, 2), (permute_q, 1)):
        for k in range(first, first + 64):  # full
            call(k)
        built = stats()["built"]
        call(first)  # the oldest, used again: now the newest
        call(first + 64)  # one more: evicts the least recently used (first + 1)
        assert stats()["built"] == built + 1
        call(first + 64)
        call(first)
        assert stats()["built"] == built + 1, "the newest entries were evicted"
        call(first + 1)
        assert stats()["built"] == built + 2, "the least recently used entry was kept"


# ---- permute_on_load, without vLLM ----------------------------------------


def test_permute_on_load_wraps_a_loader_with_vllms_names(gen):
    calls = []

    def loader(param, loaded_weight, shard_id=None, *, extra=0):
        calls.append((shard_id, extra))
        param.data.copy_(loaded_weight)

    p = torch.nn.Parameter(torch.empty(32, 8, dtype=torch.float8_e4m3fn), requires_grad=False)
    p.weight_loader = loader
    perm = random_perm(32, gen)
    fp.permute_on_load(p, perm, 0)
    assert list(inspect.signature(p.weight_loader).parameters)[:2] == ["param", "loaded_weight"]
    ckpt = random_tensor((32, 8), torch.float8_e4m3fn, "cpu", gen)
    p.weight_loader(p, ckpt, 3, extra=5)
    assert calls == [(3, 5)]
    assert_same_bytes(p.data, gathered(ckpt, perm, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_permute_on_load_without_a_loader_copies_then_permutes(device, gen):
    p = torch.nn.Parameter(torch.empty(16, 64, dtype=torch.uint8, device=device), requires_grad=False)
    perm = random_perm(64, gen)
    fp.permute_on_load(p, perm, -1)
    storage = p.data_ptr()
    for _ in range(2):  # a load, then a reload with new bytes
        ckpt = random_tensor((16, 64), torch.uint8, "cpu", gen)
        with expect_path(device):
            p.weight_loader(p, ckpt)
        assert_same_bytes(p.data, gathered(ckpt, perm, 1))
        assert p.data_ptr() == storage


def test_permute_on_load_permutes_the_param_it_is_called_with(gen):
    """vLLM's reload calls the loader on a fresh tensor carrying the same
    attributes (and once on a meta tensor, to count elements)."""
    p = torch.nn.Parameter(torch.empty(48, 4, dtype=torch.uint8), requires_grad=False)
    perm = random_perm(48, gen)
    fp.permute_on_load(p, perm, 0)
    ckpt = random_tensor((48, 4), torch.uint8, "cpu", gen)
    fresh = torch.nn.Parameter(torch.empty(48, 4, dtype=torch.uint8), requires_grad=False)
    p.weight_loader(fresh, ckpt)
    assert_same_bytes(fresh.data, gathered(ckpt, perm, 0))
    meta = torch.nn.Parameter(torch.empty(48, 4, dtype=torch.uint8, device="meta"), requires_grad=False)
    p.weight_loader(meta, ckpt)


@pytest.mark.parametrize(
    "perm,dim,error,words",
    [
        (torch.arange(7), 0, ValueError, "perm has 7 entries but param.size"),
        (torch.arange(9), 0, ValueError, "perm has 9 entries but param.size"),
        (torch.tensor([0, 1, 2, 3, 4, 5, 6, 6]), 0, ValueError, "appears more than once"),
        (torch.tensor([0, 1, 2, 3, 4, 5, 6, 8]), 0, ValueError, "out of range"),
        (torch.arange(8.0), 0, TypeError, "perm must be int64 or int32"),
        (torch.ones(8, dtype=torch.bool), 0, TypeError, "perm must be int64 or int32"),
        (torch.arange(8), 2, ValueError, "dim"),
        (torch.arange(8), -3, ValueError, "dim"),
    ],
)
def test_permute_on_load_refuses_at_wrap_time(perm, dim, error, words):
    p = torch.nn.Parameter(torch.zeros(8, 4, dtype=torch.uint8), requires_grad=False)

    def loader(param, loaded_weight):
        param.data.copy_(loaded_weight)

    p.weight_loader = loader
    with pytest.raises(error, match=words) as info:
        fp.permute_on_load(p, perm, dim)
    assert "permute_on_load" in str(info.value)
    assert p.weight_loader is loader


def test_permute_on_load_refuses_an_overlapping_param():
    p = torch.nn.Parameter(torch.zeros(1, 4, dtype=torch.uint8).expand(8, 4), requires_grad=False)
    with pytest.raises(ValueError, match="permute_on_load: param has overlapping memory"):
        fp.permute_on_load(p, torch.arange(8), 0)
    assert not hasattr(p, "weight_loader")


def test_a_wrong_shape_raises_the_loaders_error_and_moves_nothing(gen):
    p = torch.nn.Parameter(random_tensor((8, 4), torch.uint8, "cpu", gen), requires_grad=False)
    before = p.data.clone()
    fp.permute_on_load(p, random_perm(8, gen), 0)
    with pytest.raises(ValueError, match="Attempted to load weight"):
        p.weight_loader(p, torch.ones(4, 8, dtype=torch.uint8))
    assert_same_bytes(p.data, before)


# ---- path_counts ----------------------------------------------------------


def test_path_counts_say_what_served():
    before = fp.path_counts()
    assert set(before) == {"cpu", "cuda", "aten", "reference"}
    fp.permute_(torch.arange(6, dtype=torch.uint8), torch.tensor([1, 0, 2, 3, 5, 4]))
    after = fp.path_counts()
    served = "reference" if not NATIVE or _ops.FORCE_REFERENCE else "cpu"
    assert after[served] == before[served] + 1
    assert sum(after.values()) == sum(before.values()) + 1
