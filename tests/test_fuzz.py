"""Property-based: random shapes, dtypes, permutations (random, structured,
identity), storage offsets and row strides; the op's bytes equal the
reference's every time, and bytes around the view never move.

FLASHMLA_PERM_FUZZ_EXAMPLES sets the number of examples per test (CI: 1000)."""

import math
import os

import pytest
import torch

pytest.importorskip("hypothesis")  # the GPU box has no hypothesis and no network
from hypothesis import HealthCheck, event, given, settings, strategies as st  # noqa: E402

import flashmla_perm as fp
from flashmla_perm import reference as ref

from conftest import DEVICES, DTYPES, assert_same_bytes

EXAMPLES = int(os.environ.get("FLASHMLA_PERM_FUZZ_EXAMPLES", "1000"))
ops = torch.ops.flashmla_perm


def divisors_with(n, chunk):
    """Head counts h with n = h * d and d a multiple of `chunk`."""
    return [h for h in range(1, n + 1) if n % h == 0 and (n // h) % chunk == 0]


def make_perm(kind, n, gen):
    if kind == "identity":
        return torch.arange(n)
    if kind == "reverse":
        return torch.arange(n - 1, -1, -1)
    if kind == "cycle":
        order = torch.randperm(n, generator=gen)
        perm = torch.empty(n, dtype=torch.long)
        perm[order] = order.roll(-1)
        return perm
    if kind.startswith("blocks") and n % int(kind[6:]) == 0:
        b = int(kind[6:])
        return (torch.randperm(n // b, generator=gen)[:, None] * b + torch.arange(b)).reshape(-1)
    if kind == "q" and divisors_with(n, 16):
        heads = divisors_with(n, 16)
        h = heads[int(torch.randint(len(heads), (1,), generator=gen))]
        return fp.q_fused_permutation(h, n // h)
    if kind == "o" and divisors_with(n, 32):
        heads = divisors_with(n, 32)
        h = heads[int(torch.randint(len(heads), (1,), generator=gen))]
        return fp.o_fused_permutation(h, n // h)
    return torch.randperm(n, generator=gen)


@st.composite
def cases(draw):
    return dict(
        op=draw(st.sampled_from(["rows", "cols", "cols_out"])),
        dtype=draw(st.sampled_from(DTYPES + [torch.int64])),
        extent=draw(st.one_of(st.integers(1, 70), st.sampled_from([128, 256, 512, 1024, 4096]))),
        other=draw(st.integers(0, 40)),
        kind=draw(st.sampled_from(["random", "identity", "reverse", "cycle", "blocks2", "blocks16", "q", "o"])),
        offset=draw(st.integers(0, 17)),
        pad=draw(st.integers(0, 9)),
        int32=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_fuzz_against_reference(device, case):
    gen = torch.Generator().manual_seed(case["seed"])
    n, other, pad, offset = case["extent"], case["other"], case["pad"], case["offset"]
    # rows: [n, other] rows `other + pad` apart; cols: [other, n] rows `n + pad` apart
    shape, stride = ((n, other), (other + pad, 1)) if case["op"] == "rows" else ((other, n), (n + pad, 1))
    esize = torch.empty((), dtype=case["dtype"]).element_size()
    span = offset + shape[0] * stride[0] + 8
    base = torch.randint(0, 256, (span * esize,), dtype=torch.uint8, generator=gen).view(case["dtype"]).to(device)
    expected = base.clone()
    view = base.as_strided(shape, stride, offset)
    eview = expected.as_strided(shape, stride, offset)
    perm = make_perm(case["kind"], n, gen)
    if case["int32"]:
        perm = perm.to(torch.int32)
    if case["op"] == "rows":
        ref.permute_rows_(eview, perm.long())
        ops.permute_rows_(view, perm)
    elif case["op"] == "cols":
        ref.permute_cols_(eview, perm.long())
        ops.permute_cols_(view, perm)
    else:
        out = ops.permute_cols(view, perm)
        assert_same_bytes(out, ref.permute_cols(eview, perm.long()))
    assert_same_bytes(base, expected)


@st.composite
def strided_cases(draw):
    """A view of rank 1-4 into a 1-D storage: dims stored in any order, each
    sliced with a step, rows padded, at a storage offset; and a dim to permute."""
    rank = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.one_of(st.integers(1, 7), st.sampled_from([16, 33, 64])),
                          min_size=rank, max_size=rank))
    if draw(st.integers(0, 19)) == 0:  # now and then no elements at all
        sizes[draw(st.integers(0, rank - 1))] = 0
    while math.prod(sizes) > 4096:  # keep each example small
        sizes[sizes.index(max(sizes))] //= 2
    return dict(
        sizes=sizes,
        order=draw(st.permutations(range(rank))),
        steps=draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)),
        starts=draw(st.lists(st.integers(0, 2), min_size=rank, max_size=rank)),
        pads=draw(st.lists(st.integers(0, 2), min_size=rank, max_size=rank)),
        offset=draw(st.integers(0, 17)),
        dim=draw(st.integers(-rank, rank - 1)),
        dtype=draw(st.sampled_from(DTYPES + [torch.int64])),
        kind=draw(st.sampled_from(["random", "identity", "reverse", "cycle", "blocks2", "blocks16", "q", "o"])),
        int32=draw(st.booleans()),
        public=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )



def strided_view(base, case):
    """The drawn view of `base` (1-D): a contiguous block at `offset` holding
    the dims in `order`, each of full size start + step * (size - 1) + 1 + pad,
    permuted back to the logical order and sliced start::step."""
    sizes, order = case["sizes"], case["order"]
    full = [st_ + sp * max(s - 1, 0) + 1 + p
            for s, sp, st_, p in zip(sizes, case["steps"], case["starts"], case["pads"])]
    block = base[case["offset"]:case["offset"] + math.prod(full)].view([full[d] for d in order])
    logical = block.permute([order.index(d) for d in range(len(sizes))])
    return logical[tuple(slice(st_, st_ + sp * s, sp)
                         for s, sp, st_ in zip(sizes, case["steps"], case["starts"]))]


def _full_numel(case):
    full = [st_ + sp * max(s - 1, 0) + 1 + p
            for s, sp, st_, p in zip(case["sizes"], case["steps"], case["starts"], case["pads"])]
    return case["offset"] + math.prod(full) + 5


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=strided_cases())
def test_fuzz_permute_any_layout(device, case):
    gen = torch.Generator().manual_seed(case["seed"])
    n, esize = _full_numel(case), torch.empty((), dtype=case["dtype"]).element_size()
    base = torch.randint(0, 256, (n * esize,), dtype=torch.uint8, generator=gen).view(case["dtype"]).to(device)
    before, expected = base.clone(), base.clone()
    view = strided_view(base, case)
    assert list(view.shape) == case["sizes"]
    d = case["dim"] % len(case["sizes"])
    event(f"rank {len(case['sizes'])}")  # --hypothesis-show-statistics: what the draws covered
    event("permuted dim contiguous (column engine)" if view.stride(d) == 1 else "permuted dim strided (row engine)")
    event("view contiguous" if view.is_contiguous() else "view not contiguous")
    if view.numel() == 0 or view.shape[d] == 1:
        event("nothing to move (no elements, or the permuted dim has one)")
    perm = make_perm(case["kind"], case["sizes"][case["dim"]], gen)
    if case["int32"]:
        perm = perm.to(torch.int32)
    ref.permute_(strided_view(expected, case), perm.long(), case["dim"])
    (fp.permute_ if case["public"] else ops.permute_)(view, perm, case["dim"])
    assert_same_bytes(base, expected)
    # bytes outside the view never move
    inside = torch.zeros(n, dtype=torch.bool)
    inside[strided_view(torch.arange(n), case).reshape(-1)] = True
    outside = (~inside).to(device)
    # (as rows of bytes: boolean indexing of float8 needs torch >= 2.10)
    as_rows = lambda t: t.view(torch.uint8).view(n, esize)
    assert_same_bytes(as_rows(base)[outside], as_rows(before)[outside])
