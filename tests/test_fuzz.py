"""Property-based: random shapes, dtypes, permutations (random, structured,
identity), storage offsets and row strides; the op's bytes equal the
reference's every time, and bytes around the view never move.

FLASHMLA_PERM_FUZZ_EXAMPLES sets the number of examples per test (CI: 1000)."""

import os

import pytest
import torch

pytest.importorskip("hypothesis")  # the GPU box has no hypothesis and no network
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

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
