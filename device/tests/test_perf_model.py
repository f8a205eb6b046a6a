"""device/model.py: bytes, Little's law and the card, on the
launches the native module plans and on made-up ones."""

import json
import os
import sys

import pytest

import flashmla_perm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import card as card_mod  # noqa: E402
import model  # noqa: E402

needs_native = pytest.mark.skipif(not flashmla_perm.build_info()["native"], reason="native module not loaded")
FIG = model.card_figures()
REGS = model.DEFAULT_REGS


NEED = FIG["copy_tbps"] * 1e6 * FIG["latency_us"] / FIG["sms"]  # bytes in flight an SM needs


def launch(ctas=6, tiles=1584, nbytes=64 << 20, inflight=int(NEED / 6)):
    """CTAs of `inflight` bytes of loads each, every SM `ctas` of them."""
    job = {"kind": "cols_direct", "tiles": tiles, "bytes": nbytes, "inflight_bytes": inflight}
    return {
        "kernel": "cols",
        "grid": FIG["sms"] * ctas,
        "ctas_per_sm": ctas,
        "tiles": tiles,
        "stages": 1,
        "smem_bytes": inflight,
        "jobs": [job],
    }


def test_enough_in_flight_streams_at_the_copys_bandwidth_and_less_by_littles_law():
    full = model.price_launch(launch(ctas=6, inflight=int(NEED / 5)), FIG)
    fixed = FIG["launch_us"] + FIG["latency_us"]
    assert full["bound"] == "bandwidth" and full["components_us"]["in_flight"] == 0
    assert full["us"] - fixed == pytest.approx(2 * (64 << 20) / (FIG["copy_tbps"] * 1e6))
    third = model.price_launch(launch(ctas=2), FIG)  # a third of what one SM needs
    assert third["bound"] == "in flight" and third["in_flight_per_sm"] == 2 * int(NEED / 6)
    assert (third["us"] - fixed) / (full["us"] - fixed) == pytest.approx(6 / 2, rel=1e-3)
    fixed_us = third["components_us"]["launch"] + third["components_us"]["latency"]
    assert sum(third["components_us"].values()) == pytest.approx(third["us"], abs=1e-2) and fixed_us == fixed


@needs_native
def test_the_registers_a_build_reports_plan_the_launches():
    kernels = {
        k: {"registers": r} for k, r in [("rows", 168), ("save_heads", 64), ("cols_staged", 56), ("cols_direct", 40)]
    }
    images = [
        {"kind": "cubin", "arch": "sm_100", "kernels": {}},
        {"kind": "cubin", "arch": "sm_90", "kernels": kernels},
    ]
    regs = model.registers(images)
    assert regs == {**REGS, "rows": 168}
    case = model.cases(["wq_b"])[0]
    few, today = model.predict(case, FIG, regs), model.predict(case, FIG, REGS)
    # 168 registers x 128 threads: 3 CTAs an SM fit the 64 Ki registers
    assert few["launches"][0]["ctas_per_sm"] == 65536 // (168 * 128) < today["launches"][0]["ctas_per_sm"]


@needs_native
def test_the_card_plans_the_launches_and_scales_the_copy():
    pcie = card_mod.card_figures("NVIDIA H100 PCIe", 114, 233472, 50 << 20, 80 << 30, 1_755_000, 1_593_000, 5120)
    fig = model.card_figures(pcie)
    assert (fig["sms"], fig["peak_tbps"]) == (114, pcie["peak_tbps"])
    bare = model.card_figures({"name": "a torch without clocks", "sms": 114})
    assert bare["copy_tbps"] == FIG["copy_tbps"] and "the H200's assumed" in bare["name"]
    for h200, h100 in zip(model.cases(["wq_b", "wo_a"]), model.cases(["wq_b", "wo_a"])):
        a, b = model.predict(h200, FIG, REGS), model.predict(h100, fig, REGS)
        fixed = 2 * (FIG["launch_us"] + model.COPY_LATENCY_US)
        assert (b["copy_us"] - fixed) / (a["copy_us"] - fixed) == pytest.approx(
            model.H200["peak_tbps"] / pcie["peak_tbps"], rel=1e-3
        )
        assert all(lp["grid"] <= 114 * lp["ctas_per_sm"] for lp in b["launches"])
    assert any(
        lp["grid"] > 114 * lp["ctas_per_sm"] for c in model.cases() for lp in model.predict(c, FIG, REGS)["launches"]
    )


@needs_native
def test_main_sets_the_measured_runs_beside_the_prediction(tmp_path, capsys):
    rows = [
        {"kind": k, "tp": tp, "backend": b, "device_ms_per_layer": ms / tp}
        for k in ("wq_b", "wo_a")
        for tp in model.TPS
        for b, ms in (("native", 0.05), ("copy", 0.04))
    ]
    (tmp_path / "bench.json").write_text(json.dumps({"rows": rows}))
    sweep = {
        label: {"env": env, "rows": {"wq_b native": {"x_copy_device": x}, "wo_a native": {"x_copy_device": x}}}
        for label, env, x in (
            ("ctas6", {"FLASHMLA_PERM_MAX_CTAS_PER_SM": "6"}, 1.2),
            ("ctas1", {"FLASHMLA_PERM_MAX_CTAS_PER_SM": "1"}, 3.0),
        )
    }
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    out = tmp_path / "model.json"
    assert (
        model.main(
            ["--measured", str(tmp_path / "bench.json"), "--sweep", str(tmp_path / "sweep.json"), "--json", str(out)]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert {(r["op"], r["tp"]) for r in doc["records"]} == {(c.op, c.tp) for c in model.cases()}
    assert all(r["x_copy_measured"] == 1.25 for r in doc["records"] if r["op"] in ("wq_b", "wo_a"))
    points = {(p["plan"], p["op"]): p for p in doc["sweep"]}
    assert set(points) == {(plan, op) for plan in sweep for op in ("wq_b", "wo_a")}
    for op in ("wq_b", "wo_a"):
        assert points[("ctas1", op)]["x_copy_predicted"] > points[("ctas6", op)]["x_copy_predicted"]
        assert points[("ctas1", op)]["x_copy_measured"] == 3.0
    assert "wq_b" in capsys.readouterr().out
