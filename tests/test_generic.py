"""permute_ on large one-shot permutations, every form of plan and path,
byte for byte against torch's gather: the CPU gather of narrow units (lines
of at most 4 bytes, no plan), the cycle plan's narrow-unit mover (one line
of up to 64 bytes) and its tiles (wider), on random, structured (few long
cycles, many 2-cycles, identity, one cycle) and adversarial permutations
(against the plan builder's landmarks: units 0, 64, 128, ... below 2^20
units), serial and threaded. Tensors are poisoned nowhere: permute_ is in
place, so the input is the random bytes and the expected output a gather
of them."""

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import _ops

from conftest import NATIVE, assert_same_bytes, expect_path

N = 70_000  # over 2 x 32 Ki short cycles: a plan packs them


def one_cycle(n, gen):
    order = torch.randperm(n, generator=gen)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def pairs(n, gen):
    order = torch.randperm(n, generator=gen)
    perm = torch.arange(n)
    m = n // 2 * 2
    perm[order[0:m:2]], perm[order[1:m:2]] = order[1:m:2], order[0:m:2]
    return perm


def few_long_cycles(n, gen):
    order = torch.randperm(n, generator=gen)
    perm = torch.empty(n, dtype=torch.long)
    cuts = [0, n // 7, n // 3, n]
    for a, b in zip(cuts, cuts[1:]):
        perm[order[a:b]] = order[a:b].roll(-1)
    return perm


def landmark_free(n, gen):
    """One cycle through every index but the multiples of 64 (the builder's
    landmarks), which stay put: no walk from a landmark meets it."""
    idx = torch.arange(n)
    others = idx[idx % 64 != 0]
    others = others[torch.randperm(len(others), generator=gen)]
    perm = idx.clone()
    perm[others] = others.roll(-1)
    return perm


def consecutive_cycles(n, length):
    """(0 1 .. length-1)(length ..) ...: walks from neighbouring starts meet."""
    idx = torch.arange(n)
    nxt = idx + 1
    ends = (idx % length == length - 1) | (idx == n - 1)
    nxt[ends] = idx[ends] - idx[ends] % length
    return nxt


PERMS = {
    "random": lambda n, gen: torch.randperm(n, generator=gen),
    "one cycle": one_cycle,
    "pairs": pairs,
    "few long cycles": few_long_cycles,
    "identity": lambda n, gen: torch.arange(n),
    "landmark-free": landmark_free,
    "consecutive 63-cycles": lambda n, gen: consecutive_cycles(n, 63),
    "shift by 64": lambda n, gen: (torch.arange(n) + 64) % n,
}

# (shape, dim, dtype): the gather path (lines of 1, 2, 3 and 4 bytes, a
# stride-1 dim whose rows are too wide to stage), the narrow mover (one line
# of 5..64 bytes) and the tiles (65 bytes, several lines a unit).
LAYOUTS = [
    ((N * 8,), 0, torch.uint8),  # rows over the column engine's 512 KiB: gathered
    ((3, N * 4), 1, torch.int16),  # stride 1, rows of 560 KB: gathered, units of 3 lines of 2 bytes
    ((N, 3), 0, torch.uint8),
    ((N, 2), 0, torch.int16),
    ((N, 5), 0, torch.uint8),
    ((N, 2), 0, torch.int64),
    ((N, 24), 0, torch.uint8),
    ((N, 16), 0, torch.float32),
    ((N, 65), 0, torch.uint8),
    ((4, N, 2), 1, torch.uint8),  # units of 4 lines of 2 bytes
    ((4, N, 8), 1, torch.uint8),  # units of 4 lines of 8 bytes: tiles
]


@pytest.mark.skipif(not NATIVE, reason="the native paths")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"{list(l[0])}-dim{l[1]}-{l[2]}".replace(" ", ""))
@pytest.mark.parametrize("kind", list(PERMS))
def test_large_permutations_match_the_gather(kind, layout, threads, gen):
    shape, dim, dtype = layout
    base = torch.randint(-(1 << 30), 1 << 30, shape, generator=gen).to(dtype)
    perm = PERMS[kind](shape[dim], gen)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for again in range(2):  # a first call, then the same perm again (its plan, if any, found)
            t = base.clone()
            expected = t.index_select(dim, perm)
            if kind == "identity":  # nothing to move: no path need serve it
                fp.permute_(t, perm, dim)
            else:
                with expect_path("cpu"):
                    fp.permute_(t, perm if again == 0 else perm.clone(), dim)
            assert_same_bytes(t, expected)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not NATIVE, reason="the native paths")
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_the_gather_path_checks_perm_before_moving(dtype, gen):
    n = N * 8  # a row past the column engine's 512 KiB: gathered
    t = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    before = t.clone()
    _ops._C.clear_plan_caches()
    cpu = _ops.path_counts()["cpu"]
    for bad, words in [
        (torch.zeros(n), "more than once"),
        (torch.arange(n) + 1, "out of range"),
        (torch.arange(n).flip(0) - 1, "out of range"),
        (torch.arange(n) % (n - 1), "more than once"),
    ]:
        with pytest.raises(ValueError, match=words):
            fp.permute_(t, bad.to(dtype), 0)
        assert_same_bytes(t, before)
    assert _ops.path_counts()["cpu"] == cpu and _ops._C.plan_stats()["prepared"] == 0  # nothing moved or planned


@pytest.mark.skipif(not NATIVE, reason="the native paths")
def test_narrow_units_gather_without_a_plan(gen):
    """Lines of at most 4 bytes gather straight from perm: nothing planned or kept."""
    _ops._C.clear_plan_caches()
    built = _ops._C.plan_stats()["built"]
    for shape, dim in [((N * 8,), 0), ((N, 4), 0), ((3, N * 8), 1)]:
        t = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        perm = torch.randperm(shape[dim], generator=gen)
        expected = t.index_select(dim, perm)
        fp.permute_(t, perm.int(), dim)
        assert_same_bytes(t, expected)
    assert _ops._C.plan_stats()["built"] == built
    assert _ops._C.plan_stats()["prepared"] == 0


@pytest.mark.skipif(not NATIVE, reason="the native paths")
def test_a_perm_inside_the_tensor_it_permutes(gen):
    """perm a row of self: read once, before any byte of self moves (the
    gather path reads perm on every pass, so it leaves such a perm alone)."""
    n = 140_000  # int32 rows of 560 KB: past the column engine
    t = torch.randint(0, 1 << 30, (4, n), dtype=torch.int32, generator=gen)
    t[0] = torch.randperm(n, generator=gen).int()
    expected = t.index_select(1, t[0].long())
    fp.permute_(t, t[0], 1)
    assert_same_bytes(t, expected)


def test_a_perm_sharing_memory_with_the_tensor_through_another_storage(gen):
    """The same as above through another storage (torch.frombuffer over
    self's memory, as from_numpy or DLPack give): the gather path, which
    reads perm on every pass, must see the shared bytes, not the storage."""
    n = 140_000
    t = torch.randint(0, 1 << 30, (4, n), dtype=torch.int32, generator=gen)
    t[0] = torch.randperm(n, generator=gen).int()
    perm = torch.frombuffer(t.numpy(), dtype=torch.int32, count=n)  # row 0, a storage of its own
    assert perm.data_ptr() == t.data_ptr() and perm.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    expected = t.index_select(1, perm.long())
    fp.permute_(t, perm, 1)
    assert_same_bytes(t, expected)
