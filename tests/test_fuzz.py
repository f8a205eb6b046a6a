"""Property-based: random shapes, dtypes, permutations (random, structured,
identity), storage offsets and row strides; the op's bytes equal the
reference's every time, and bytes around the view never move.

FLASHMLA_PERM_FUZZ_EXAMPLES sets the number of examples per test (CI: 1000).
Draws go to tensors that move: empty views and the identity get a small
fixed share each (about 1 in 25), labelled. `pytest
--hypothesis-show-statistics tests/test_fuzz.py` prints what the draws
covered: engine, longest cycle over 64 units (scratch), units of several
lines, lines wider than a GPU slice, rows wider than a CPU column tile."""

import math
import os

import pytest
import torch

pytest.importorskip("hypothesis")  # the GPU box has no hypothesis and no network
from hypothesis import HealthCheck, event, given, settings, strategies as st, target  # noqa: E402

import flashmla_perm as fp
from flashmla_perm import reference as ref

from conftest import DEVICES, DTYPES, assert_same_bytes

EXAMPLES = int(os.environ.get("FLASHMLA_PERM_FUZZ_EXAMPLES", "1000"))
ops = torch.ops.flashmla_perm

# Figures the labels compare with (csrc/plan.h, csrc/launch.h, csrc/launch.cpp).
K_MAX_SEGMENT = 64  # longer cycles are cut into segments, with scratch
K_MAX_UNIT_ROWS = 64  # indices grouped into one unit at most
GPU_SLICE = 128  # GPU row tiles cut lines into slices of this many bytes
CPU_COL_TILE = 4096  # CPU column tiles: rows wider than this are one per tile
SPECIAL_SHARE = 25  # 1 in this many draws is an empty view; as many the identity


def one_in(draw, k):
    """A draw in [0, k), about uniform: Hypothesis favours the bounds of an
    integer range (integers(0, 40) had made a quarter of all draws empty), so
    the draw is scrambled first, and its favourite, 0, lands on 3: an
    ordinary draw wherever this is used (k = 4, 6, 8, 25)."""
    return (draw(st.integers(0, 2**16 - 1)) * 40503 + 3) % 2**16 % k


def special(draw):
    """ "empty", "identity" or None: each special case in 1 of SPECIAL_SHARE draws."""
    k = one_in(draw, SPECIAL_SHARE)
    return "empty" if k == 1 else "identity" if k == 2 else None


def wide_row_extent(draw, dtype):
    """An extent whose row of `dtype` is over a CPU column tile."""
    esize = torch.empty((), dtype=dtype).element_size()
    return CPU_COL_TILE // esize + draw(st.integers(1, 300))


def row_unit(perm):
    """Indices per unit of the row engine (make_row_plan): the largest
    divisor <= 64 of the block size of perm."""
    n, g = len(perm), len(perm)
    for i in range(n):
        if g == 1:
            break
        if i == 0 or perm[i] != perm[i - 1] + 1:
            g = math.gcd(math.gcd(g, i), perm[i])
    return max(d for d in range(1, min(g, K_MAX_UNIT_ROWS) + 1) if g % d == 0)


def longest_cycle(perm, unit=1):
    """Longest cycle of perm over units of `unit` indices."""
    units, seen, longest = len(perm) // unit, set(), 0
    for start in range(units):
        n, u = 0, start
        while u not in seen:
            seen.add(u)
            u = perm[u * unit] // unit
            n += 1
        longest = max(longest, n)
    return longest


def label_rows(perm, unit_shape):
    """Events for the row engine's path; unit_shape(unit) is (lines,
    line_bytes) of a unit of `unit` indices."""
    unit = row_unit(perm)
    cycle = longest_cycle(perm, unit)
    unit_lines, line_bytes = unit_shape(unit)
    event(f"row engine: longest cycle {'over 64 units (scratch)' if cycle > K_MAX_SEGMENT else 'within a segment'}")
    event(f"row engine: {'units of several lines' if unit_lines > 1 else 'one line per unit'}")
    event(f"row engine: lines {'over' if line_bytes > GPU_SLICE else 'within'} a {GPU_SLICE}-byte GPU slice")
    if cycle > K_MAX_SEGMENT and unit_lines > 1 and line_bytes > GPU_SLICE:
        event("row engine: long cycles x several lines x sliced lines (GPU)")
    # Capped at a segment and one: past it, longer cycles take no other path.
    target(float(min(cycle, K_MAX_SEGMENT + 1)), label="longest cycle (units), capped at 65")


