"""bench/gpu_model.py (the GPU performance model) and the launch figures it
reads from the native module's gpu_launches. No GPU needed."""

import json
import os
import subprocess
import sys

import pytest
import torch

import flashmla_perm
from conftest import LAUNCH_CASES
from conftest import load_gpu_model as load_model
from flashmla_perm import _ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "gpu_model.py")
NATIVE = flashmla_perm.build_info()["native"]
needs_native = pytest.mark.skipif(not NATIVE, reason="native module not loaded (gpu_launches)")

REQUIRED = ("op", "tp", "launches", "ctas", "in_flight_bytes_per_sm", "predicted_fraction", "bytes",
            "predicted_us", "copy_us", "waves", "ctas_per_sm", "components", "inputs", "instructions_per_item")
OPS = ("wq_b", "wo_a", "wq_b_packed", "wv_packed", "permute_q", "permute_q_h128")


def run_model(tmp_path, *args, name="model.json"):
    out = tmp_path / name
    proc = subprocess.run([sys.executable, SCRIPT, "--json", str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.model_runs
@needs_native
def test_records(tmp_path):
    proc, records = run_model(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout or "BELOW" in proc.stdout
    for r in records:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, (r["op"], missing)
        assert r["predicted_fraction"] > 0, r
        # The causes add up to the prediction, and the copy is its own sum.
        assert sum(r["components"].values()) == pytest.approx(r["predicted_us"], rel=1e-9), r["components"]
        assert r["copy_us"] == pytest.approx(r["predicted_us"] * r["predicted_fraction"], rel=1e-9)
        assert r["components"]["dram"] > 0 and r["components"]["launch"] > 0
        assert r["ctas"] > 0 and r["in_flight_bytes_per_sm"] > 0 and r["bytes"] > 0
        if r["op"] in ("wq_b", "wo_a", "wq_b_packed", "wv_packed"):
            assert r["launches"] == 1, r  # weight and scale in one launch
    assert [(r["op"], r["tp"]) for r in records] == [(op, tp) for op in OPS for tp in (1, 2, 4, 8)]


@pytest.mark.model_runs
@needs_native
def test_check_exit_status(tmp_path):
    # Not a gate by default; --check fails on a target nobody meets.
    proc, _ = run_model(tmp_path, "--target", "1.01", "--ops", "wq_b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BELOW" in proc.stdout
    proc, _ = run_model(tmp_path, "--target", "1.01", "--check", "--ops", "wq_b")
    assert proc.returncode == 1, proc.stdout + proc.stderr


DEVICES = [None, {"regs_per_thread": 92}, {"regs_per_thread": 80},
           {"sm_count": 7, "max_ctas_per_sm": 3, "smem_per_sm": 100 * 1024}]


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
    assert (h200["sm_count"], h200["smem_per_sm"], h200["regs_rows"], h200["regs_cols"]) == (132, 228 * 1024, 71, 56)
    assert (h200["row_stages"], h200["col_stages"]) == (2, 1)  # the default plan (csrc/launch.h)
    odd = {"sm_count": 7, "max_ctas_per_sm": 3, "smem_per_sm": 100 * 1024, "row_stages": 1, "col_stages": 2,
           "tile_budget": 8192}
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
    kernels, a CUDA build without a driver passes on the runtime's error."""
    for call in (lambda: _ops._C.cuda_device_fields(0), lambda: _ops._C.cuda_resident_ctas_per_sm("rows", 128, 0, 0)):
        with pytest.raises(RuntimeError, match="" if flashmla_perm.build_info()["cuda"] else "without CUDA kernels"):
            call()


# The model itself, on made-up launches and kernels (no native module needed).

FIG = {"bw": 4.3e12, "latency": 0.7e-6, "clock": 1.98e9, "sms": 132, "schedulers": 4, "ipc": 1.0,
       "tile_cycles": 0.0, "launch": 2.5e-6, "smem_wavefront_bytes": 128}
TILE = 32 * 1024


def direct_case(m):
    return m.Case("permute_q", 1, [], "cols", 1, (32,), [], (None,), (0,))


def direct_loops(stage, store):
    """The direct column kernel's loops with the given instructions per item."""
    return {("cols_direct", "gather_stage", 16, 0): (stage, 0.0), ("cols_direct", "linear_store", 16, 16): (store, 0.0)}


def direct_launch(tiles, ctas_per_sm, sms=132, tile=TILE):
    grid = min(tiles, sms * ctas_per_sm)
    return {"kernel": "cols", "grid": grid, "ctas_per_sm": ctas_per_sm, "tiles": tiles,
            "jobs": [{"kind": "cols_direct", "vec": 16, "tiles": tiles, "bytes": tiles * tile,
                      "max_tile_bytes": tile, "inflight_bytes": tile, "gathered_stage": True}]}


def fraction(m, launch, loops, fig=FIG):
    """Copy time / kernel time of one launch (launch overheads left out: both have one)."""
    comp = m.launch_components(launch, direct_case(m), loops, fig)
    copy = fig["latency"] + 2 * sum(j["bytes"] for j in launch["jobs"]) / fig["bw"]
    return copy / sum(comp.values()), comp


def per_sm_issue_us(launch, instructions, fig=FIG):
    items = launch["tiles"] * TILE / 16 / fig["sms"]
    return items / 32 * instructions / (fig["schedulers"] * fig["ipc"]) / fig["clock"] * 1e6


def test_issue_bound_case_is_below_the_copy():
    m = load_model()
    launch = direct_launch(132 * 6 * 4, 6)
    dram_us = 2 * launch["tiles"] * TILE / FIG["bw"] * 1e6
    # Instructions per item chosen so that issuing takes twice the memory time.
    heavy = 2 * dram_us / per_sm_issue_us(launch, 1.0)
    f, comp = fraction(m, launch, direct_loops(heavy / 2, heavy / 2))
    assert f < 0.6, (f, comp)
    assert max(comp, key=comp.get) in ("issue", "dram") and comp["issue"] > 0.5 * comp["dram"], comp
    # The same launch with a tenth of the instructions is memory bound.
    f_light, comp_light = fraction(m, launch, direct_loops(heavy / 20, heavy / 20))
    assert f_light > f and comp_light["issue"] == pytest.approx(0, abs=1e-9), comp_light


@pytest.mark.model_runs
def test_halving_ctas_per_sm_with_one_stage_lowers_the_prediction():
    m = load_model()
    tiles = 132 * 8 * 6
    # Issuing (stage and store loops together) takes as long as the memory:
    # overlapped, that is the copy; one stage leaves the pipe idle while a
    # CTA issues its stores, unless other CTAs on its SM have loads in flight.
    launch = direct_launch(tiles, 8)
    per_item = 0.5 * 2 * tiles * TILE / FIG["bw"] * 1e6 / per_sm_issue_us(launch, 1.0)
    loops = direct_loops(per_item, per_item)
    f8, c8 = fraction(m, launch, loops)
    f4, c4 = fraction(m, direct_launch(tiles, 4), loops)
    f2, c2 = fraction(m, direct_launch(tiles, 2), loops)
    assert f2 < f4 < f8, (f2, f4, f8)
    assert c2["serialisation"] > c4["serialisation"] > 0, (c2, c4)
    # Without SM time, CTAs per SM make no difference to the memory pipe here.
    t4 = m.simulate([m.Tile(TILE, 0, 0, 0)] * tiles, 132 * 4, FIG, sm_time=False)
    t2 = m.simulate([m.Tile(TILE, 0, 0, 0)] * tiles, 132 * 2, FIG, sm_time=False)
    assert t2 == pytest.approx(t4, rel=0.02)


def test_a_warp_limit_makes_fewer_ctas_issue_slower_and_smaller_tiles_do_not():
    """warp_cpi (the warp_issue explanation): a CTA of 4 warps issues at most
    4 / warp_cpi a clock, so an SM with a third of the CTAs issues a third as
    fast; without it the CTAs left share the whole SM. Tiles cut in four
    cost the same instructions, so the time stays but for a load latency a
    tile."""
    m = load_model()
    cap = {**FIG, "warp_cpi": 8.0, "warps": 4}  # a CTA: 4 / 8 / (4 x 1) = 1/8 of its SM
    tiles = [m.Tile(TILE / 64, 2000.0, 2000.0, 0.0)] * (132 * 6 * 4)  # issue-bound: few bytes, many cycles
    assert m.issue_cap(FIG) == float("inf") and m.issue_cap(cap) == pytest.approx(0.125)
    assert m.issue_bound(tiles, 132 * 2, cap) == pytest.approx(3 * m.issue_bound(tiles, 132 * 6, cap))
    assert m.issue_bound(tiles, 132 * 2, FIG) == pytest.approx(m.issue_bound(tiles, 132 * 6, FIG))
    t6, t2 = (m.simulate(tiles, 132 * n, cap) for n in (6, 2))
    assert t2 == pytest.approx(3 * t6, rel=0.02), (t2, t6)
    u6, u2 = (m.simulate(tiles, 132 * n, FIG) for n in (6, 2))
    assert u2 < 1.2 * u6, (u2, u6)  # only the round trips two CTAs cannot cover
    # A loop that mostly waits on the shared-memory path (a tenth of it
    # issuing) is not slowed by the warps' limit: that path is the SM's.
    smem_bound = [m.Tile(TILE / 64, 2000.0, 2000.0, 0.0, False, 200.0, 200.0)] * len(tiles)
    assert m.simulate(smem_bound, 132 * 2, cap) == pytest.approx(m.simulate(smem_bound, 132 * 2, FIG), rel=1e-9)
    assert m.issue_bound(smem_bound, 132 * 2, cap) == pytest.approx(m.issue_bound(smem_bound, 132 * 2, FIG))
    # With no load latency to pay a tile (warp_issue holds it at the copy's),
    # quarter tiles take as long as whole ones.
    quarters = [m.Tile(TILE / 256, 500.0, 500.0, 0.0)] * (4 * len(tiles))
    no_wait = {**cap, "latency": 0.0}
    assert m.simulate(quarters, 132 * 6, no_wait) == pytest.approx(m.simulate(tiles, 132 * 6, no_wait), rel=0.02)


def test_a_launch_gives_its_warps_and_a_tile_priced_in_instructions_keeps_them():
    """launch_fig takes a CTA's warps from the launch's threads; a tile's
    cost given in instructions (--tile-instructions) is that many whatever
    the issue rate, where --tile-cycles is SM cycles."""
    m = load_model()
    assert m.launch_fig({"threads": 256}, FIG)["warps"] == 8
    for ipc in (0.5, 1.0):
        args = m.parse_args(["--tile-instructions", "1200", f"--ipc={ipc}"])
        assert m.figures(args)["tile_cycles"] == pytest.approx(1200 / (4 * ipc))
        assert m.figures(m.parse_args([f"--ipc={ipc}"]))["tile_cycles"] == m.H200["tile_cycles"]


def test_components_sum_to_the_simulation():
    m = load_model()
    launch = direct_launch(1000, 6)
    loops = direct_loops(50.0, 60.0)
    comp = m.launch_components(launch, direct_case(m), loops, FIG)
    actual = m.simulate(m.launch_tiles(launch, direct_case(m), loops, FIG), launch["grid"], FIG)
    assert sum(comp.values()) == pytest.approx(actual, rel=1e-12)


def test_memory_only_is_the_copy_with_enough_in_flight():
    # Little's law: 6 x 32 KiB a SM in flight cover bandwidth x latency, so
    # with no SM time the pipe never idles after the first latency.
    m = load_model()
    tiles = [m.Tile(TILE, 0, 0, 0)] * (132 * 6 * 2)
    t = m.simulate(tiles, 132 * 6, FIG, sm_time=False)
    assert t == pytest.approx(FIG["latency"] + 2 * len(tiles) * TILE / FIG["bw"], rel=1e-9)
    # A few bytes in flight: the pipe idles, a latency a round.
    small = [m.Tile(1024, 0, 0, 0)] * (132 * 100)
    assert m.simulate(small, 132, FIG, sm_time=False) == pytest.approx(100 * FIG["latency"], rel=0.02)


def test_cta_program_orders_a_second_stage_ahead_of_the_stores():
    m = load_model()
    assert m.cta_program(3, 1) == [("stage", 0), ("wait", 0), ("store", 0), ("stage", 1), ("wait", 1),
                                   ("store", 1), ("stage", 2), ("wait", 2), ("store", 2)]
    assert m.cta_program(3, 2) == [("stage", 0), ("stage", 1), ("wait", 0), ("store", 0), ("stage", 2),
                                   ("wait", 1), ("store", 1), ("wait", 2), ("store", 2)]
    assert m.cta_program(1, 2) == [("stage", 0), ("wait", 0), ("store", 0)]
    # Tile 1 inline (a two-stage staged tile that gathers from its buffer,
    # csrc/tile_bodies.h col_staged_half): not staged ahead; at its turn it
    # stages, waits for its loads and tile 2's (cp.async.wait_all), stores.
    assert m.cta_program(4, 2, [False, True, False, False]) == [
        ("stage", 0), ("wait", 0), ("store", 0), ("stage", 2), ("stage", 1), ("wait", 1), ("wait", 2), ("store", 1),
        ("stage", 3), ("wait", 2), ("store", 2), ("wait", 3), ("store", 3)]


def test_a_second_stage_hides_the_round_trip_of_every_tile_but_the_first():
    # One CTA a SM, 1 KiB tiles: one stage idles the pipe a latency a tile
    # (plus issuing); with two, the next tile's loads are in flight while
    # this one stores, and issuing overlaps the wait.
    m = load_model()
    rounds = 50
    tiles = [m.Tile(1024, 2000.0, 2000.0, 0.0)] * (132 * rounds)
    one = m.simulate(tiles, 132, FIG)
    two = m.simulate(tiles, 132, {**FIG, "stages": 2})
    issue = 4000.0 / FIG["clock"]
    assert one == pytest.approx(rounds * (FIG["latency"] + issue), rel=0.02)
    assert two == pytest.approx(FIG["latency"] + rounds * max(issue, FIG["latency"] / 2 + 2000.0 / FIG["clock"]),
                                rel=0.1)
    assert two < 0.8 * one


def test_tail_from_an_extra_tile():
    m = load_model()
    grid = 132 * 2
    # Tiles whose issuing takes about as long as the memory: one CTA with a
    # second tile runs on alone after the others are done.
    loops = direct_loops(100.0, 100.0)
    even = m.launch_components(direct_launch(grid, 2), direct_case(m), loops, FIG)
    odd = direct_launch(grid + 1, 2)
    odd["grid"] = grid  # one CTA takes a second tile
    lopsided = m.launch_components(odd, direct_case(m), loops, FIG)
    assert even["tail"] == pytest.approx(0, abs=1e-12), even
    assert lopsided["tail"] > 0.2 * (sum(even.values()) - FIG["latency"]), (even, lopsided)


def test_tiles_follow_the_cycles_and_the_scale_comes_last():
    m = load_model()
    cycles = m.cycle_lengths(m.q_unit_permutation(64, 512))
    assert sum(cycles) == 2046 and max(cycles) == 11  # DESIGN.md: 2046 of 2048 blocks move, cycles of <= 11
    job = {"kind": "rows", "tiles": 2 * len(cycles), "bytes": 2 * sum(cycles) * 100, "max_tile_bytes": 1100}
    sizes = m.tile_bytes(job, cycles)
    assert sizes[0::2] == [c * 100 for c in cycles] and sum(sizes) == job["bytes"]
    col = {"kind": "cols_staged", "tiles": 3, "bytes": 2500, "max_tile_bytes": 1000}
    assert m.tile_bytes(col, []) == [1000, 1000, 500]


def test_wo_a_gather_is_four_way_bank_conflicted():
    m = load_model()
    # Weight: consecutive 32-byte output chunks come from sources 512 bytes apart.
    ideal, actual = m.gather_wavefronts(m.o_offsets(8, 512, 32), 32, 16, 4096)
    assert actual == 4 * ideal
    # An identity gather of whole rows is conflict-free.
    ideal, actual = m.gather_wavefronts(list(range(0, 4096, 32)), 32, 16, 4096)
    assert actual == ideal


def test_the_wo_a_weight_gathers_in_its_stage_loop_and_stores_without_bank_conflicts():
    """Chunks at least V wide: the staged tile gathers in the cp.async
    addresses (gather_stage) and its store loop is a linear copy, so the
    4-way conflicts above are not paid; the scale (1-byte chunks) still
    gathers from the buffer."""
    m = load_model()
    weight = m.Case("wo_a", 1, [], "cols", 1, (32,), [], (m.o_offsets(8, 512, 32),), (4096,))
    job = {"kind": "cols_staged", "vec": 16, "tiles": 2, "bytes": 2 * TILE, "max_tile_bytes": TILE,
           "inflight_bytes": TILE, "gathered_stage": True}
    assert m.job_loops(job, 32) == [("cols_staged", "gather_stage", 16, 0), ("cols_staged", "linear_store", 16, 16)]
    loops = {("cols_staged", "gather_stage", 16, 0): (40.0, 0.0), ("cols_staged", "linear_store", 16, 16): (40.0, 0.0)}
    tiles = m.job_tiles(job, weight, 0, loops, FIG)
    assert len(tiles) == 2 and all(t.bank == 0 and t.store > 0 for t in tiles)
    # The same weight gathered from its staged rows (as before, and as a
    # V < 16 staged job still is): the 4-way conflicts are paid.
    from_buffer = dict(job, gathered_stage=False)
    assert m.job_loops(from_buffer, 32) == [("cols_staged", "stage", 16, 0), ("cols_staged", "store", 16, 16)]
    loops = {("cols_staged", "stage", 16, 0): (40.0, 0.0), ("cols_staged", "store", 16, 16): (40.0, 0.0)}
    assert all(t.bank > 0 for t in m.job_tiles(from_buffer, weight, 0, loops, FIG))


@needs_native
def test_the_launches_say_which_column_jobs_gather_in_the_stage_loop():
    """gpu_launches reports the kernels' own choice (tile_bodies.h
    gathers_in_stage): the wo_a and wv weights (32-byte chunks) and
    permute_q gather in the stage loop; the scales (1-byte chunks) do not."""
    from flashmla_perm import _ops
    for op, dims, want in (("wo_a", [1024, 4096, 8], [True, False]),
                           ("wv_packed", [8, 1024, 4096, 8], [True, False]),
                           ("permute_q", [4096, 64, 512, 2], [True])):
        jobs = [j for launch in _ops._C.gpu_launches(op, dims, {}) for j in launch["jobs"]]
        assert [j["gathered_stage"] for j in jobs] == want, (op, jobs)


@needs_native
def test_direct_gathered_launches_take_two_stages_and_the_model_runs_them():
    """launch.cpp set_two_stages: permute_q's direct tiles (V = 16, gathered
    in the stage loop) get two tile buffers, the in-place weights one; the
    model simulates each launch with its own stages."""
    from flashmla_perm import _ops
    m = load_model()
    (q,) = _ops._C.gpu_launches("permute_q", [4096, 64, 512, 2], {})
    (o,) = _ops._C.gpu_launches("wo_a", [1024, 4096, 8], {})
    assert q["stages"] == 2 and q["smem_bytes"] == 2 * q["jobs"][0]["max_tile_bytes"], q
    assert o["stages"] == 1, o
    case = next(c for c in m.cases(["permute_q"]) if c.tp == 1)
    loops = dict(m.SASS_DEFAULTS)
    slow = m.figures(m.parse_args([]))  # the figures fitted to the device run
    two = m.predicted_time(case, [q], slow, loops)
    one = m.predicted_time(case, [{**q, "stages": 1}], slow, loops)
    assert two < 0.9 * one, (two, one)
    args = m.parse_args(["--stages", "2"])
    assert m.with_stages(q, args) is q  # planned with two already
    assert m.with_stages(o, args)["stages"] == 2 and m.with_stages(o, args)["ctas_per_sm"] <= o["ctas_per_sm"]


@needs_native
def test_the_sweep_plans_reach_the_launches():
    """The executor's environment as device fields (csrc/cuda_executor.cpp):
    col_stages 2 gives staged jobs two buffers of half-size tiles, all of a
    launch's jobs or none (the packed wv scale, V = 4, keeps its launch at one);
    row_stages 2 does the same for row tiles of one pass at V = 16 (wq_b),
    which is the default (DeviceSpec), and row_stages 1 plans one;
    tile_budget bounds every row and staged column tile."""
    from flashmla_perm import _ops
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


def test_a_shared_pipe_serves_transfers_together_and_a_fifo_one_after_another():
    m = load_model()
    # a and b (1 byte each) at t = 0, c (0.5) at t = 1, one byte a second.
    # Shared: a and b have half a byte left at t = 1, then all three move at
    # a third each and end together. Fifo: a, then b, then c.
    for kind, done_at in (("shared", [2.5, 2.5, 2.5]), ("fifo", [1.0, 2.0, 2.5])):
        pipe, times = m.PIPES[kind](1.0), {}
        pipe.arrive(0.0, 1.0, "a")
        pipe.arrive(0.0, 1.0, "b")
        pipe.arrive(1.0, 0.5, "c")
        while pipe.next_done() is not None:
            t = pipe.next_done()
            for who in pipe.done(t):
                times[who] = t
        assert [times[w] for w in "abc"] == pytest.approx(done_at), kind


def test_every_sweep_plan_is_known_to_the_model():
    """The model reads a sweep plan's environment through PLAN_ENV and drops
    what it does not know: a plan it cannot re-plan would be predicted as the
    default and fitted as such."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check

    m = load_model()
    plans = [(label, env) for label, env, _ in gpu_check.SWEEP] + list(gpu_check.SANITIZE_PLANS)
    for label, env in plans:
        assert set(env) <= set(m.PLAN_ENV), (label, env)
    assert set(m.PLAN_DEFAULTS) == set(m.PLAN_ENV.values())
    args = m.parse_args([])
    assert {a: getattr(args, a) for a in m.PLAN_DEFAULTS} == m.PLAN_DEFAULTS


def test_ncu_reports_are_read_per_launch_and_per_plan(tmp_path):
    """gpu_check's ncu step: the main pass summed over our launches, the
    stall pass averaged, and the other stages' pass (its own file, with
    duration and instructions) kept apart from the default plan's."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check

    def report(name, launches):
        rows = ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"']
        for i, (kernel, metrics) in enumerate(launches):
            rows += [f'"{i}","{kernel}","{m}","","{v}"' for m, v in metrics.items()]
        path = tmp_path / name
        path.write_text("==PROF== noise before the table\n" + "\n".join(rows) + "\n")
        return str(path)

    main = {"dram__throughput.avg.pct_of_peak_sustained_elapsed": 40, "dram__bytes_read.sum": 1000,
            "dram__bytes_write.sum": 500, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": 7,
            "smsp__inst_executed.sum": "1,200", "gpu__time_duration.sum": 20000}
    path = report("ncu_wq_b.csv", [("rows", main), ("rows", {**main, "gpu__time_duration.sum": 60000,
                                                               "dram__throughput.avg.pct_of_peak_sustained_elapsed": 20})])
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio".format
    report("ncu_wq_b_stalls.csv", [("rows", {stall("long_scoreboard"): 3, stall("barrier"): 1})] * 2)
    report("ncu_wq_b_stalls_row1.csv", [("rows", {stall("long_scoreboard"): 1, stall("barrier"): 2,
                                                  "gpu__time_duration.sum": 15000, "smsp__inst_executed.sum": 900})])
    f = gpu_check.ncu_kind_figures(path, {"kind": "wq_b", "bytes_moved": 2400})
    assert f["launches"] == 2 and f["instructions"] == 2400 and f["dram_bytes"] == 3000
    assert f["duration_us"] == 80.0 and f["dram_pct_of_peak"] == 25.0  # weighted by duration
    assert f["instructions_per_byte"] == 1.0
    assert f["stalls"]["per_instruction"] == {"long_scoreboard": 3.0, "barrier": 1.0}
    assert "duration_us" not in f["stalls"]
    assert f["stalls_row1"]["per_instruction"] == {"barrier": 2.0, "long_scoreboard": 1.0}
    assert f["stalls_row1"]["duration_us"] == 15.0 and f["stalls_row1"]["instructions"] == 900
    assert "row1: 15.0 us, stalls barrier 2.0" in gpu_check.short("ncu", {"wq_b": f})
    assert "row1 BYTES WRONG" in gpu_check.short("ncu", {"wq_b": {**f, "ok_row1": False}})
    # An ncu without a stall metric: the plan pass has its time alone.
    report("ncu_wq_b_stalls_row1.csv", [("rows", {"gpu__time_duration.sum": 15000, "smsp__inst_executed.sum": 900})])
    f = gpu_check.ncu_kind_figures(path, {"kind": "wq_b", "bytes_moved": 2400})
    assert f["stalls_row1"]["duration_us"] == 15.0 and f["stalls_row1"]["per_instruction"] == {}
    assert "row1: 15.0 us;" in gpu_check.short("ncu", {"wq_b": f}) + ";"
    # The balance, L2 request and clock pass: two launches, summed.
    assert "where" not in f
    report("ncu_wq_b_where.csv", [("rows", {"sm__cycles_active.max": 1200, "sm__cycles_active.avg": 1000,
                                           "lts__t_sectors_srcunit_tex_op_read.sum": 4000,
                                           "lts__t_requests_srcunit_tex_op_read.sum": 1000,
                                           "launch__waves_per_multiprocessor": 2.82,
                                           "launch__occupancy_limit_shared_mem": 6,
                                           "launch__occupancy_limit_registers": 5,
                                           "launch__shared_mem_config_size": 233472,
                                           "sm__cycles_elapsed.avg.per_second": 1.98e9,
                                           "dram__cycles_elapsed.avg.per_second": 3.2e9}),
                                  ("rows", {"sm__cycles_active.max": 600, "sm__cycles_active.avg": 200,
                                            "lts__t_sectors_srcunit_tex_op_read.sum": "2,000",
                                            "lts__t_requests_srcunit_tex_op_read.sum": 1000,
                                            "launch__waves_per_multiprocessor": 0.5,
                                            "launch__occupancy_limit_shared_mem": 5,
                                            "launch__occupancy_limit_registers": 8,
                                            "launch__shared_mem_config_size": "200,704",
                                            "sm__cycles_elapsed.avg.per_second": 1.78e9,
                                            "dram__cycles_elapsed.avg.per_second": 3.2e9})])
    w = gpu_check.ncu_kind_figures(path, {"kind": "wq_b", "bytes_moved": 2400})["where"]
    assert w == {"sm_busiest_over_mean": 1.5, "l2_sectors_per_read_request": 3.0, "waves_per_sm": [2.82, 0.5],
                 "ctas_by_smem": [6, 5], "ctas_by_regs": [5, 8], "smem_config_kib": [228.0, 196.0],
                 "sm_ghz": 1.88, "dram_ghz": 3.2}
    text = gpu_check.short("ncu", {"wq_b": {**f, "where": w}})
    assert ("busiest SM x1.5 the mean, 3.0 sectors an L2 read, waves 2.82/0.5, CTAs a SM by shared memory 6/5, "
            "by registers 5/8, carveout 228.0/196.0 KiB, SM clock 1.88 GHz") in text
    # An ncu without the clock metrics: the rest stands, and no clock is made up.
    report("ncu_wq_b_where.csv", [("rows", {"sm__cycles_active.max": 1200, "sm__cycles_active.avg": 1000})])
    w = gpu_check.ncu_kind_figures(path, {"kind": "wq_b", "bytes_moved": 2400})["where"]
    assert w == {"sm_busiest_over_mean": 1.2}
    assert set(gpu_check.NCU_OTHER_PLAN) == set(gpu_check.NCU_KINDS)
    for _, env in gpu_check.NCU_OTHER_PLAN.values():  # plans the sweep times too
        assert env in [e for _, e, _ in gpu_check.SWEEP]


def test_the_device_check_keeps_going_past_a_failed_plan_and_a_cut_short_run(tmp_path):
    """A sweep plan or a sanitizer plan that fails is recorded, the next one
    still runs, and the step fails at the end; a tests step cut short by its
    timeout (no junit XML yet) still has its counts, from pytest -v's lines."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check

    class Cfg:
        dry = True

        def path(self, name):
            return str(tmp_path / name)

    class FakeStep:
        def __init__(self):
            self.envs = []

        def say(self, text):
            pass

        def python(self, *args, env=None, check=True):  # as gpu_check.Step's
            self.envs.append(env)
            rc = 1 if len(self.envs) == 1 else 0  # the first plan fails
            if check and rc:
                raise gpu_check.StepFailed(f"python exited {rc}")
            return rc

    for run, plans in ((gpu_check.step_sweep, gpu_check.SWEEP), (gpu_check.step_memcheck, gpu_check.SANITIZE_PLANS)):
        step = FakeStep()
        with pytest.raises(gpu_check.StepFailed, match="plans failed: .*exit 1"):
            run(Cfg(), step)
        assert len(step.envs) == len(plans), run
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert list(sweep) == [label for label, _, _ in gpu_check.SWEEP]
    assert sweep[gpu_check.SWEEP[0][0]]["exit_status"] == 1 and "exit_status" not in sweep[gpu_check.SWEEP[1][0]]
    log = ("[gw0] [  1%] PASSED tests/test_ops.py::test_a[cuda] \n"
           "[gw1] [  2%] FAILED tests/test_ops.py::test_b[cuda] \n"
           "tests/test_ops.py::test_c[cuda] SKIPPED (no vLLM)                [ 50%]\n"
           "FAILED tests/test_ops.py::test_b[cuda] - AssertionError\n")
    assert gpu_check.verbose_counts(log) == {"tests": 3, "passed": 1, "failures": 1, "errors": 0, "skipped": 1,
                                             "from": "the log's -v lines (no junit XML: the run was cut short)"}
    (tmp_path / "tests.log").write_text(log)
    assert gpu_check.figures(Cfg(), "tests")["tests"] == 3  # tests.xml missing


# Each explanation of the native times (bench/gpu_model.py EXPLANATIONS) at
# figures of its own, away from the defaults: the flags that make a sweep,
# and the figures its fit must find again.
SWEEP_TRUTHS = {
    "round_trip": (["--latency-us=1.4", "--ipc=0.45"], {"latency_us": 1.4, "ipc": 0.45}),
    "warp_issue": (["--latency-us=0.7", "--ipc=1", "--warp-cpi=12", "--tile-instructions=1204.8"],
                   {"warp_cpi": 12.0}),  # (warp_issue holds the issue rate at 1, the hardware's most)
}


@pytest.mark.model_runs
@needs_native
@pytest.mark.parametrize("truth", SWEEP_TRUTHS)
def test_sweep_round_trip(tmp_path, truth):
    """A sweep.json made by the model itself, each plan under its own
    environment, under one explanation at other figures: the one fit across
    the plans finds them again, every plan fits, and the sweep says which
    explanation it is."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check

    m = load_model()
    flags_of_truth, figures = SWEEP_TRUTHS[truth]
    assert set(figures) <= set(m.EXPLANATIONS[truth]["fit"])
    plans = [p for p in gpu_check.SWEEP if p[0] in ("ctas2", "tile16k", "col2")]
    doc = {}
    for label, env, kinds in plans:
        flags = [f"--{m.PLAN_ENV[k].replace('_', '-')}={v}" for k, v in env.items()]
        proc, records = run_model(tmp_path, "--ops", kinds, *flags_of_truth, *flags, name=f"{label}.json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc[label] = {"env": env, "rows": {f"{r['op']} native": {"device_ms_per_layer": r["predicted_us"] / 1e3,
                                                                  "x_copy_device": 1.0}
                                           for r in records if r["tp"] == 1}}
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(doc))
    proc, fit = run_model(tmp_path, "--sweep", str(sweep), name="fit.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(fit["points"]) == 5
    found = fit["explanations"][truth]
    for name, value in figures.items():
        assert found["fitted"][name] == pytest.approx(value, rel=0.05 if name == "ipc" else 0.02), fit
    assert found["worst_ratio"] < 1.01 and fit["better"] == truth, fit
    other = next(e for e in fit["explanations"] if e != truth)
    assert fit["explanations"][other]["worst_ratio"] > 1.05, fit  # even these three plans tell the two apart
    if truth == "round_trip":  # the record's own fit (gpu_check's summary reads it) is round_trip's
        assert fit["fitted"] == found["fitted"] and fit["worst_ratio"] == found["worst_ratio"]


FAKE_SASS = """
\tFunction : _ZN13flashmla_perm4anon18flashmla_perm_rowsENS0_4JobsINS_6RowJobEEE
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0020*/               @P0 BRA 0x50 ;
        /*0030*/                   MUFU.RCP R3, R3 ;
        /*0040*/                   IMAD R1, R1, R3, RZ ;
        /*0050*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*0060*/               @P1 BRA 0x10 ;
        /*0070*/                   LDS.128 R4, [R6] ;
        /*0080*/                   STG.E.128 desc[UR4][R8.64], R4 ;
        /*0090*/                   LDS.128 R4, [R6] ;
        /*00a0*/               @P2 BRA 0xc0 ;
        /*00b0*/                   STG.E.128 desc[UR4][R8.64], R4 ;
        /*00c0*/               @P1 BRA 0x70 ;
        /*00d0*/                   EXIT ;
"""


def test_sass_reader_counts_the_full_batch_path():
    m = load_model()
    counts, totals = m.read_sass(FAKE_SASS)
    assert totals == {"rows": 14}
    # Stage loop 0x10-0x60: the short path skips the division (4 instructions, one item).
    # No loop around it: nothing a line.
    assert counts[("rows", "stage", 16, 0)] == (4.0, 0.0, 0.0, 1.0, 4.0)
    # Store loop 0x70-0xc0: the path with both stores (6 instructions, two items a trip).
    assert counts[("rows", "store", 16, 16)] == (3.0, 0.0, 0.0, 2.0, 6.0)


# A row kernel's stage loop a warp a line: the lane loop (0x30-0x50) inside
# the line loop (0x00-0x70), whose own instructions (the position's load,
# the line's address) come once a line.
FAKE_LINE_SASS = """
\tFunction : _ZN13flashmla_perm4anon18flashmla_perm_rowsENS0_4JobsINS_6RowJobEEE
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   LDG.E R3, desc[UR4][R4.64] ;
        /*0020*/                   IMAD R5, R3, R6, RZ ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*0040*/                   IADD3 R1, R1, 0x200, RZ ;
        /*0050*/               @P0 BRA 0x30 ;
        /*0060*/                   IADD3 R7, R7, 0x1, RZ ;
        /*0070*/               @P1 BRA 0x0 ;
        /*0080*/                   EXIT ;
"""


def test_sass_reader_leaves_a_pass_out_of_a_line_and_reads_uniform_branches():
    """A loop around the lane loop that holds a barrier is a pass's or a
    tile's (builds before the row loops went a warp a line), not a line's;
    sm_100's branches on a uniform predicate are conditional."""
    m = load_model()
    counts, _ = m.read_sass(FAKE_LINE_SASS.replace("IADD3 R7, R7, 0x1, RZ ;", "BAR.SYNC.DEFER_BLOCKING 0x0 ;"))
    assert counts[("rows", "stage", 16, 0)] == (3.0, 0.0, 0.0, 1.0, 3.0)
    assert not m.unconditional("BRA.U UP0, 0x10") and not m.unconditional("BRA.U !UP0, 0x10")
    assert not m.unconditional("@P0 BRA 0x10") and m.unconditional("BRA 0x10")


def test_sass_reader_prices_a_row_loop_by_its_lines():
    m = load_model()
    counts, _ = m.read_sass(FAKE_LINE_SASS)
    loop = counts[("rows", "stage", 16, 0)]
    assert loop == (3.0, 0.0, 5.0, 1.0, 3.0)  # 3 a trip, 8 in the line loop's path: 5 a line
    # Lines of 64 vectors: two trips of 32 lanes and a line's setup, 11 warp instructions a 64 items.
    assert m.item_instructions(loop, {"slice_vectors": 64, "line_vectors": 128}) == pytest.approx(32 * 22 / 128)
    # A narrower last slice (32 of 96): one trip and the setup.
    assert m.item_instructions(loop, {"slice_vectors": 64, "line_vectors": 96}) == pytest.approx(32 * 19 / 96)
    # Wider lines share the setup among more items; the column loops have none.
    assert m.item_instructions(loop, {"slice_vectors": 1024, "line_vectors": 1024}) < 3.2
    # Lines of 4 vectors: 4 lanes a line, 8 lines to a warp's trip and setup.
    assert m.item_instructions(loop, {"slice_vectors": 4, "line_vectors": 4}) == pytest.approx(32 * 8 / 8 / 4)
    # A line of 5 takes 8 lanes: 4 to a warp.
    assert m.item_instructions(loop, {"slice_vectors": 5, "line_vectors": 5}) == pytest.approx(32 * 8 / 4 / 5)
    # A line of 20 takes a whole warp: a store loop's batch of four (22 a trip), not a narrow trip (8).
    store = (5.5, 0.0, 60.5, 4.0, 8.0)
    assert m.item_instructions(store, {"slice_vectors": 20, "line_vectors": 20}) == pytest.approx(32 * 82.5 / 20)
    assert m.item_instructions(store, {"slice_vectors": 16, "line_vectors": 16}) == pytest.approx(32 * 68.5 / 2 / 16)
    # The busiest warp's share: 11 lines on 4 warps (3 of an even 2.75); 4-vector lines, 32 slots.
    fig = {"warps": 4}
    assert m.warp_spread({"kind": "rows", "slice_vectors": 88}, 11 * 88, fig) == pytest.approx(12 / 11)
    assert m.warp_spread({"kind": "rows", "slice_vectors": 4}, 110 * 4, fig) == pytest.approx(128 / 110)
    assert m.warp_spread({"kind": "cols_staged", "slice_vectors": 0}, 1000, fig) == 1.0
    assert m.item_instructions((37.8, 0.0), {}) == 37.8


# A column kernel with both forms of a tile: rows staged in order and gathered
# from the buffer (the offsets read in the store loop), and a gathered slice
# (the offsets read in the stage loop, a linear store).
FAKE_COLS_SASS = """
\tFunction : _ZN13flashmla_perm4anon18flashmla_perm_colsILb1EEEvNS0_4JobsINS_6ColJobEEE
        /*0000*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*0020*/               @P1 BRA 0x0 ;
        /*0030*/                   LDG.E R5, desc[UR4][R10.64] ;
        /*0040*/                   IADD3 R6, R6, R5, RZ ;
        /*0050*/                   LDS.128 R4, [R6] ;
        /*0060*/                   STG.E.128 desc[UR4][R8.64], R4 ;
        /*0070*/               @P1 BRA 0x30 ;
        /*0080*/                   LDG.E R5, desc[UR4][R10.64] ;
        /*0090*/                   IADD3 R2, R2, R5, RZ ;
        /*00a0*/                   IADD3 R2, R2, 0x10, RZ ;
        /*00b0*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*00c0*/               @P1 BRA 0x80 ;
        /*00d0*/                   LDS.128 R4, [R6] ;
        /*00e0*/                   STG.E.128 desc[UR4][R8.64], R4 ;
        /*00f0*/               @P1 BRA 0xd0 ;
        /*0100*/                   EXIT ;
"""


def test_sass_reader_tells_a_gathered_slice_from_a_gather_from_the_buffer():
    m = load_model()
    functions = m.sass_functions(FAKE_COLS_SASS)
    figures = {(phase, piece): m.loop_figures(functions, "cols_staged", phase, 16, piece)
               for phase, piece in (("stage", 0), ("store", 16), ("gather_stage", 0), ("linear_store", 16))}
    assert figures == {("stage", 0): (3.0, 0.0), ("store", 16): (5.0, 0.0),
                       ("gather_stage", 0): (5.0, 0.0), ("linear_store", 16): (3.0, 0.0)}


@pytest.mark.skipif(not os.environ.get("FLASHMLA_PERM_SASS"), reason="FLASHMLA_PERM_SASS (a CUDA _C .so or its "
                    "cuobjdump -sass text) not set")
def test_recorded_counts_match_the_build():
    m = load_model()
    counts, _ = m.read_sass(m.sass_text(os.environ["FLASHMLA_PERM_SASS"], "sm_90"))
    assert counts == m.SASS_DEFAULTS


def test_scaling_across_tp_splits_the_gap_into_fixed_cost_and_bandwidth():
    """Measured rows made of a known fixed cost and bandwidth a backend
    (the copy at 4 TB/s, native at 3 TB/s with 2 us more fixed cost): the
    line fit finds them, and the smallest TP's gap splits into the two."""
    m = load_model()
    sizes = {1: 40e6, 2: 20e6, 4: 10e6, 8: 5e6}  # tensor bytes a layer
    truth = {"copy": (3.0, 4.0), "native": (5.0, 3.0), "inplace": (2.0, 3.6),
             "copy_1buf": (3.0, 4.4)}  # (fixed us, TB/s)
    records = [{"op": "wq_b", "tp": tp, "bytes": b} for tp, b in sizes.items()]
    rows = {("wq_b", tp, backend): {"device_ms_per_layer": (fixed + 2 * b / (tbps * 1e12) * 1e6) / 1e3}
            for tp, b in sizes.items() for backend, (fixed, tbps) in truth.items()}
    [s] = m.scaling_across_tp(records, rows)
    for backend, (fixed, tbps) in truth.items():
        assert s[backend]["fixed_us"] == pytest.approx(fixed) and s[backend]["tbps"] == pytest.approx(tbps)
        assert s[backend]["worst_residual_us"] == pytest.approx(0, abs=1e-6)
    assert s["tp"] == 1 and s["bandwidth_ratio"] == pytest.approx(0.75)
    assert s["inplace"]["bandwidth_ratio"] == pytest.approx(0.9) and "outofplace" not in s
    assert s["copy_1buf"]["bandwidth_ratio"] == pytest.approx(1.1)
    # What the device check's model step records and prints of it.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check
    figs = gpu_check.scaling_figures({"scaling": [s]})
    assert figs["scaling"]["wq_b"] == {"bandwidth_ratio": 0.75, "gap_from_fixed_us": 2.0,
                                       "gap_from_bandwidth_us": pytest.approx(s["gap_from_bandwidth_us"], abs=0.01),
                                       "inplace_bandwidth_ratio": 0.9, "copy_1buf_bandwidth_ratio": 1.1}
    text = gpu_check.short("model", {"cases": 1, "below_target": 0, "min_predicted_fraction": 1.0, **figs})
    assert "wq_b native 0.75, torch in place 0.90, the copy into one buffer 1.10" in text
    gap_us = (rows[("wq_b", 1, "native")]["device_ms_per_layer"] - rows[("wq_b", 1, "copy")]["device_ms_per_layer"]) * 1e3
    assert s["gap_from_fixed_us"] == pytest.approx(2.0)
    assert s["gap_from_fixed_us"] + s["gap_from_bandwidth_us"] == pytest.approx(gap_us)
    # Two TPs are not enough to tell a fixed cost from a bandwidth.
    assert m.scaling_across_tp(records[:2], rows) == []


@pytest.mark.model_runs
@needs_native
def test_measured_round_trip(tmp_path):
    """A measured file made by the model itself with other bandwidth, launch,
    tile latency and issue rate (the copies' latency as stated, which the
    fit holds): the fit finds them again."""
    altered = {"copy_tbps": 3.7, "launch_us": 1.6, "latency_us": 1.4, "ipc": 0.45}
    ops = "wq_b,wo_a"
    proc, records = run_model(tmp_path, "--ops", ops, *(f"--{k.replace('_', '-')}={v}" for k, v in altered.items()),
                              name="altered.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figs = {}
    for r in records:
        native, copy = r["predicted_us"] / 1e3, r["copy_per_tensor_us"] / 1e3  # the benchmark's copy: a kernel a tensor
        figs[f"cuda {r['op']} tp{r['tp']} native"] = {"device_ms_per_layer": native, "x_copy_device": native / copy}
        figs[f"cuda {r['op']} tp{r['tp']} copy"] = {"device_ms_per_layer": copy, "x_copy_device": 1.0}
    measured = tmp_path / "gpu_check.json"
    measured.write_text(json.dumps({"ok": True, "steps": [{"name": "bench", "status": "ok", "figures": figs}]}))
    proc, fit = run_model(tmp_path, "--measured", str(measured), "--ops", ops, name="fit.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "meas us" in proc.stdout
    for k, v in altered.items():
        assert fit["fitted"][k] == pytest.approx(v, rel=0.02), (k, fit)
    # The model-free split across TPs rides along: each op's copy at the altered bandwidth.
    assert [s["op"] for s in fit["scaling"]] == ["wo_a", "wq_b"]
    for s in fit["scaling"]:
        assert s["copy"]["tbps"] == pytest.approx(altered["copy_tbps"], rel=0.02)


@needs_native
@pytest.mark.parametrize("op,dims", [("wq_b", [100, 64, 3]), ("wq_b", [96, 40, 3]), ("wo_a", [8, 100, 4]),
                                     ("wv_packed", [2, 8, 96, 3]), ("permute_q", [4, 2, 24, 2])])
def test_gpu_launches_refuse_shapes_the_layouts_do_not_define(op, dims):
    """Shapes outside the model's layouts raise (they once indexed past the
    end of the permutation being built)."""
    with pytest.raises(ValueError):
        _ops._C.gpu_launches(op, dims, {})
