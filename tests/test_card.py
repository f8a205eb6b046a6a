"""bench/card.py (the CUDA card a run is on) and how the benchmark, the
device check and the performance model use it. No GPU needed: the cards are
built from what a runtime would report."""

import contextlib
import json
import os
import sys
import types

import pytest

import flashmla_perm
from conftest import load_gpu_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import card as card_mod  # noqa: E402

needs_native = pytest.mark.skipif(not flashmla_perm.build_info()["native"],
                                  reason="native module not loaded (gpu_launches)")
SMEM, L2, TOTAL = 233472, 50 * 2**20, 80 * 10**9


MODULE = load_gpu_model()


def make_card(name, sms, mem_khz=0, bus_bits=0, sm_khz=0):
    return card_mod.card_figures(name, sms, SMEM, L2, TOTAL, sm_khz, mem_khz, bus_bits)


def test_a_known_card_takes_the_data_sheet_and_keeps_the_runtimes_sms():
    pcie = make_card("NVIDIA H100 PCIe", 114, mem_khz=1_593_000, bus_bits=5120)
    assert (pcie["sms"], pcie["peak_tbps"], pcie["clock_ghz"]) == (114, 2.0, 1.755)
    assert pcie["source"] == "data sheet by name" and pcie["smem_per_sm_kib"] == 228
    assert pcie["runtime_peak_tbps"] == pytest.approx(2 * 1.593e9 * 640 / 1e12, abs=1e-3)
    # The SXM5 part is named by its memory; the more specific names win.
    assert make_card("NVIDIA H100 80GB HBM3", 132)["peak_tbps"] == 3.35
    assert make_card("NVIDIA H100 NVL", 132)["peak_tbps"] == 3.9
    assert make_card("NVIDIA H200", 132)["peak_tbps"] == 4.8
    assert make_card("NVIDIA H200 NVL", 132)["clock_ghz"] == 1.785
    # A name only containing a known model is another part: the runtime's figures.
    for other in ("NVIDIA GH200 480GB", "NVIDIA H800", "NVIDIA H20", "NVIDIA H2000"):
        assert make_card(other, 132, mem_khz=2_619_000, bus_bits=5120)["source"] == "runtime", other
    # A known name whose memory is not the data sheet's (an H100 with 94 GB):
    # the runtime's peak, and the reason.
    big = make_card("NVIDIA H100 80GB HBM3", 132, mem_khz=3_000_000, bus_bits=6144)
    assert big["peak_tbps"] == pytest.approx(4.608) and "not the data sheet's 3.35" in big["source"]
    # The H200's own runtime peak (3201 MHz, 6144 bits) is 2.4 % over 4.8: the data sheet's.
    assert make_card("NVIDIA H200", 132, mem_khz=3_201_000, bus_bits=6144)["peak_tbps"] == 4.8
    # A part with SMs fused off: the runtime's count is what the kernels get.
    odd = make_card("NVIDIA H100 80GB HBM3", 120)
    assert odd["sms"] == 120 and "132" in odd["source"]


def test_an_unknown_card_takes_the_runtimes_clocks_or_none():
    c = make_card("NVIDIA Something Else", 100, mem_khz=1_000_000, bus_bits=4096, sm_khz=1_500_000)
    assert c["source"] == "runtime"
    assert c["peak_tbps"] == pytest.approx(2 * 1e9 * 4096 / 8 / 1e12)  # DDR: two transfers a clock
    assert c["clock_ghz"] == 1.5
    blind = make_card("NVIDIA Something Else", 100)
    assert blind["peak_tbps"] is None and blind["clock_ghz"] is None and "runtime_peak_tbps" not in blind


def test_card_in_reads_only_a_card():
    c = make_card("NVIDIA H200", 132)
    assert card_mod.card_in({"card": c}) == c
    assert card_mod.card_in({"steps": [{"name": "gpu", "figures": {"card": c}}]}) == c  # gpu_check.json
    assert card_mod.card_in({"card": None}) is None and card_mod.card_in({}) is None and card_mod.card_in([]) is None


