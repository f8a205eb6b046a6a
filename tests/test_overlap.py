"""Exact overlap checks (csrc/overlap.h, flashmla_perm/_overlap.py): two
tensors are refused iff some byte belongs to both, one tensor iff two of its
elements share a byte, for any strides and offsets. The native rule and the
Python rule are held against a brute-force set of bytes and against each
other; the ops refuse overlapping weights and scales and leave every byte as
it was, and accept (and permute exactly as the reference) disjoint ones,
interleaved layouts included.

FLASHMLA_PERM_FUZZ_EXAMPLES sets the number of examples per property test."""

import itertools
import os

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import _checks, _ops, _overlap
from flashmla_perm import reference as ref

from conftest import as_bytes, assert_same_bytes, random_tensor

EXAMPLES = int(os.environ.get("FLASHMLA_PERM_FUZZ_EXAMPLES", "1000"))
NATIVE = _ops._C is not None  # the native rule, even where the ops are forced onto the reference
DTYPE_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def native_rule(a, b=None):
    return _ops._C.byte_overlap(a, b)


# --- the audit's cases, through the model ops --------------------------------


def _refused_unchanged(buffer, call, names):
    before = buffer.clone()
    with pytest.raises(ValueError, match=f"{names[0]} and {names[1]} share memory"):
        call()
    assert torch.equal(as_bytes(buffer), as_bytes(before)), "a refused call moved bytes"


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e4m3fn])
@pytest.mark.parametrize("cols", [slice(100, 104), slice(124, 128), slice(127, 131), slice(0, 4)])
def test_wq_b_weight_and_scale_sharing_bytes_are_refused(dtype, cols):
    b = random_tensor((4096, 256), dtype)
    _refused_unchanged(b, lambda: fp.permute_wq_b_(b[:, :128], b[:, cols], 8), ("weight", "weight_scale"))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e4m3fn])
@pytest.mark.parametrize("cols", [slice(4000, 4128), slice(3968, 4096), slice(4095, 4223)])
def test_wo_a_weight_and_scale_sharing_bytes_are_refused(dtype, cols):
    b = random_tensor((64, 4352), dtype)
    _refused_unchanged(b, lambda: fp.permute_wo_a_(b[:, :4096], b[:, cols], 8), ("weight", "weight_scale"))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e4m3fn])
@pytest.mark.parametrize("cols", [slice(128, 132), slice(200, 204), slice(252, 256)])
def test_wq_b_disjoint_views_of_one_buffer_are_permuted(dtype, cols):
    b = random_tensor((4096, 256), dtype)
    expected = b.clone()
    ref.permute_wq_b_(expected[:, :128], expected[:, cols], 8)
    fp.permute_wq_b_(b[:, :128], b[:, cols], 8)
    assert_same_bytes(b, expected)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e4m3fn])
def test_wo_a_disjoint_views_of_one_buffer_are_permuted(dtype):
    b = random_tensor((64, 4352), dtype)
    expected = b.clone()
    ref.permute_wo_a_(expected[:, :4096], expected[:, 4096:4224], 8)
    fp.permute_wo_a_(b[:, :4096], b[:, 4096:4224], 8)
    assert_same_bytes(b, expected)


def test_wq_b_rows_interleaved_with_the_scale_rows():
    # weight on even rows, scale in the odd rows' first bytes: disjoint, and
    # no byte-span test can tell (each lies within the other's span).
    b = random_tensor((2048, 64), torch.uint8)
    w, s = b[0::2], b[1::2, :2]
    expected = b.clone()
    ref.permute_wq_b_(expected[0::2], expected[1::2, :2], 2)
    fp.permute_wq_b_(w, s, 2)
    assert_same_bytes(b, expected)
    _refused_unchanged(b, lambda: fp.permute_wq_b_(b[0::2], b[0::2, 60:62], 2), ("weight", "weight_scale"))


def test_self_disjoint_interleaved_layout_is_permuted():
    # Offsets {0, 2, 4, 3, 5, 7}: no element shared, but no dim's pitch clears
    # the other's span; the engines permute a packed copy.
    for dim in (0, 1):
        base = random_tensor((16,), torch.uint8)
        expected = base.clone()
        perm = torch.randperm((2, 3)[dim])
        ref.permute_(expected.as_strided((2, 3), (3, 2)), perm, dim)
        fp.permute_(base.as_strided((2, 3), (3, 2)), perm, dim)
        assert_same_bytes(base, expected)


