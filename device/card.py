"""The CUDA card a run is on: its SMs, shared memory, SM clock and memory
peak, recorded beside the benchmark's times and used by device/model.py in
place of the H200's it was fitted on. The runtime gives SMs, shared memory
and L2 exactly, and a memory clock and bus width; the SM clock and the peak
come from the data sheet where the card's name is known and the runtime's
peak agrees with it (the model's H200 figures were scaled against the data
sheet), else from the runtime. `source` says which.
"""

import re

# Data-sheet figures by the model in the name the driver reports ("NVIDIA
# H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200 NVL"), most specific
# first: SMs, boost SM clock (GHz), memory peak (TB/s).
DATA_SHEET = (
    ("H200 NVL", {"sms": 132, "clock_ghz": 1.785, "peak_tbps": 4.8}),
    ("H200", {"sms": 132, "clock_ghz": 1.98, "peak_tbps": 4.8}),
    ("H100 NVL", {"sms": 132, "clock_ghz": 1.785, "peak_tbps": 3.9}),
    ("H100 PCIe", {"sms": 114, "clock_ghz": 1.755, "peak_tbps": 2.0}),
    ("H100", {"sms": 132, "clock_ghz": 1.98, "peak_tbps": 3.35}),  # SXM5, 80 GB
)
# A runtime peak this far from the data sheet's is another part under the
# same name (an H100 with 94 GB): the runtime's figures then. The H200's own
# runtime figure is 2.4 % over.
AGREE = 0.10


def model_in(key, name):
    """`key` as the model in `name`: "H200" is in "NVIDIA H200 NVL" but not
    in "NVIDIA GH200 480GB" or "NVIDIA H2000"."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name or "") is not None


def data_sheet(name):
    return next((dict(fig) for key, fig in DATA_SHEET if model_in(key, name)), None)


def card_figures(name, sms, smem_per_sm, l2_bytes, total_bytes, sm_clock_khz=0, mem_clock_khz=0, bus_bits=0):
    """One card's figures from what the runtime reports (clocks 0 where it
    has none). Pure, so a test can feed it any card."""
    fig = {
        "name": name,
        "sms": sms,
        "smem_per_sm_kib": smem_per_sm // 1024,
        "l2_mib": round(l2_bytes / 2**20, 1),
        "total_gib": round(total_bytes / 2**30, 1),
    }
    # DDR: two transfers a memory clock, bus_bits / 8 bytes each.
    runtime_peak = 2 * mem_clock_khz * 1e3 * bus_bits / 8 / 1e12 if mem_clock_khz and bus_bits else None
    if runtime_peak:
        fig["runtime_peak_tbps"] = round(runtime_peak, 3)
    runtime = {
        "clock_ghz": round(sm_clock_khz / 1e6, 3) if sm_clock_khz else None,
        "peak_tbps": fig.get("runtime_peak_tbps"),
        "source": "runtime",
    }
    sheet = data_sheet(name)
    if sheet is None:
        fig.update(runtime)
        return fig
    if runtime_peak and abs(runtime_peak / sheet["peak_tbps"] - 1) > AGREE:
        fig.update(runtime)
        fig["source"] += f" (its peak is not the data sheet's {sheet['peak_tbps']} TB/s for this name)"
        return fig
    fig.update(clock_ghz=sheet["clock_ghz"], peak_tbps=sheet["peak_tbps"], source="data sheet by name")
    if sheet["sms"] != sms:
        fig["source"] += f" (it says {sheet['sms']} SMs; the runtime's {sms} kept)"
    return fig


REQUIRED_PROPERTIES = (
    "name",
    "multi_processor_count",
    "shared_memory_per_multiprocessor",
    "L2_cache_size",
    "total_memory",
)
OPTIONAL_PROPERTIES = ("clock_rate", "memory_clock_rate", "memory_bus_width")  # card_figures' order


def cuda_card(index=0):
    """The figures of CUDA device `index`, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    with torch.cuda.device(index):  # some torch builds read the current device's attributes
        p = torch.cuda.get_device_properties(index)
    # The clocks and the bus width are newer than torch 2.9: 0 where this torch has none.
    clocks = [getattr(p, a, 0) for a in OPTIONAL_PROPERTIES]
    return card_figures(
        p.name, p.multi_processor_count, p.shared_memory_per_multiprocessor, p.L2_cache_size, p.total_memory, *clocks
    )


def record_cuda_card(info, index=0):
    """Puts the card into `info` (a run's JSON): `card`, or `card_error`
    when this torch cannot read it. Reading the card never stops a run."""
    try:
        info["card"] = cuda_card(index)
    except Exception as e:  # noqa: BLE001 (a torch without one of its properties, a driver error)
        info["card"], info["card_error"] = None, f"{type(e).__name__}: {e}"
    return info["card"]


def card_in(doc):
    """The card a JSON document recorded, or None: gpu.json and bench.json
    at the top, gpu_check.json in its gpu step's figures."""
    if not isinstance(doc, dict):
        return None
    card = doc.get("card")
    if card is None:
        gpu = next((s for s in doc.get("steps", []) if isinstance(s, dict) and s.get("name") == "gpu"), {})
        card = (gpu.get("figures") or {}).get("card")
    return card if isinstance(card, dict) and card.get("sms") else None
