"""The launches csrc/launch.cpp plans for the CUDA executor, read through
the native module's gpu_launches (device/model.py prices them): every CTA
resident at once, tiles that cover the bytes, the launch-plan fields the
executor's environment sets. No GPU needed."""

import pytest
import torch

import flashmla_perm
from conftest import LAUNCH_CASES
from flashmla_perm import _ops

needs_native = pytest.mark.skipif(not flashmla_perm.build_info()["native"], reason="native module not loaded")
DEVICES = [
    None,
    {"regs_per_thread": 92},
    {"regs_per_thread": 80},
    {"sm_count": 7, "max_ctas_per_sm": 3, "smem_per_sm": 100 * 1024},
]


@needs_native
@pytest.mark.parametrize("device", DEVICES, ids=lambda d: "default" if d is None else ",".join(map(str, d.values())))
@pytest.mark.parametrize("op,dims", LAUNCH_CASES, ids=lambda x: x if isinstance(x, str) else "x".join(map(str, x)))
def test_launch_figures(op, dims, device):
    sms = (device or {}).get("sm_count", 132)
    for launch in _ops._C.gpu_launches(op, dims, device):
        assert 1 <= launch["ctas_per_sm"]
        assert 0 < launch["grid"] <= sms * launch["ctas_per_sm"], launch  # every CTA resident at once
        assert launch["grid"] <= launch["tiles"], launch
        assert launch["tiles"] == sum(j["tiles"] for j in launch["jobs"]), launch
        for j in launch["jobs"]:
            assert 0 < j["inflight_bytes"] and j["max_tile_bytes"] * j["tiles"] >= j["bytes"], j
            if launch["kernel"] == "cols":
                assert j["slice_vectors"] == j["line_vectors"] == 0, j
            else:  # a tile is whole slices of lines: the model prices the row loops by them
                assert 0 < j["slice_vectors"] <= j["line_vectors"], j
                assert j["max_tile_bytes"] % (j["slice_vectors"] * j["vec"]) == 0, j


@needs_native
def test_device_fields_name_the_spec_gpu_launches_plans_with():
    """gpu_device_fields fills in every DeviceSpec field gpu_launches reads
    (an H200's where absent), and planning from its answer plans the same
    launches: the CUDA executor reports its spec in these names
    (cuda_device_fields), for the runtime tests to plan as it does."""
    h200 = _ops._C.gpu_device_fields()
    assert (h200["sm_count"], h200["smem_per_sm"], h200["regs_rows"], h200["regs_cols"]) == (132, 228 * 1024, 80, 56)
    assert (h200["row_stages"], h200["col_stages"]) == (2, 1)  # the default plan (csrc/launch.h)
    odd = {
        "sm_count": 7,
        "max_ctas_per_sm": 3,
        "smem_per_sm": 100 * 1024,
        "row_stages": 1,
        "col_stages": 2,
        "tile_budget": 8192,
    }
    full = _ops._C.gpu_device_fields({**odd, "regs_per_thread": 80})
    assert {k: full[k] for k in odd} == odd
    assert full["regs_rows"] == full["regs_save_heads"] == full["regs_cols"] == 80
    assert _ops._C.gpu_device_fields(full) == full
    for op, dims in LAUNCH_CASES:
        assert _ops._C.gpu_launches(op, dims, full) == _ops._C.gpu_launches(op, dims, {**odd, "regs_per_thread": 80})


@needs_native
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU answers")
def test_the_cuda_device_helpers_raise_where_no_gpu_answers():
    """The executor's own view of a GPU (its spec, the occupancy calculator)
    raises a RuntimeError without one: a CPU build says it has no CUDA
    kernels, a CUDA build that finds no driver (or too old a one) says so."""
    want = "CUDA driver" if flashmla_perm.build_info()["cuda"] else "without CUDA kernels"
    for call in (
        lambda: _ops._C.cuda_device_fields(0),
        lambda: _ops._C.cuda_resident_ctas_per_sm("rows", 128, 0, 0),
        lambda: _ops._C.cuda_driver_launches("wo_a", [1024, 4096, 8], 0),
    ):
        with pytest.raises(RuntimeError, match=want):
            call()


@needs_native
@pytest.mark.parametrize("kernel", ["rows", "cols"])  # the model ops plan no save_heads
def test_the_planner_refuses_a_kernel_that_reports_no_registers(kernel):
    """A driver (or a stand-in) that reports 0 registers per thread must not
    divide the planner by zero: it says which kernel."""
    op, dims = ("wo_a", [1024, 4096, 8]) if kernel == "cols" else ("wq_b", [64 * 512, 1280, 64])
    with pytest.raises(ValueError, match=f"cannot plan {kernel} with 0 registers"):
        _ops._C.gpu_launches(op, dims, {f"regs_{kernel}": 0})


