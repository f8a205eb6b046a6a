"""bench/gpu_model.py (the GPU performance model) and the launch figures it
reads from the native module's gpu_launches. No GPU needed."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import flashmla_perm
from flashmla_perm import _ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "gpu_model.py")
NATIVE = flashmla_perm.build_info()["native"]
needs_native = pytest.mark.skipif(not NATIVE, reason="native module not loaded (gpu_launches)")

REQUIRED = ("op", "tp", "launches", "ctas", "in_flight_bytes_per_sm", "predicted_fraction", "bytes",
            "predicted_us", "copy_us", "waves", "ctas_per_sm", "fraction_incl_launch")


def load_model():
    spec = importlib.util.spec_from_file_location("gpu_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_model(tmp_path, *args):
    out = tmp_path / "model.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--json", str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


@needs_native
def test_records(tmp_path):
    proc, records = run_model(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout or "BELOW" in proc.stdout
    for r in records:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, (r["op"], missing)
        assert 0 < r["predicted_fraction"] <= 1, r
        assert 0 < r["fraction_incl_launch"] <= r["predicted_fraction"], r
        assert r["ctas"] > 0 and r["in_flight_bytes_per_sm"] > 0 and r["bytes"] > 0
        if r["op"] in ("wq_b", "wo_a", "wq_b_packed", "wv_packed"):
            assert r["launches"] == 1, r  # weight and scale in one launch
    cases = [(r["op"], r["tp"], r.get("heads")) for r in records]
    tps = (1, 2, 4, 8)
    expected = ([("wq_b", tp, 64 // tp) for tp in tps] + [("wo_a", tp, None) for tp in tps]
                + [("wq_b_packed", tp, 64 // tp) for tp in tps] + [("wv_packed", tp, None) for tp in tps]
                + [("permute_q", None, 64), ("permute_q", None, 128)])
    assert [(op, tp) for op, tp, _ in cases] == [(op, tp) for op, tp, _ in expected]
    assert [h for op, _, h in cases if op == "permute_q"] == [64, 128]


@needs_native
def test_check_exit_status(tmp_path):
    # Not a gate by default; --check fails on a target nobody meets.
    proc, _ = run_model(tmp_path, "--target", "1.01")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BELOW" in proc.stdout
    proc, _ = run_model(tmp_path, "--target", "1.01", "--check")
    assert proc.returncode == 1, proc.stdout + proc.stderr


LAUNCH_CASES = [
    ("wq_b", [64 // tp * 512, 1280, 64 // tp]) for tp in (1, 2, 4, 8)
] + [
    ("wo_a", [8 // tp * 1024, 4096, 8]) for tp in (1, 2, 4, 8)
] + [
    ("wq_b_packed", [64 // tp * 512, 1280, 64 // tp, 32]) for tp in (1, 2, 4, 8)
] + [
    ("wv_packed", [max(8 // tp, 1), 1024, 4096, 8]) for tp in (1, 2, 4, 8)
] + [("wq_b_packed", [3 * 48, 1024, 3, 128]), ("wv_packed", [3, 33, 1024, 8]),
     ("permute_q", [4096, 64, 512, 2]), ("permute_q", [4096, 128, 512, 2]), ("permute_q", [3, 5, 48, 2])]
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


# The model itself, on made-up launches (no native module needed).

BW, LATENCY = 4.3e12, 1e-6


def synthetic(grid, tiles, tile_bytes, inflight=None, ctas_per_sm=1):
    return {"kernel": "cols", "grid": grid, "ctas_per_sm": ctas_per_sm, "tiles": tiles,
            "jobs": [{"tiles": tiles, "bytes": tiles * tile_bytes, "inflight_bytes": inflight or tile_bytes}]}


def test_model_one_round_with_enough_in_flight_is_the_copy():
    m = load_model()
    launch = synthetic(132, 132, 32 * 1024)  # 4.1 MiB in flight: more than bandwidth x latency
    copy = LATENCY + 2 * 132 * 32 * 1024 / BW
    assert m.simulate(launch, BW, LATENCY, 132) == pytest.approx(copy, rel=1e-12)


def test_model_littles_law():
    # 132 KiB in flight sustain 132 KiB per latency: 100 tiles a CTA take ~100 latencies.
    m = load_model()
    launch = synthetic(132, 132 * 100, 1024)
    assert m.simulate(launch, BW, LATENCY, 132) == pytest.approx(100 * LATENCY, rel=0.01)


def test_model_tail_and_steps():
    m = load_model()
    # Three small tiles on two CTAs: CTA 0 runs two in a row, two latencies.
    assert m.simulate(synthetic(2, 3, 1024), BW, LATENCY, 132) == pytest.approx(2 * LATENCY, rel=0.01)
    # A tile with a quarter of its bytes in flight at once: four steps, four latencies.
    assert m.simulate(synthetic(1, 1, 4096, inflight=1024), BW, LATENCY, 132) == pytest.approx(
        4 * LATENCY, rel=0.01)
    # More CTAs than resident slots: the second wave waits for the first.
    assert m.simulate(synthetic(4, 4, 1024), BW, LATENCY, 2) == pytest.approx(2 * LATENCY, rel=0.01)
    # The lock-step bound pays a latency per round.
    assert m.lockstep_time(synthetic(2, 3, 1024), BW, LATENCY) == pytest.approx(2 * LATENCY, rel=0.01)