def label_cols(row_bytes):
    event(f"column engine: rows {'over' if row_bytes > CPU_COL_TILE else 'within'} a {CPU_COL_TILE}-byte CPU tile")


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


# Permutations that move something (the identity is drawn as a special case).
KINDS = ["random", "reverse", "cycle", "blocks2", "blocks16", "q", "o"]


@st.composite
def cases(draw):
    case = dict(
        op=draw(st.sampled_from(["rows", "cols", "cols_out"])),
        dtype=draw(st.sampled_from(DTYPES + [torch.int64])),
        extent=draw(st.one_of(st.integers(2, 70), st.integers(65, 300), st.sampled_from([128, 256, 512, 1024, 4096]))),
        other=draw(st.integers(1, 40)),
        kind=draw(st.sampled_from(KINDS)),
        offset=draw(st.integers(0, 17)),
        pad=draw(st.integers(0, 9)),
        int32=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    if case["op"] != "rows" and one_in(draw, 6) == 0:  # rows over a CPU column tile
        case["extent"], case["other"] = wide_row_extent(draw, case["dtype"]), draw(st.integers(1, 8))
    edge = special(draw)
    if edge == "empty":
        case["other"] = 0
    elif edge == "identity":
        case["kind"] = "identity"
    return case


@pytest.mark.parametrize("device", DEVICES)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
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
    event(f"op {case['op']}")
    if other == 0:
        event("special: empty view")
    elif case["kind"] == "identity":
        event("special: identity")
    elif case["op"] == "rows":
        # A unit of g rows: one line where rows are contiguous, else g lines.
        label_rows(perm.tolist(), lambda g: (1, g * other * esize) if pad == 0 else (g, other * esize))
    else:
        label_cols(n * esize)
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
    sliced with a step, rows padded, at a storage offset; and a dim to permute,
    often past a segment (65-300 indices), now and then with rows past a CPU
    column tile."""
    # 1 in 4: the row engine's longest path (a cycle over 64 units, units of
    # several lines, lines over a GPU slice), which free draws reach rarely.
    # 1 in 8: the column engine with rows over a CPU column tile.
    path = one_in(draw, 8)
    long_path, wide_rows = path in (0, 1), path == 2
    rank = 3 if long_path else 1 + one_in(draw, 4)
    dtype = draw(st.sampled_from(DTYPES + [torch.int64]))
    dim = draw(st.integers(0, rank - 1))
    sizes = draw(
        st.lists(st.one_of(st.integers(1, 7), st.sampled_from([16, 33, 64, 100, 200])), min_size=rank, max_size=rank)
    )
    sizes[dim] = draw(
        st.one_of(st.integers(2, 7), st.sampled_from([16, 33, 64]), st.integers(65, 300), st.sampled_from([520, 1100]))
    )
    order = draw(st.permutations(range(rank)))  # innermost last
    steps = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    if draw(st.integers(0, 3)) == 0:  # a contiguous innermost dim (the column engine, if it is dim)
        steps[order[-1]] = 1
    esize = torch.empty((), dtype=dtype).element_size()
    if long_path:  # d strided, the innermost dim contiguous and 136-320 bytes, the third 2
        if order[-1] == dim:
            order = order[-1:] + order[:-1]
        inner = order[-1]
        sizes[dim] = draw(st.integers(65, 300))
        sizes[inner] = -(-draw(st.integers(136, 320)) // esize)
        for i in range(rank):
            steps[i] = 1
            if i not in (dim, inner):
                sizes[i] = 2
    elif wide_rows:  # d innermost and contiguous, its rows over a CPU column tile
        order = [i for i in order if i != dim] + [dim]
        sizes[dim], steps[dim] = wide_row_extent(draw, dtype), 1
    edge = special(draw)
    if edge == "empty":
        sizes[draw(st.integers(0, rank - 1))] = 0
    case = dict(
        sizes=sizes,
        order=order,
        steps=steps,
        starts=draw(st.lists(st.integers(0, 2), min_size=rank, max_size=rank)),
        pads=draw(st.lists(st.integers(0, 2), min_size=rank, max_size=rank)),
        offset=draw(st.integers(0, 17)),
        dim=dim - rank if draw(st.booleans()) else dim,  # negative dims too
        dtype=dtype,
        kind=(
            "identity"
            if edge == "identity"
            else "cycle"
            if long_path
            # (a random permutation's cycles may all be short)
            else draw(st.sampled_from(KINDS))
        ),
        int32=draw(st.booleans()),
        public=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    if long_path:  # no room around the third dim: the example stays under 200K elements
        third = next(i for i in range(rank) if i not in (dim, order[-1]))
        case["starts"][third] = case["pads"][third] = 0
        return case
    while _full_numel(case) > MAX_STORAGE:  # keep each example small: the other dims give way first
        others = [i for i in range(rank) if i != dim and sizes[i] > 1]
        i = max(others, key=lambda i: sizes[i]) if others else dim
        sizes[i] //= 2
    return case


MAX_STORAGE = 1 << 15  # elements of an example's storage (but a long path's)


def unit_shape(view, d, unit):
    """(lines, line_bytes) of a unit of `unit` indices of dim d, as
    csrc/strided.cpp's unit_views sees it: the unit's dims sorted by pitch,
    merged where one continues another, the innermost run contiguous."""
    esize = view.element_size()
    dims = [(view.shape[i], view.stride(i) * esize) for i in range(view.dim()) if i != d and view.shape[i] > 1]
    if unit > 1:
        dims.append((unit, view.stride(d) * esize))
    merged = []
    for size, pitch in sorted(dims, key=lambda x: x[1]):
        if merged and pitch == merged[-1][0] * merged[-1][1]:
            merged[-1] = (merged[-1][0] * size, merged[-1][1])
        else:
            merged.append((size, pitch))
    run = esize
    if merged and merged[0][1] == esize:
        run = merged.pop(0)[0] * esize
    return math.prod(size for size, _ in merged), run


def strided_view(base, case):
    """The drawn view of `base` (1-D): a contiguous block at `offset` holding
    the dims in `order`, each of full size start + step * (size - 1) + 1 + pad,
    permuted back to the logical order and sliced start::step."""
    sizes, order = case["sizes"], case["order"]
    full = [
        st_ + sp * max(s - 1, 0) + 1 + p for s, sp, st_, p in zip(sizes, case["steps"], case["starts"], case["pads"])
    ]
    block = base[case["offset"] : case["offset"] + math.prod(full)].view([full[d] for d in order])
    logical = block.permute([order.index(d) for d in range(len(sizes))])
    return logical[tuple(slice(st_, st_ + sp * s, sp) for s, sp, st_ in zip(sizes, case["steps"], case["starts"]))]


def _full_numel(case):
    full = [
        st_ + sp * max(s - 1, 0) + 1 + p
        for s, sp, st_, p in zip(case["sizes"], case["steps"], case["starts"], case["pads"])
    ]
    return case["offset"] + math.prod(full) + 5


@pytest.mark.parametrize("device", DEVICES)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
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
    perm = make_perm(case["kind"], case["sizes"][case["dim"]], gen)
    if view.numel() == 0:
        event("special: empty view")
    elif case["kind"] == "identity" or view.shape[d] == 1:
        event("special: identity")
    elif view.stride(d) == 1:
        label_cols(view.shape[d] * esize)
    else:
        label_rows(perm.tolist(), lambda g: unit_shape(view, d, g))
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
