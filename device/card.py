"""The CUDA card a run is on, as its runtime reports it: SMs, shared memory,
L2, memory, the SM clock and the memory peak (from the memory clock and the
bus width; None where this torch reports no clocks). Recorded beside the
benchmark's times; device/model.py scales its H200 fit by the peak.
"""


def card_figures(name, sms, smem_per_sm, l2_bytes, total_bytes, sm_clock_khz=0, mem_clock_khz=0, bus_bits=0):
    """One card's figures from what the runtime reports (clocks 0 where it
    has none). Pure, so a test can feed it any card."""
    # DDR: two transfers a memory clock, bus_bits / 8 bytes each.
    peak = 2 * mem_clock_khz * 1e3 * bus_bits / 8 / 1e12 if mem_clock_khz and bus_bits else None
    return {
        "name": name,
        "sms": sms,
        "smem_per_sm_kib": smem_per_sm // 1024,
        "l2_mib": round(l2_bytes / 2**20, 1),
        "total_gib": round(total_bytes / 2**30, 1),
        "clock_ghz": round(sm_clock_khz / 1e6, 3) if sm_clock_khz else None,
        "peak_tbps": round(peak, 3) if peak else None,
    }


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
