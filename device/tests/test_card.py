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


def test_the_peak_is_two_transfers_a_memory_clock_and_none_without_clocks():
    pcie = make_card("NVIDIA H100 PCIe", 114, mem_khz=1_593_000, bus_bits=5120, sm_khz=1_755_000)
    assert (pcie["sms"], pcie["clock_ghz"], pcie["smem_per_sm_kib"]) == (114, 1.755, 228)
    assert pcie["peak_tbps"] == pytest.approx(2 * 1.593e9 * 5120 / 8 / 1e12, abs=1e-3)
    bare = make_card("NVIDIA H100 PCIe", 114)
    assert bare["peak_tbps"] is None and bare["clock_ghz"] is None


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
    for a in card_mod.OPTIONAL_PROPERTIES:  # a torch without the clocks: none
        delattr(props, a)
    assert card_mod.cuda_card(0) == make_card("NVIDIA H100 PCIe", 114)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(name="x"))
    info = {}
    assert card_mod.record_cuda_card(info) is None and info["card_error"].startswith("AttributeError")
