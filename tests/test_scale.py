"""Concurrency and scale: threads sharing the plan cache, the cache's bound,
tensors over 2^31 bytes."""

import concurrent.futures

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import reference as ref

from conftest import assert_same_bytes, random_tensor


def test_eight_threads_share_the_plan_cache():
    """Eight threads permute distinct tensors at once (several head counts,
    so plans are built concurrently too); every result is exact."""

    def job(i):
        g = torch.Generator().manual_seed(i)
        heads = [1, 2, 4, 8][i % 4]
        w = random_tensor((heads * 512, 96), torch.float8_e4m3fn, gen=g)
        s = random_tensor((heads * 512, 3), torch.uint8, gen=g)
        ow = random_tensor((40, 8 * 128 * (1 + i % 3)), torch.float8_e4m3fn, gen=g)
        os_ = random_tensor((40, ow.shape[1] // 32), torch.uint8, gen=g)
        expected = [t.clone() for t in (w, s, ow, os_)]
        for _ in range(5):
            fp.permute_wq_b_(w, s, heads)
            ref.permute_wq_b_(expected[0], expected[1], heads)
            fp.permute_wo_a_(ow, os_)
            ref.permute_wo_a_(expected[2], expected[3])
        return [w, s, ow, os_], expected

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for got, expected in pool.map(job, range(8)):
            for a, b in zip(got, expected):
                assert_same_bytes(a, b)


COLUMN_BYTES = torch.randint(0, 256, (65536,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))


def row_values(rows):
    return ((rows * 131 + (rows >> 8)) & 255).to(torch.uint8)


def pattern(rows, cols):
    """Row r: random per-column bytes plus a per-row value (uint8 wrap), its
    first 4 bytes replaced by r itself, so that every row differs."""
    t = COLUMN_BYTES[:cols][None, :] + row_values(rows)[:, None]
    t[:, :4] = rows.to(torch.int32)[:, None].view(torch.uint8)
    return t


BIG = 2**31 + 2**20  # bytes: offsets past 2^31 are exercised


@pytest.mark.parametrize("kind", ["rows", "cols"])
def test_tensor_over_2_31_bytes(kind):
    """wq_b rows / wo_a columns of a weight over 2^31 bytes, checked in
    chunks against the pattern it was filled with (no full reference copy)."""
    heads = 64
    cols = 65536 if kind == "rows" else 4096
    rows = heads * 528 if kind == "rows" else -(-BIG // cols)  # 2.2e9 bytes either way
    w = torch.empty((rows, cols), dtype=torch.uint8)
    s = torch.empty((rows, cols // 32), dtype=torch.uint8)
    assert w.numel() > 2**31
    chunk = max(1, 2**26 // cols)
    spans = [(r0, min(r0 + chunk, rows)) for r0 in range(0, rows, chunk)]
    for a, b in spans:
        w[a:b] = pattern(torch.arange(a, b), cols)
        s[a:b] = pattern(torch.arange(a, b), cols // 32)
    if kind == "rows":
        fp.permute_wq_b_(w, s, heads)
        perm = fp.q_fused_permutation(heads, rows // heads)
        for a, b in spans:
            assert torch.equal(w[a:b], pattern(perm[a:b], cols))
            assert torch.equal(s[a:b], pattern(perm[a:b], cols // 32))
    else:
        fp.permute_wo_a_(w, s)
        perm, chunk_perm = fp.o_fused_permutation(), fp.o_fused_chunk_permutation()
        for a, b in spans:
            # first 4 bytes of each row: the row index, moved with its chunk
            expected = pattern(torch.arange(a, b), cols)[:, perm]
            assert torch.equal(w[a:b], expected)
            assert torch.equal(s[a:b], pattern(torch.arange(a, b), cols // 32)[:, chunk_perm])