@needs_native
def test_the_launches_say_which_column_jobs_gather_in_the_stage_loop():
    """gpu_launches reports the kernels' own choice (tile_bodies.h
    gathers_in_stage): the wo_a and wv weights (32-byte chunks) and
    permute_q gather in the stage loop; the scales (1-byte chunks) do not."""
    for op, dims, want in (
        ("wo_a", [1024, 4096, 8], [True, False]),
        ("wv_packed", [8, 1024, 4096, 8], [True, False]),
        ("permute_q", [4096, 64, 512, 2], [True]),
    ):
        jobs = [j for launch in _ops._C.gpu_launches(op, dims, {}) for j in launch["jobs"]]
        assert [j["gathered_stage"] for j in jobs] == want, (op, jobs)


@needs_native
def test_direct_gathered_launches_take_two_stages():
    """launch.cpp set_two_stages: permute_q's direct tiles (V = 16, gathered
    in the stage loop) get two tile buffers, the in-place wo_a weight one."""
    (q,) = _ops._C.gpu_launches("permute_q", [4096, 64, 512, 2], {})
    (o,) = _ops._C.gpu_launches("wo_a", [1024, 4096, 8], {})
    assert q["stages"] == 2 and q["smem_bytes"] == 2 * q["jobs"][0]["max_tile_bytes"], q
    assert o["stages"] == 1, o


@needs_native
def test_the_sweep_plans_reach_the_launches():
    """The executor's environment as device fields (csrc/cuda/executor.cpp):
    col_stages 2 gives staged jobs two buffers of half-size tiles, all of a
    launch's jobs or none (the packed wv scale, V = 4, keeps its launch at one);
    row_stages 2 does the same for row tiles of one pass at V = 16 (wq_b),
    which is the default (DeviceSpec), and row_stages 1 plans one;
    tile_budget bounds every row and staged column tile."""
    wo_a = [8192, 4096, 8]
    (one,) = _ops._C.gpu_launches("wo_a", wo_a, {})
    (two,) = _ops._C.gpu_launches("wo_a", wo_a, {"col_stages": 2})
    assert two["stages"] == 2 and two["smem_bytes"] == one["smem_bytes"], (one, two)
    assert two["jobs"][0]["max_tile_bytes"] == one["jobs"][0]["max_tile_bytes"] // 2
    assert two["jobs"][0]["tiles"] == 2 * one["jobs"][0]["tiles"]
    (wv,) = _ops._C.gpu_launches("wv_packed", [8, 1024, 4096, 8], {"col_stages": 2})
    assert wv["stages"] == 1 and [j["vec"] for j in wv["jobs"]] == [16, 4], wv
    wq_b = [32768, 1280, 64]
    for dims in (wq_b, [4096, 1280, 8]):
        (one,) = _ops._C.gpu_launches("wq_b", dims, {"row_stages": 1})
        (two,) = _ops._C.gpu_launches("wq_b", dims, {"row_stages": 2})
        assert one["stages"] == 1 and two["stages"] == 2, (one, two)
        assert _ops._C.gpu_launches("wq_b", dims, {}) == [two]  # the default
        # CTAs per SM may differ either way: registers (7 CTAs) no longer
        # bind below what each launch's shared memory allows.
        assert two["smem_bytes"] <= 32768, (one, two)
        assert two["jobs"][0]["max_tile_bytes"] <= 16384 and one["smem_bytes"] <= 32768, (one, two)
        if dims == wq_b:
            assert 16384 < one["jobs"][0]["max_tile_bytes"], (one, two)
            assert two["jobs"][0]["tiles"] > one["jobs"][0]["tiles"], (one, two)
        else:  # TP8: the one-stage launch is short of tiles and cut as thin (launch.cpp row_launch)
            assert two["jobs"][0]["tiles"] >= one["jobs"][0]["tiles"], (one, two)
    # The packed wq_b scale moves in units of 16 rows of 4-byte words: V = 16
    # too, so its launch takes two stages as well.
    (packed,) = _ops._C.gpu_launches("wq_b_packed", [32768, 1280, 64, 32], {"row_stages": 2})
    assert packed["stages"] == 2 and [j["vec"] for j in packed["jobs"]] == [16, 16], packed
    for op, dims in (("wq_b", [32768, 1280, 64]), ("wo_a", wo_a), ("wq_b_packed", [32768, 1280, 64, 32])):
        for budget in (8192, 16384):
            for launch in _ops._C.gpu_launches(op, dims, {"tile_budget": budget}):
                if launch["kernel"] != "save_heads":
                    assert max(j["max_tile_bytes"] for j in launch["jobs"]) <= budget, (op, budget, launch)
                    assert launch["smem_bytes"] <= budget, (op, budget, launch)


@needs_native
@pytest.mark.parametrize(
    "op,dims",
    [
        ("wq_b", [100, 64, 3]),
        ("wq_b", [96, 40, 3]),
        ("wo_a", [8, 100, 4]),
        ("wv_packed", [2, 8, 96, 3]),
        ("permute_q", [4, 2, 24, 2]),
    ],
)
def test_gpu_launches_refuse_shapes_the_layouts_do_not_define(op, dims):
    """Shapes outside the model's layouts raise (they once indexed past the
    end of the permutation being built)."""
    with pytest.raises(ValueError):
        _ops._C.gpu_launches(op, dims, {})
