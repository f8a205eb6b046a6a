"""device/card.py: the CUDA card a run is on, from what a runtime reports
(no GPU needed: the cards are made up)."""

import contextlib
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import card as card_mod  # noqa: E402

SMEM, L2, TOTAL = 233472, 50 * 2**20, 80 * 10**9


def make_card(name, sms, mem_khz=0, bus_bits=0, sm_khz=0):
    return card_mod.card_figures(name, sms, SMEM, L2, TOTAL, sm_khz, mem_khz, bus_bits)


def test_a_known_card_takes_the_data_sheet_and_keeps_the_runtimes_sms():
    pcie = make_card("NVIDIA H100 PCIe", 114, mem_khz=1_593_000, bus_bits=5120)
    assert (pcie["sms"], pcie["peak_tbps"], pcie["clock_ghz"], pcie["smem_per_sm_kib"]) == (114, 2.0, 1.755, 228)
    assert pcie["runtime_peak_tbps"] == pytest.approx(2 * 1.593e9 * 640 / 1e12, abs=1e-3)
    assert make_card("NVIDIA H100 80GB HBM3", 132)["peak_tbps"] == 3.35
    assert make_card("NVIDIA H200 NVL", 132)["clock_ghz"] == 1.785
    for other in ("NVIDIA GH200 480GB", "NVIDIA H800", "NVIDIA H20", "NVIDIA H2000"):  # another part
        assert make_card(other, 132, mem_khz=2_619_000, bus_bits=5120)["source"] == "runtime", other
    big = make_card("NVIDIA H100 80GB HBM3", 132, mem_khz=3_000_000, bus_bits=6144)  # not the data sheet's memory
    assert big["peak_tbps"] == pytest.approx(4.608) and "not the data sheet's 3.35" in big["source"]
    odd = make_card("NVIDIA H100 80GB HBM3", 120)
    assert odd["sms"] == 120 and "132" in odd["source"]


def test_an_unknown_card_takes_the_runtimes_clocks_or_none():
    c = make_card("NVIDIA Something Else", 100, mem_khz=1_000_000, bus_bits=4096, sm_khz=1_500_000)
    assert (c["source"], c["clock_ghz"]) == ("runtime", 1.5)
    assert c["peak_tbps"] == pytest.approx(2 * 1e9 * 4096 / 8 / 1e12)  # DDR: two transfers a clock
    assert make_card("NVIDIA Something Else", 100)["peak_tbps"] is None


def test_card_in_reads_only_a_card():
    c = make_card("NVIDIA H200", 132)
    assert card_mod.card_in({"card": c}) == c
    assert card_mod.card_in({"steps": [{"name": "gpu", "figures": {"card": c}}]}) == c  # gpu_check.json
    assert card_mod.card_in({"card": None}) is None and card_mod.card_in([]) is None


def test_cuda_card_reads_what_torch_reports_and_records_what_it_cannot(monkeypatch):
    torch = pytest.importorskip("torch")
    props = types.SimpleNamespace(
        name="NVIDIA H100 PCIe",
        multi_processor_count=114,
        shared_memory_per_multiprocessor=SMEM,
        L2_cache_size=L2,
        total_memory=TOTAL,
        clock_rate=1_755_000,
        memory_clock_rate=1_593_000,
        memory_bus_width=5120,
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    assert card_mod.cuda_card(0) == make_card("NVIDIA H100 PCIe", 114, 1_593_000, 5120, 1_755_000)
    for a in card_mod.OPTIONAL_PROPERTIES:  # a torch without the clocks: the data sheet's by name
        delattr(props, a)
    assert card_mod.cuda_card(0) == make_card("NVIDIA H100 PCIe", 114)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(name="x"))
    info = {}
    assert card_mod.record_cuda_card(info) is None and info["card_error"].startswith("AttributeError")
