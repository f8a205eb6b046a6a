"""The row engine where small tensors never take it: cycles longer than a
segment (scratch), units of several lines, and units cut into tiles across
their lines and across the bytes of each line. The CPU executor cuts a unit
into tiles only past its 128 KiB tile budget (csrc/launch.cpp,
kCpuRowBudget), so these tensors are tens of MiB: large enough to reach each
path (sized when that budget was 512 KiB). Byte for byte against the reference,
random bytes, on every device (the GPU planner slices far smaller units,
which the tile harness covers too).

A transposed [200, 2, 409600] uint8 view permuted along dim 0 by one
200-cycle (164 MB) takes the first path below, as [70, 2, 266240] does
(65 units would do: one more than a segment)."""

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import reference as ref

from conftest import DEVICES, assert_same_bytes, expect_path, random_tensor

# Mirrors of the figures that decide the path (csrc/plan.h, csrc/launch.cpp):
# a test that no longer reaches it fails here rather than passing vacuously.
K_MAX_SEGMENT = 64
K_PACK_CYCLES_ABOVE = 32 * 1024  # kPackCyclesAbove: more short cycles than this share segments
CPU_ROW_BUDGET = 128 * 1024  # kCpuRowBudget: kCpuStagingBudget / 4


def cpu_row_tiles(lines, line_bytes):
    """(slice_lines, slice_bytes) of cpu_row_job for a unit of `lines` lines
    of `line_bytes` bytes."""

    def ceil_div(a, b):
        return -(-a // b)

    def even_piece(count, most, align):
        if count <= most:
            return count
        most = max(align, most // align * align)
        return min(count, ceil_div(ceil_div(count, ceil_div(count, most)), align) * align)

    slice_bytes = even_piece(line_bytes, max(16, CPU_ROW_BUDGET // lines), 16)
    return even_piece(lines, max(1, CPU_ROW_BUDGET // slice_bytes), 1), slice_bytes


def cycles(perm):
    """Cycle lengths of perm (fixed points included)."""
    seen, lengths = set(), []
    for start in range(len(perm)):
        if start in seen:
            continue
        n, i = 0, start
        while i not in seen:
            seen.add(i)
            i = int(perm[i])
            n += 1
        lengths.append(n)
    return lengths


def one_cycle(n, gen):
    order = torch.randperm(n, generator=gen)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def long_and_short_cycles(n, gen):
    """One cycle through 65..n-5 indices, the rest in short cycles and fixed points."""
    order = torch.randperm(n, generator=gen)
    long = int(torch.randint(K_MAX_SEGMENT + 1, n - 4, (1,), generator=gen))
    perm = torch.arange(n)
    perm[order[:long]] = order[:long].roll(-1)
    rest = order[long:]
    perm[rest[:3]] = rest[:3].roll(-1)  # a 3-cycle; the others stay put
    return perm


def cycles_of_lengths(n, lengths, gen):
    """A permutation of n whose cycles have the given lengths (through random
    indices), the indices left over fixed points."""
    order = torch.randperm(n, generator=gen)
    ends = lengths.cumsum(0)
    starts = ends - lengths
    used = int(ends[-1])
    nxt = torch.arange(1, used + 1)
    nxt[ends - 1] = starts  # a cycle's last index points back at its first
    perm = torch.arange(n)
    perm[order[:used]] = order[nxt]
    return perm


def check(base, view_of, perm, dim, device):
    """Permutes view_of(base) along `dim` and compares every byte of base
    (bytes outside the view included) with the reference on a copy."""
    expected = base.clone()
    ref.permute_(view_of(expected), perm, dim)
    with expect_path(device):
        fp.permute_(view_of(base), perm, dim)
    assert_same_bytes(base, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("perm_kind", ["one cycle", "long and short cycles"])
def test_long_cycles_of_two_line_units_with_sliced_lines(device, perm_kind, gen):
    """[70, 2, 266240] as a transpose of [2, 70, 266240]: a unit (index of
    dim 0) is 2 lines of 266240 bytes, 70 * 266240 apart; the CPU cuts each
    line into slices (5 of them), so a tile reads scratch lines a whole line apart
    while it writes only a slice of each."""
    n, lines, line_bytes = 70, 2, 266240
    base = random_tensor((lines, n, line_bytes), torch.uint8, device, gen)
    perm = one_cycle(n, gen) if perm_kind == "one cycle" else long_and_short_cycles(n, gen)
    assert max(cycles(perm)) > K_MAX_SEGMENT
    slice_lines, slice_bytes = cpu_row_tiles(lines, line_bytes)
    assert slice_lines == lines and slice_bytes < line_bytes  # several lines per tile, lines sliced
    check(base, lambda t: t.transpose(0, 1), perm, 0, device)


@pytest.mark.parametrize("device", DEVICES)
def test_long_cycle_of_many_line_units_cut_across_lines(device, gen):
    """A unit of 33000 padded lines of 16 bytes (pitch 17): the CPU cuts it
    into 2 tiles of 16500 lines, so the second tile's scratch and lines start
    half a unit in."""
    n, lines, line_bytes, pitch = 66, 33000, 16, 17
    base = random_tensor((n, lines, pitch), torch.uint8, device, gen)
    perm = one_cycle(n, gen)
    slice_lines, slice_bytes = cpu_row_tiles(lines, line_bytes)
    assert slice_lines < lines and slice_bytes == line_bytes
    check(base, lambda t: t[:, :, :line_bytes], perm, 0, device)


@pytest.mark.parametrize("device", DEVICES)
def test_long_cycle_of_wide_two_dim_units(device, gen):
    """Units of 3 x 2 lines that do not merge (two dims of lines, 4-byte
    elements, rows padded), 90 KiB lines cut in two, permuted along a middle
    dim: [3, 68, 2, 23040 + pad] float32, dim 1, one 68-cycle."""
    n, width = 68, 23040
    base = random_tensor((3, n, 2, width + 3), torch.float32, device, gen)
    slice_lines, slice_bytes = cpu_row_tiles(6, 4 * width)
    assert slice_lines == 6 and slice_bytes < 4 * width
    check(base, lambda t: t[..., :width], one_cycle(n, gen), 1, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["rows", "two-line units"])
def test_many_short_cycles_share_segments(device, layout, gen):
    """More short cycles (2 to 32 indices) than kPackCyclesAbove: the plan
    packs whole cycles of one length into shared segments (a segment start
    each would cost up to 2 bytes an index), so a tile rotates several
    cycles, each back to its own first unit. With a cycle over 64 units
    (scratch) and fixed points; rows of 6 bf16, and units of two lines."""
    lengths = torch.randint(2, 33, (40000,), generator=gen)
    assert len(lengths) > K_PACK_CYCLES_ABOVE
    lengths = torch.cat([lengths, torch.tensor([1000])])
    n = int(lengths.sum()) + 77
    perm = cycles_of_lengths(n, lengths[torch.randperm(len(lengths), generator=gen)], gen)
    if layout == "rows":
        check(random_tensor((n, 6), torch.bfloat16, device, gen), lambda t: t, perm, 0, device)
    else:  # [2, n, 5] seen as [n, 2, 5]: a unit is 2 lines of 5 bytes, n * 5 apart
        check(random_tensor((2, n, 5), torch.uint8, device, gen), lambda t: t.transpose(0, 1), perm, 0, device)
