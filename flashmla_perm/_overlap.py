"""Exact overlap of strided byte sets, the Python twin of csrc/overlap.{h,cpp}:
the same search, step for step (order, budget, overflow), so the native and
the fallback ops refuse the same layouts. A layout is (offset, element_size,
[(size, pitch), ...]) in bytes.

Overlap is a bounded subset-sum problem: the search divides out gcds, merges
dims whose sums leave no gaps, and fixes the largest pitch's index (one choice
when that pitch exceeds the span of the rest, which decides every layout torch
makes by slicing, transposing, padding or narrowing one buffer in about
O(dims^2)). Where several choices remain it tries them all, visiting at most
OVERLAP_BUDGET sub-problems, and otherwise answers UNKNOWN (callers refuse)."""

import math

_I64 = (-(1 << 63), (1 << 63) - 1)
OVERLAP_BUDGET = 1 << 20  # sub-problems the search may visit (csrc/overlap.h)
NO, YES, UNKNOWN = "no", "yes", "unknown"


class _Overflow(Exception):
    """A value past int64, where csrc/overlap.cpp answers UNKNOWN too."""


def _i64(v: int) -> int:
    if not _I64[0] <= v <= _I64[1]:
        raise _Overflow
    return v


def _span(dims) -> int:
    total = 0
    for size, pitch in dims:
        total = _i64(total + _i64((size - 1) * pitch))
    return total


def _reach(target, dims, left):
    """Whether target = sum z_k * pitch_k, 0 <= z_k < size_k: csrc/overlap.cpp's
    reach, step for step (same order, same budget). left: [sub-problems left]."""
    left[0] -= 1
    if left[0] < 0:
        return UNKNOWN
    dims = [(m, p) for m, p in dims if m > 1 and p != 0]
    span = _span(dims)
    if target < 0 or target > span:
        return NO
    if not dims:
        return YES if target == 0 else NO
    g = 0
    for _, p in dims:
        g = math.gcd(g, p)
    if target % g:
        return NO
    target //= g
    dims = sorted(((m, p // g) for m, p in dims), key=lambda d: d[1])  # stable, by pitch
    merged = True
    while merged:  # q = k * p, k <= m_p: no gaps, one dim
        merged = False
        for j in range(1, len(dims)):
            for i in range(j):
                if dims[j][1] % dims[i][1]:
                    continue
                k = dims[j][1] // dims[i][1]
                if k > dims[i][0] or not _I64[0] <= k * (dims[j][0] - 1) + dims[i][0] <= _I64[1]:
                    continue
                dims[i] = (dims[i][0] + k * (dims[j][0] - 1), dims[i][1])
                del dims[j]
                merged = True
                break
            if merged:
                break
    if len(dims) == 1:
        return YES
    size, pitch = dims.pop()
    rest = _span(dims)
    lo = 0 if target <= rest else (target - rest - 1) // pitch + 1
    hi = min(size - 1, target // pitch)
    unknown = False
    for z in range(lo, hi + 1):
        if left[0] <= 0:
            return UNKNOWN
        o = _reach(target - z * pitch, dims, left)
        if o == YES:
            return o
        unknown = unknown or o == UNKNOWN
    return UNKNOWN if unknown else NO


def _normalised(offset, dims):
    """Negative pitches flipped (offset to the lowest element), one-index dims out."""
    out = []
    for size, pitch in dims:
        if size == 1:
            continue
        if pitch < 0:
            if pitch == _I64[0]:
                raise _Overflow
            offset = _i64(offset + _i64((size - 1) * pitch))
            pitch = -pitch
        out.append((size, pitch))
    return offset, out


def _meet(a, b, left):
    """(offset, element_size, [(size, pitch)]) in bytes: some byte in both."""
    (a0, ea, da), (b0, eb, db) = a, b
    if any(m <= 0 for m, _ in da) or any(m <= 0 for m, _ in db):
        return NO
    try:
        a0, da = _normalised(a0, da)
        b0, db = _normalised(b0, db)
        target = _i64(_i64(_i64(b0 - a0) + _span(db)) + eb - 1)
        dims = da + db + [(_i64(ea + eb - 1), 1)]
        return _reach(target, dims, left)
    except _Overflow:
        return UNKNOWN


def byte_overlap(a, b, budget=OVERLAP_BUDGET) -> str:
    """NO / YES / UNKNOWN: some byte belongs to both layouts (csrc/overlap.h)."""
    return _meet(a, b, [budget])


def byte_self_overlap(t, budget=OVERLAP_BUDGET) -> str:
    """NO / YES / UNKNOWN: some byte belongs to two distinct elements. For the
    last dim (by pitch) where two elements differ, the one d >= 1 steps further
    along it meets the other over the dims before it (csrc/overlap.cpp)."""
    offset, es, dims = t
    if any(m <= 0 for m, _ in dims):
        return NO
    try:
        _, dims = _normalised(0, dims)
    except _Overflow:
        return UNKNOWN
    dims.sort(key=lambda d: d[1])
    left, unknown = [budget], False
    for k, (size, pitch) in enumerate(dims):
        inner = dims[:k]
        o = _meet((pitch, es, inner + [(size - 1, pitch)]), (0, es, inner), left)
        if o == YES:
            return o
        unknown = unknown or o == UNKNOWN
    return UNKNOWN if unknown else NO