def test_cuda_card_reads_what_torch_reports(monkeypatch):
    torch = pytest.importorskip("torch")
    props = types.SimpleNamespace(name="NVIDIA H100 PCIe", multi_processor_count=114,
                                  shared_memory_per_multiprocessor=SMEM, L2_cache_size=L2, total_memory=TOTAL,
                                  clock_rate=1_755_000, memory_clock_rate=1_593_000, memory_bus_width=5120)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    assert card_mod.cuda_card(0) == make_card("NVIDIA H100 PCIe", 114, 1_593_000, 5120, 1_755_000)
    assert set(vars(props)) == {*card_mod.REQUIRED_PROPERTIES, *card_mod.OPTIONAL_PROPERTIES}
    # A torch without the clocks (2.9): the data sheet's by name, or none.
    for a in card_mod.OPTIONAL_PROPERTIES:
        delattr(props, a)
    assert card_mod.cuda_card(0) == make_card("NVIDIA H100 PCIe", 114)
    props.name = "NVIDIA Something Else"
    assert card_mod.cuda_card(0)["peak_tbps"] is None
    # Every attribute it needs is one this torch's properties have (a CUDA build of torch).
    cls = getattr(torch._C, "_CudaDeviceProperties", None)
    if cls is None:
        pytest.skip("this torch has no CUDA device properties")
    missing = [a for a in card_mod.REQUIRED_PROPERTIES if not hasattr(cls, a)]
    assert not missing, f"torch {torch.__version__}: {missing}"


def test_a_card_torch_cannot_read_is_recorded_as_such(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(name="x"))
    info = {}
    assert card_mod.record_cuda_card(info) is None
    assert info["card"] is None and info["card_error"].startswith("AttributeError")


def run_model(capsys, tmp_path, name, *args):
    """The model's main in this process (a subprocess a run would spend most
    of its time importing torch)."""
    out = tmp_path / f"{name}.json"
    capsys.readouterr()
    assert MODULE.main(["--json", str(out), *args]) == 0
    return capsys.readouterr().out, json.loads(out.read_text())


def write_card(tmp_path, c):
    path = tmp_path / f"gpu_{c['sms']}_{c['peak_tbps']}.json"
    path.write_text(json.dumps({"name": c["name"], "card": c}))
    return str(path)


@pytest.mark.model_runs
@needs_native
def test_the_model_plans_and_predicts_for_the_card_it_is_given(capsys, tmp_path):
    ops = ("--ops", "wq_b,wo_a")
    _, none = run_model(capsys, tmp_path, "none", *ops)
    _, h200 = run_model(capsys, tmp_path, "h200", *ops, "--card", write_card(tmp_path, make_card("NVIDIA H200", 132)))
    out, pcie = run_model(capsys, tmp_path, "pcie", *ops, "--card", write_card(tmp_path, make_card("NVIDIA H100 PCIe", 114)))
    assert "NVIDIA H100 PCIe, 114 SMs at 1.755 GHz" in out
    # The H200's card is the model's own defaults.
    assert [r["predicted_us"] for r in h200] == [r["predicted_us"] for r in none]
    for a, b in zip(none, pcie):
        assert b["inputs"]["sms"] == 114 and b["inputs"]["hbm_tbps"] == 2.0
        # The copy's bytes move at the H200 fit's bandwidth scaled by the peaks.
        fixed = 1.205 + 0.7  # launch + copy latency (us)
        assert (b["copy_us"] - fixed) / (a["copy_us"] - fixed) == pytest.approx(4.8 / 2.0, rel=1e-9)
        for launch in b["launch_details"]:
            assert launch["grid"] <= 114 * launch["ctas_per_sm"], launch
    # The SM count reaches the planner: some H200 grid does not fit 114 SMs.
    assert any(l["grid"] > 114 * l["ctas_per_sm"] for r in none for l in r["launch_details"])
    # The device check's summary sets the card's TP1 prediction beside the bench's figures.
    import gpu_check

    (tmp_path / "model.json").write_text(json.dumps(pcie))
    f = gpu_check.figures(types.SimpleNamespace(path=lambda n: str(tmp_path / n)), "model")
    want = {r["op"]: round(1 / r["predicted_fraction"], 2) for r in pcie if r["tp"] == 1}
    assert f["tp1_x_copy_predicted"] == want and f["card"] == "NVIDIA H100 PCIe"
    assert (f"TP1 predicted for NVIDIA H100 PCIe, x copy: wq_b {want['wq_b']}x, wo_a {want['wo_a']}x"
            in gpu_check.short("model", f))


def test_a_figure_the_card_lacks_is_the_h200s_and_said_so(tmp_path):
    model = MODULE
    blind = write_card(tmp_path, make_card("NVIDIA H800", 132))  # no clocks from the runtime
    args = model.parse_args(["--card", blind])
    assert (args.hbm_tbps, args.clock_ghz, args.copy_tbps) == (4.8, 1.98, model.H200_MEASURED["copy_tbps"])
    assert "not known, the H200's assumed: clock_ghz 1.98, hbm_tbps 4.8" in args.card_name
    # A runtime peak scales against the H200's runtime peak, not its data sheet's.
    seen = write_card(tmp_path, make_card("NVIDIA H800", 132, mem_khz=2_619_000, bus_bits=5120))
    args = model.parse_args(["--card", seen])
    assert args.copy_tbps == pytest.approx(model.H200_MEASURED["copy_tbps"] * 3.352 / 4.917, rel=1e-3)


