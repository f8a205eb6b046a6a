"""torch.ops.flashmla_perm.* generic ops against the reference gather, byte
for byte: every dtype and layout (all native)."""

import pytest
import torch

import flashmla_perm as fp
from flashmla_perm import reference as ref
from flashmla_perm._schemas import SCHEMAS

from conftest import DEVICES, DTYPES, assert_same_bytes, expect_native_if_moves, expect_path, poison, random_tensor

ops = torch.ops.flashmla_perm


def test_schemas_match_the_python_fallback():
    for name, schema in SCHEMAS.items():
        actual = getattr(ops, name).default._schema
        assert str(actual) == str(torch._C.parse_schema(f"flashmla_perm::{schema}")), name


def one_cycle(n, gen):
    """A single cycle through all n indices: the worst case for segments."""
    order = torch.randperm(n, generator=gen)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def block_perm(n, block, gen):
    """Blocks of `block` consecutive indices moved together (the Q shape)."""
    blocks = torch.randperm(n // block, generator=gen)
    return (blocks[:, None] * block + torch.arange(block)).reshape(-1)


PERMS = {
    "random": lambda n, g: torch.randperm(n, generator=g),
    "identity": lambda n, g: torch.arange(n),
    "reverse": lambda n, g: torch.arange(n - 1, -1, -1),
    "one_cycle": one_cycle,
    "blocks16": lambda n, g: block_perm(n, 16, g) if n % 16 == 0 else torch.randperm(n, generator=g),
    "int32": lambda n, g: torch.randperm(n, generator=g).to(torch.int32),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", list(PERMS))
@pytest.mark.parametrize("shape", [(1000, 37), (4096, 40), (257, 3, 5), (1000,), (64, 1280)])
def test_permute_rows_(device, dtype, kind, shape, gen):
    x = random_tensor(shape, dtype, device, gen)
    perm = PERMS[kind](shape[0], gen)
    expected = x.clone()
    ref.permute_rows_(expected, perm)
    with expect_native_if_moves(device, perm):
        ops.permute_rows_(x, perm)
    assert_same_bytes(x, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", list(PERMS))
@pytest.mark.parametrize("shape", [(100, 4096), (33, 128), (7, 5, 48), (1000,), (300, 37), (3, 20000)])
def test_permute_cols_(device, dtype, kind, shape, gen):
    x = random_tensor(shape, dtype, device, gen)
    perm = PERMS[kind](shape[-1], gen)
    expected = x.clone()
    ref.permute_cols_(expected, perm)
    with expect_native_if_moves(device, perm):
        ops.permute_cols_(x, perm)
    assert_same_bytes(x, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(100, 4096), (33, 128), (7, 5, 48), (1000,)])
def test_permute_cols_out_of_place(device, dtype, shape, gen):
    x = random_tensor(shape, dtype, device, gen)
    before = x.clone()
    perm = torch.randperm(shape[-1], generator=gen)
    poison(device, x.numel() * x.element_size())
    with expect_path(device):
        out = ops.permute_cols(x, perm)
    assert out.is_contiguous()
    assert_same_bytes(out, ref.permute_cols(x, perm))
    assert_same_bytes(x, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [1, 3, 8, 15])
def test_storage_offset_and_neighbours_untouched(device, offset, gen):
    """Views that break 16-byte alignment; bytes around the view stay put."""
    rows, cols = 515, 40
    base = random_tensor((rows * cols + 64,), torch.uint8, device, gen)
    expected = base.clone()
    view = base[offset : offset + rows * cols].view(rows, cols)
    perm = torch.randperm(rows, generator=gen)
    ref.permute_rows_(expected[offset : offset + rows * cols].view(rows, cols), perm)
    with expect_path(device):
        ops.permute_rows_(view, perm)
    assert_same_bytes(base, expected)

    cperm = torch.randperm(cols, generator=gen)
    ref.permute_cols_(expected[offset : offset + rows * cols].view(rows, cols), cperm)
    with expect_path(device):
        ops.permute_cols_(view, cperm)
    assert_same_bytes(base, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_row_strided_views_take_the_native_path(device, gen):
    """Rows with a stride wider than the row (a column slice) are native."""
    base = random_tensor((300, 200), torch.float8_e4m3fn, device, gen)
    expected = base.clone()
    view, eview = base[:, 8:136], expected[:, 8:136]
    perm_r, perm_c = torch.randperm(300, generator=gen), torch.randperm(128, generator=gen)
    ref.permute_rows_(eview, perm_r)
    ref.permute_cols_(eview, perm_c)
    with expect_path(device):
        ops.permute_rows_(view, perm_r)
        ops.permute_cols_(view, perm_c)
    assert_same_bytes(base, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_last_dim_is_native(device, gen):
    """A stepped last dim and the rows of a transposed tensor: native too."""
    base = random_tensor((64, 96), torch.bfloat16, device, gen)
    expected = base.clone()
    view, eview = base[:, ::2], expected[:, ::2]
    perm_c = torch.randperm(48, generator=gen)
    ref.permute_cols_(eview, perm_c)
    with expect_path(device):
        ops.permute_cols_(view, perm_c)
    assert_same_bytes(base, expected)
    t, et = base.t(), expected.t()  # rows of a transposed tensor are not contiguous
    perm_r = torch.randperm(96, generator=gen)
    ref.permute_rows_(et, perm_r)
    with expect_path(device):
        ops.permute_rows_(t, perm_r)
    assert_same_bytes(base, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("length", [2, 63, 64, 65, 128, 129, 1000, 20000])
def test_long_cycles_cut_into_segments(device, length, gen):
    """Cycles longer than a segment go through scratch; lengths around the
    segment size (64) check the cut points."""
    x = random_tensor((length, 24), torch.uint8, device, gen)
    perm = one_cycle(length, gen)
    expected = x.clone()
    ref.permute_rows_(expected, perm)
    with expect_path(device):
        ops.permute_rows_(x, perm)
    assert_same_bytes(x, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16])
@pytest.mark.parametrize("kind", ["random", "one cycle"])
def test_rows_too_wide_to_stage_take_the_row_form(device, dtype, kind, gen):
    """A stride-1 dim whose rows are over a CPU thread's staging budget
    (512 KiB) or a GPU tile buffer: permuted as cycles of columns, never
    staged whole (docs/api.md, "Memory bound")."""
    n = (600 << 10) // torch.tensor([], dtype=dtype).element_size()
    x = random_tensor((3, n), dtype, device, gen)
    perm = torch.randperm(n, generator=gen) if kind == "random" else one_cycle(n, gen)
    expected = x.clone()
    ref.permute_cols_(expected, perm)
    with expect_path(device):
        ops.permute_(x, perm, 1)
    assert_same_bytes(x, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_size_is_a_no_op(device):
    x = torch.empty((0, 16), dtype=torch.uint8, device=device)
    ops.permute_rows_(x, torch.empty(0, dtype=torch.long))
    y = torch.empty((5, 0), dtype=torch.uint8, device=device)
    ops.permute_rows_(y, torch.randperm(5))
    ops.permute_cols_(x, torch.randperm(16))
    assert ops.permute_cols(x, torch.randperm(16)).shape == (0, 16)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device, gen):
    # opcheck compares values with allclose: uint8 for the byte ops (float8 has no
    # arithmetic), NaN-free values for bf16.
    x = random_tensor((64, 48), torch.uint8, device, gen)
    cases = [
        (ops.permute_rows_.default, (x.clone(), torch.randperm(64, generator=gen))),
        (ops.permute_cols_.default, (x.clone(), torch.randperm(48, generator=gen))),
        (ops.permute_cols.default, (x.clone(), torch.randperm(48, generator=gen))),
        (
            ops.permute_wq_b_.default,
            (random_tensor((64, 96), torch.uint8, device, gen), random_tensor((64, 3), torch.uint8, device, gen), 2),
        ),
        (
            ops.permute_wo_a_.default,
            (
                random_tensor((16, 512), torch.uint8, device, gen),
                random_tensor((16, 16), torch.uint8, device, gen),
                8,
                True,
            ),
        ),
        (ops.permute_q.default, (torch.randn(3, 4, 64, generator=gen).to(device, torch.bfloat16),)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("device", DEVICES)
def test_meta_tensors_use_the_fake_kernels(device):
    w = torch.empty((1024, 64), dtype=torch.float8_e4m3fn, device="meta")
    s = torch.empty((1024, 2), dtype=torch.uint8, device="meta")
    fp.permute_wq_b_(w, s, 2)
    q = torch.empty((4, 8, 64), dtype=torch.bfloat16, device="meta")
    assert fp.permute_q_to_fused(q).shape == (4, 8, 64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("at", ["first", "last"])
def test_a_swap_at_either_end_still_moves(device, at, gen):
    """The identity moves nothing (the column plan says so and is skipped),
    so that must be decided on every index: the identity but for one swap,
    at either end, moves both."""
    n = 64
    perm = torch.arange(n)
    i = 0 if at == "first" else n - 2
    perm[[i, i + 1]] = perm[[i + 1, i]]
    x = random_tensor((5, n), torch.uint8, device, gen)
    assert_same_bytes(ops.permute_cols(x, perm), ref.permute_cols(x, perm))
    for op, reference in ((ops.permute_cols_, ref.permute_cols_), (ops.permute_rows_, ref.permute_rows_)):
        y = random_tensor((n, n), torch.uint8, device, gen)
        expected = y.clone()
        reference(expected, perm)
        op(y, perm)
        assert_same_bytes(y, expected)


# Thread A sets one thread for itself, then another Python thread sets
# torch's global count to 8. A's first call here sizes the CPU executor's
# tile arena for its count (1); the library's first parallel_for on the
# thread then resets A's OpenMP count to the global 8 (ATen's
# lazy_init_num_threads, inlined into this library with a flag of its own),
# and threads 1-7 of the tile loop must not take slots the arena does not
# have (an overrun there is a heap overflow: a segfault 4 runs in 4). In a
# process of its own: what it
# catches crashes.
THREAD_COUNT_CHANGES = """
import json, threading, torch, flashmla_perm
ops = torch.ops.flashmla_perm
a_set, b_set, out = threading.Event(), threading.Event(), {}
def a():
    torch.get_num_threads()
    torch.set_num_threads(1)
    a_set.set(); b_set.wait()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 256, (4096, 96), dtype=torch.uint8, generator=g)
    p = torch.randperm(4096, generator=g)
    expected = x[p].clone()
    ops.permute_rows_(x, p)
    y = torch.randint(1, 256, (512, 4096), dtype=torch.uint8, generator=g)
    q = torch.randperm(4096, generator=g)
    expected_cols = y[:, q].clone()
    ops.permute_cols_(y, q)
    out.update(rows=torch.equal(x, expected), cols=torch.equal(y, expected_cols),
               threads=torch.get_num_threads())
def b():
    a_set.wait(); torch.set_num_threads(8); b_set.set()
ta, tb = threading.Thread(target=a), threading.Thread(target=b)
ta.start(); tb.start(); ta.join(); tb.join()
print(json.dumps(out))
"""


def test_a_threads_count_changing_under_a_call_stays_in_its_buffers():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", THREAD_COUNT_CHANGES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rows"] and result["cols"], result