# --- the rule against brute force --------------------------------------------


def brute_bytes(layout):
    """Per element, the set of bytes it covers."""
    offset, es, dims = layout
    elements = []
    for index in itertools.product(*(range(m) for m, _ in dims)):
        start = offset + sum(i * p for i, (_, p) in zip(index, dims))
        elements.append(set(range(start, start + es)))
    return elements


def brute_pair(a, b):
    in_a = set().union(*brute_bytes(a))
    return "yes" if any(in_a & e for e in brute_bytes(b)) else "no"


def brute_self(t):
    seen = set()
    for e in brute_bytes(t):
        if seen & e:
            return "yes"
        seen |= e
    return "no"


def test_rule_on_known_layouts():
    cases = [
        ((0, 1, ((4096, 256), (128, 1))), (100, 1, ((4096, 256), (4, 1))), "yes"),
        ((0, 1, ((4096, 256), (128, 1))), (128, 1, ((4096, 256), (4, 1))), "no"),
        ((0, 1, ((2048, 512), (64, 1))), (256, 1, ((2048, 512), (2, 1))), "no"),
        ((0, 1, ((4, 4), (4, 1))), (0, 1, ((4, 1), (4, 4))), "yes"),  # transposed
        ((0, 2, ((3, 6),)), (3, 2, ((3, 6),)), "no"),  # every other 2-byte element
        ((0, 2, ((3, 6),)), (1, 2, ((3, 6),)), "yes"),  # misaligned by one byte
        ((0, 1, ((5, -2),)), (-7, 1, ((2, 1),)), "yes"),  # negative pitch: 0, -2, ..., -8
    ]
    for a, b, want in cases:
        assert _overlap.byte_overlap(a, b) == want == brute_pair(a, b), (a, b)
        if NATIVE:
            assert native_rule(a, b) == want, (a, b)
    selves = [
        ((0, 1, ((2, 3), (3, 2))), "no"),
        ((0, 1, ((4, 3), (4, 2))), "yes"),
        ((0, 4, ((3, 4), (2, 2))), "yes"),
        ((0, 1, ((8, 0),)), "yes"),
        ((0, 1, ((1, 0), (5, 1))), "no"),
        ((0, 1, ((0, 0), (5, 0))), "no"),
    ]
    for t, want in selves:
        assert _overlap.byte_self_overlap(t) == want == brute_self(t), t
        if NATIVE:
            assert native_rule(t) == want, t


def test_torch_layouts_are_decided_fast():
    # Views of one buffer (narrowed, strided, transposed, padded): decided in
    # a handful of sub-problems, far below the search's budget.
    big = (0, 1, ((1 << 20, 4096), (4096, 1)))
    pairs = [
        (big, (2048, 1, ((1 << 20, 4096), (2048, 1)))),
        ((0, 1, ((1 << 19, 8192), (4096, 1))), (4096, 1, ((1 << 19, 8192), (4096, 1)))),
        ((0, 2, ((4096, 2), (1 << 18, 8192))), (8, 2, ((1 << 18, 16384), (4, 2)))),
    ]
    for a, b in pairs:
        for budget in (64,):
            assert _overlap.byte_overlap(a, b, budget) != "unknown", (a, b)
    for t in [big, (0, 2, ((4096, 2), (1 << 18, 8192))), (0, 1, ((64, 1), (64, 4096), (8, 64)))]:
        assert _overlap.byte_self_overlap(t, 64) != "unknown", t


def test_search_gives_up_as_unknown_and_refuses():
    # Many tries with no answer: the bounded search says so, and both rules agree.
    t = (0, 1, ((182, 34639), (187, 40186), (115, 22443)))
    assert _overlap.byte_self_overlap(t, 1000) == "unknown"
    assert _overlap.byte_self_overlap(t) == "no"
    if NATIVE:
        assert native_rule(t) == "no"