@pytest.mark.model_runs
@needs_native
def test_the_model_takes_the_card_a_measured_run_recorded(capsys, tmp_path):
    pcie = make_card("NVIDIA H100 PCIe", 114)
    rows = [{"device": "cuda", "kind": kind, "tp": tp, "backend": backend, "device_ms_per_layer": ms,
             "x_copy_device": ms / copy}
            for kind in ("wq_b", "wo_a") for tp in (1, 2) for backend, ms, copy in
            (("native", 0.05 / tp, 0.045 / tp), ("copy", 0.045 / tp, 0.045 / tp))]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"card": pcie, "rows": rows}))
    out, fit = run_model(capsys, tmp_path, "fit", "--measured", str(bench), "--ops", "wq_b,wo_a", "--fit-evals", "4")
    assert "(card: NVIDIA H100 PCIe)" in out and fit["card"] == "NVIDIA H100 PCIe"
    # A gpu_check.json finds the card in the gpu.json beside it.
    (tmp_path / "gpu.json").write_text(json.dumps({"card": pcie}))
    (tmp_path / "gpu_check.json").write_text(json.dumps({"steps": []}))
    model = MODULE
    args = model.parse_args(["--measured", str(tmp_path / "gpu_check.json")])
    assert (args.card_name, args.sms, args.hbm_tbps) == ("NVIDIA H100 PCIe", 114, 2.0)
    (tmp_path / "sweep.json").write_text("{}")
    args = model.parse_args(["--sweep", str(tmp_path / "sweep.json")])  # the sweep's too
    assert args.sms == 114
    # --card wins over the card the run recorded.
    h200 = write_card(tmp_path, make_card("NVIDIA H200", 132))
    args = model.parse_args(["--measured", str(bench), "--card", h200])
    assert (args.card_name, args.sms) == ("NVIDIA H200", 132)
    # A gpu.json without a card does not look for itself beside itself.
    (tmp_path / "gpu.json").write_text(json.dumps({"steps": []}))
    assert model.find_card(str(tmp_path / "gpu.json")) is None


def test_flags_override_the_card_and_a_file_without_one_is_refused(tmp_path):
    model = MODULE
    path = write_card(tmp_path, make_card("NVIDIA H100 PCIe", 114))
    args = model.parse_args(["--card", path, "--sms", "100", "--copy-tbps", "1.5"])
    assert (args.sms, args.copy_tbps, args.clock_ghz) == (100, 1.5, 1.755)
    args = model.parse_args(["--card", path, "--figures", "stated"])
    assert args.copy_tbps == pytest.approx(model.H200["copy_tbps"] * 2.0 / 4.8)
    empty = tmp_path / "nocard.json"
    empty.write_text(json.dumps({"name": "cpu (dry run)"}))
    with pytest.raises(SystemExit, match="nocard.json names no CUDA card"):
        model.parse_args(["--card", str(empty)])


def test_the_device_checks_model_step_passes_the_card_it_recorded(tmp_path):
    import gpu_check

    for name in ("bench.json", "sweep.json"):
        (tmp_path / name).write_text("{}")
    calls = []
    step = types.SimpleNamespace(python=lambda *a, **k: calls.append(a))
    cfg = types.SimpleNamespace(dry=False, path=lambda n: str(tmp_path / n))
    for gpu in ({"card": make_card("NVIDIA H100 80GB HBM3", 132)}, {"card_error": "AttributeError"}, {}):
        (tmp_path / "gpu.json").write_text(json.dumps(gpu))
        calls.clear()
        gpu_check.step_model(cfg, step)
        assert [c[1] for c in calls] == ["--json", "--measured", "--sweep"] and calls[0][0] == "bench/gpu_model.py"
        for call in calls:  # the prediction, the fit to the bench and to the sweep: all for the card, or none
            assert (call[-2:] == ("--card", str(tmp_path / "gpu.json"))) == ("card" in gpu), (gpu, call)
    assert "the model assumed the H200's" in gpu_check.short("gpu", {"card_error": "AttributeError: x"})
    text = gpu_check.short("gpu", {"name": "NVIDIA H100 80GB HBM3", "card": make_card("NVIDIA H100 80GB HBM3", 132)})
    assert "132 SMs, 3.35 TB/s peak" in text


def test_the_benchmark_names_its_machine(tmp_path):
    import bench_load_time

    out = tmp_path / "bench.json"
    assert bench_load_time.main(["--devices", "cpu", "--kinds", "wo_a", "--layers", "1", "--reps", "1",
                                 "--no-memory", "--backends", "native,copy", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["cpu"] and doc["card"] is None and "card_error" not in doc  # a CPU run: no card
