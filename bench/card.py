"""The CUDA card a run is on, in the figures the benchmark records beside
its times and the performance model plans and predicts with.

The first device run was an H200; the device tool now offers an H100 first
(the same SM, slower memory; an H100 PCIe also has fewer SMs). So every
figure a run reports names its card, and the model takes the card's SMs,
shared memory, clock and memory peak from here (`gpu_model.py --card`)
instead of the H200's.

The runtime reports SMs, shared memory and L2 exactly. Its clocks are less
sure (CUDA 13 dropped cudaDeviceProp's clock fields; torch may report 0),
so the SM clock and the memory peak come from the data sheet where the
card's name is known, and from the runtime's memory clock x bus width
otherwise; `source` says which.
"""

# Data-sheet figures by a name the driver reports (substring, most specific
# first): SMs, boost SM clock (GHz), memory peak (TB/s).
DATA_SHEET = (
    ("H200", {"sms": 132, "clock_ghz": 1.98, "peak_tbps": 4.8}),
    ("H100 NVL", {"sms": 132, "clock_ghz": 1.785, "peak_tbps": 3.9}),
    ("H100 PCIe", {"sms": 114, "clock_ghz": 1.755, "peak_tbps": 2.0}),
    ("H100", {"sms": 132, "clock_ghz": 1.98, "peak_tbps": 3.35}),  # SXM5: "NVIDIA H100 80GB HBM3"
)


def data_sheet(name):
    return next((dict(fig) for key, fig in DATA_SHEET if key in (name or "")), None)


def card_figures(name, sms, smem_per_sm, l2_bytes, total_bytes, sm_clock_khz=0, mem_clock_khz=0, bus_bits=0):
    """One card's figures from what the runtime reports (clocks 0 where it
    has none). Pure, so a test can feed it any card."""
    fig = {"name": name, "sms": sms, "smem_per_sm_kib": smem_per_sm // 1024,
           "l2_mib": round(l2_bytes / 2**20, 1), "total_gib": round(total_bytes / 2**30, 1)}
    # DDR: two transfers a memory clock, bus_bits / 8 bytes each.
    runtime_peak = 2 * mem_clock_khz * 1e3 * bus_bits / 8 / 1e12 if mem_clock_khz and bus_bits else None
    sheet = data_sheet(name)
    if sheet:
        fig.update(clock_ghz=sheet["clock_ghz"], peak_tbps=sheet["peak_tbps"], source="data sheet by name")
        if sheet["sms"] != sms:
            fig["source"] += f" (it says {sheet['sms']} SMs; the runtime's {sms} kept)"
    else:
        fig.update(clock_ghz=round(sm_clock_khz / 1e6, 3) if sm_clock_khz else None,
                   peak_tbps=round(runtime_peak, 3) if runtime_peak else None, source="runtime")
    if runtime_peak:
        fig["runtime_peak_tbps"] = round(runtime_peak, 3)
    return fig


def cuda_card(index=0):
    """The figures of CUDA device `index`, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(index)
    return card_figures(p.name, p.multi_processor_count, p.shared_memory_per_multiprocessor,
                        getattr(p, "L2_cache_size", 0), p.total_memory, getattr(p, "clock_rate", 0),
                        getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0))


def card_in(doc):
    """The card a JSON document (gpu.json, bench.json) recorded, or None."""
    card = doc.get("card") if isinstance(doc, dict) else None
    return card if isinstance(card, dict) and card.get("sms") else None