def test_both_rules_give_up_on_the_same_layout():
    from test_bad_input import UNDECIDED

    t = (0, 1, UNDECIDED)
    assert _overlap.byte_self_overlap(t) == "unknown"
    if NATIVE:
        assert native_rule(t) == "unknown"


hypothesis = pytest.importorskip("hypothesis")  # the GPU box has no hypothesis
from hypothesis import HealthCheck, assume, event, given, settings, strategies as st  # noqa: E402

BUFFER = 96  # bytes every drawn layout lies in


@st.composite
def layouts(draw, negative=False):
    es = draw(st.sampled_from([1, 2, 4]))
    rank = draw(st.integers(1, 4))
    low = -6 if negative else 0
    sizes = [draw(st.integers(0, 5) if rank > 1 else st.integers(0, 12)) for _ in range(rank)]
    strides = [draw(st.integers(low, 9)) for _ in range(rank)]
    lo = sum((m - 1) * s for m, s in zip(sizes, strides) if m > 0 and s < 0)
    hi = sum((m - 1) * s for m, s in zip(sizes, strides) if m > 0 and s > 0)
    cap = BUFFER // es
    assume(hi - lo < cap)
    offset = draw(st.integers(-lo, cap - 1 - hi))
    return offset, es, tuple((m, s * es) for m, s in zip(sizes, strides)), offset * es


def rule_layout(drawn):
    _, es, dims, byte_offset = drawn
    return byte_offset, es, dims


def tensor_of(buffer, drawn):
    offset, es, dims, _ = drawn
    return buffer.view(DTYPE_OF_SIZE[es]).as_strided([m for m, _ in dims], [p // es for _, p in dims], offset)


def describe(a, b=None):
    dims = a[2] + (b[2] if b else ())
    event(f"rank {len(a[2])}" + (f"+{len(b[2])}" if b else ""))
    pitches = [abs(p) for m, p in dims if m > 1 and p]
    nested = all(max(p, q) % min(p, q) == 0 for p, q in itertools.combinations(pitches, 2))
    event("nested pitches" if nested else "interleaved pitches")


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(a=layouts(negative=True), b=layouts(negative=True))
def test_pair_rule_is_exact(a, b):
    a, b = rule_layout(a), rule_layout(b)
    want = brute_pair(a, b)
    describe(a, b)
    event(f"pair overlaps: {want}")
    assert _overlap.byte_overlap(a, b) == want
    if NATIVE:
        assert native_rule(a, b) == want


@SETTINGS
@given(t=layouts(negative=True))
def test_self_rule_is_exact(t):
    t = rule_layout(t)
    want = brute_self(t)
    describe(t)
    event(f"self overlaps: {want}")
    assert _overlap.byte_self_overlap(t) == want
    if NATIVE:
        assert native_rule(t) == want


@SETTINGS
@given(a=layouts(), b=layouts())
def test_pair_check_on_views_of_one_buffer(a, b):
    buffer = torch.zeros(BUFFER, dtype=torch.uint8)
    ta, tb = tensor_of(buffer, a), tensor_of(buffer, b)
    want = brute_pair(rule_layout(a), rule_layout(b))
    event(f"views overlap: {want}")
    if want == "yes":
        with pytest.raises(ValueError, match="x and y share memory"):
            _checks.pair(ta, tb, "op", "x", "y")
    else:
        _checks.pair(ta, tb, "op", "x", "y")


@SETTINGS
@given(t=layouts(), data=st.data())
def test_permute_refuses_exactly_the_overlapping_views(t, data):
    # The op of whichever path is on: native check_writable, or the fallback's.
    buffer = random_tensor((BUFFER,), torch.uint8)
    view = tensor_of(buffer, t)
    dim = data.draw(st.integers(0, view.dim() - 1))
    perm = torch.tensor(data.draw(st.permutations(range(view.shape[dim]))), dtype=torch.long)
    want = brute_self(rule_layout(t))
    event(f"self overlaps: {want}")
    expected = buffer.clone()
    if want == "yes":
        with pytest.raises(ValueError, match="overlapping memory"):
            fp.permute_(view, perm, dim)
    else:
        ref.permute_(tensor_of(expected, t), perm, dim)
        fp.permute_(view, perm, dim)
    assert_same_bytes(buffer, expected)
