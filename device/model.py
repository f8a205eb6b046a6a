#!/usr/bin/env python3
"""GPU model of the model ops' launches, without a GPU: what a contributor
needs to reason about a kernel change before a device run.

Per op and TP it takes the launches csrc/launch.cpp plans (through the
native module's gpu_launches: grid, CTAs per SM, tiles, bytes, loads in
flight a CTA) for a card (device/card.py; an H200 by default) and prices:

  * bytes moved: every byte read and written once;
  * bytes in flight per SM (CTAs per SM x a CTA's loads in flight) against
    Little's law: to stream at the copy's bandwidth each SM must hold
    bandwidth / SMs x latency in flight; with less, bandwidth falls to
    in flight x SMs / latency;
  * time = launch + latency + moving the bytes, against a device copy of
    the same tensors (one kernel each).

It does not price instruction issue, nor a one-stage CTA's loads waiting
while it stores its tile: the device check's ncu step counts the
instructions, and its sweep measures what a stage is worth.

    python device/model.py [--card gpu.json] [--module flashmla_perm/_C*.so]
                           [--measured bench.json] [--sweep sweep.json] [--json PATH]
"""

import argparse
import json
import math
import os
import sys
from collections import namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "device")]

# DeepSeek-V4.1-Flash: 64 heads of 512, q_lora_rank 1280, o_lora_rank 1024
# per group of 8 heads; Q activations: 4096 bf16 tokens.
HEADS, HEAD_DIM, Q_LORA_RANK, O_LORA_RANK, GROUP, TOKENS = 64, 512, 1280, 1024, 8, 4096
TPS = (1, 2, 4, 8)

# The H200's figures as its runtime reports them (device/card.py): the peak
# is two transfers a 3201 MHz memory clock on a 6144-bit bus, 4.917 TB/s.
H200 = {"sms": 132, "smem_per_sm_kib": 228, "peak_tbps": round(2 * 3.201e9 * 6144 / 8 / 1e12, 3)}
COPY_LATENCY_US = 0.7  # a copy kernel's first bytes: DRAM latency
# Fitted to the first device run (NVIDIA H200, driver 580.159.04, torch
# 2.11.0+cu130; its bench step's wq_b and wo_a at TP 1-8): the benchmark
# copy's bandwidth and launch, and the latency a tile sees that explained
# the kernels' times.
FITTED = {"copy_tbps": 4.065, "launch_us": 1.205, "latency_us": 4.55}

DEFAULT_REGS = {"rows": 80, "save_heads": 64, "cols": 56}  # sm_90, NVRTC 13.0 (python -m flashmla_perm.images)
# The executor's launch-plan environment (csrc/cuda/executor.cpp) as gpu_launches' fields.
PLAN_FIELDS = {
    "FLASHMLA_PERM_MAX_CTAS_PER_SM": "max_ctas_per_sm",
    "FLASHMLA_PERM_COL_STAGES": "col_stages",
    "FLASHMLA_PERM_ROW_STAGES": "row_stages",
    "FLASHMLA_PERM_TILE_BUDGET": "tile_budget",
}

Case = namedtuple("Case", "op tp dims")


def cases(ops=None):
    out = []
    for tp in TPS:
        rows, heads = HEADS // tp * HEAD_DIM, HEADS // tp
        out += [
            Case("wq_b", tp, [rows, Q_LORA_RANK, heads]),
            Case("wq_b_packed", tp, [rows, Q_LORA_RANK, heads, 32]),
            Case("wo_a", tp, [HEADS // GROUP // tp * O_LORA_RANK, GROUP * HEAD_DIM, GROUP]),
            Case("wv_packed", tp, [max(HEADS // GROUP // tp, 1), O_LORA_RANK, GROUP * HEAD_DIM, GROUP]),
            Case("permute_q", tp, [TOKENS, HEADS // tp, HEAD_DIM, 2]),
            Case("permute_q_h128", tp, [TOKENS, 2 * HEADS // tp, HEAD_DIM, 2]),
        ]
    return [c for c in out if not ops or c.op in ops]


def card_figures(card=None):
    """The card's SMs, shared memory and memory peak (the H200's where it has
    none), and the fitted figures, the copy's bandwidth scaled by the peak."""
    card = card or {}
    fig = {k: card.get(k) or v for k, v in H200.items()}
    fig["name"] = card.get("name", "H200 (no card given)")
    if card and not card.get("peak_tbps"):  # a torch that reports no memory clock
        fig["name"] += " (no memory peak reported: the H200's assumed)"
    fig.update(FITTED)
    fig["copy_tbps"] *= fig["peak_tbps"] / H200["peak_tbps"]
    return fig


def registers(images=None, arch="sm_90"):
    """Registers per thread of each kernel in `arch`'s cubin among `images`
    (flashmla_perm.images.images() of a module; cols: the larger of its two
    forms), else today's."""
    regs = dict(DEFAULT_REGS)
    for image in images or []:
        if image["kind"] == "cubin" and image["arch"] == arch:
            kernels = image["kernels"]
            regs.update({k: kernels[k]["registers"] for k in ("rows", "save_heads") if k in kernels})
            forms = [kernels[k]["registers"] for k in ("cols_staged", "cols_direct") if k in kernels]
            regs["cols"] = max(forms, default=regs["cols"])
    return regs


def device_fields(fig, regs, plan=None):
    """DeviceSpec fields (csrc/launch.h) for gpu_launches: the card's, and a
    launch plan's (stages, CTA cap, tile budget) where one is given."""
    return {
        "sm_count": fig["sms"],
        "smem_per_sm": fig["smem_per_sm_kib"] * 1024,
        "regs_rows": regs["rows"],
        "regs_save_heads": regs["save_heads"],
        "regs_cols": regs["cols"],
        **(plan or {}),
    }


def price_launch(launch, fig):
    """One launch's figures: in flight per SM against Little's law, and the
    time they give (us)."""
    nbytes = sum(j["bytes"] for j in launch["jobs"])
    sms = min(fig["sms"], launch["grid"])  # SMs with a CTA
    ctas = min(launch["ctas_per_sm"], math.ceil(launch["grid"] / fig["sms"]))
    main = max(launch["jobs"], key=lambda j: j["bytes"])
    in_flight = ctas * main["inflight_bytes"]
    needed = fig["copy_tbps"] * 1e6 * fig["latency_us"] / fig["sms"]  # bytes: TB/s x us / SMs
    tbps = min(fig["copy_tbps"], sms * in_flight / fig["latency_us"] / 1e6)
    memory_us = 2 * nbytes / (tbps * 1e6)
    dram_us = 2 * nbytes / (fig["copy_tbps"] * 1e6)
    return {
        "kernel": launch["kernel"],
        "grid": launch["grid"],
        "ctas_per_sm": launch["ctas_per_sm"],
        "tiles": launch["tiles"],
        "stages": launch["stages"],
        "smem_bytes": launch["smem_bytes"],
        "bytes_moved": 2 * nbytes,
        "in_flight_per_sm": in_flight,
        "needed_in_flight_per_sm": round(needed),
        "bound": "in flight" if tbps < fig["copy_tbps"] else "bandwidth",
        "components_us": {
            "launch": fig["launch_us"],
            "latency": fig["latency_us"],
            "dram": round(dram_us, 3),
            "in_flight": round(memory_us - dram_us, 3),
        },
        "us": fig["launch_us"] + fig["latency_us"] + memory_us,
    }


def predict(case, fig, regs, plan=None):
    from flashmla_perm import _ops

    launches = _ops._C.gpu_launches(case.op.replace("_h128", ""), case.dims, device_fields(fig, regs, plan))
    priced = [price_launch(launch, fig) for launch in launches]
    nbytes = sum(p["bytes_moved"] for p in priced) // 2
    tensors = 1 if case.op.startswith("permute_q") else 2  # the copy: one kernel a tensor
    copy_us = tensors * (fig["launch_us"] + COPY_LATENCY_US) + 2 * nbytes / (fig["copy_tbps"] * 1e6)
    us = sum(p["us"] for p in priced)
    return {
        "op": case.op,
        "tp": case.tp,
        "bytes_moved": 2 * nbytes,
        "predicted_us": round(us, 3),
        "copy_us": round(copy_us, 3),
        "x_copy_predicted": round(us / copy_us, 3),
        "launches": priced,
    }


def load(path):
    with open(path) as f:
        return json.load(f)


def measured_rows(path):
    """{(kind, tp): x the copy} of the native rows in a bench.json (device times)."""
    rows = {(r["kind"], r["tp"], r["backend"]): r["device_ms_per_layer"] for r in load(path).get("rows", [])}
    return {
        (k, tp): ms / rows[(k, tp, "copy")]
        for (k, tp, b), ms in rows.items()
        if b == "native" and rows.get((k, tp, "copy"))
    }


def sweep_points(path, fig, regs):
    """Each plan of a device check's sweep.json: wq_b and wo_a at TP 1
    predicted under it, beside what the plan measured."""
    out = []
    for label, entry in load(path).items():
        plan = {PLAN_FIELDS[k]: int(v) for k, v in entry.get("env", {}).items() if v != ""}
        for key, row in entry.get("rows", {}).items():
            kind = key.split()[0]
            case = next((c for c in cases([kind]) if c.tp == 1), None)
            if case and key.endswith(" native"):
                p = predict(case, fig, regs, plan)
                out.append(
                    {
                        "plan": label,
                        "op": kind,
                        "x_copy_predicted": p["x_copy_predicted"],
                        "x_copy_measured": row.get("x_copy_device"),
                        "bound": [launch["bound"] for launch in p["launches"]],
                    }
                )
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--card", help="a JSON a device run wrote with its card (gpu.json, bench.json)")
    p.add_argument("--module", help="a built flashmla_perm/_C*.so: its sm_90 cubin's registers")
    p.add_argument("--measured", help="a bench.json: its native rows' x copy beside the prediction")
    p.add_argument("--sweep", help="a device check's sweep.json: each plan predicted beside measured")
    p.add_argument("--ops", help="only these ops (comma-separated)")
    p.add_argument("--json", help="write the records here")
    args = p.parse_args(argv)
    from card import card_in

    if args.module:
        from flashmla_perm.images import images
    regs = registers(images(args.module) if args.module else None)
    fig = card_figures(card_in(load(args.card)) if args.card else None)
    measured = measured_rows(args.measured) if args.measured else {}
    records = []
    print(
        f"card: {fig['name']}, {fig['sms']} SMs, peak {fig['peak_tbps']} TB/s, copy {fig['copy_tbps']:.3f} TB/s; "
        f"registers {regs}"
    )
    print(
        f"{'op':<15}{'tp':>3} {'MB moved':>9} {'us':>8} {'x copy':>7} {'measured':>9}  launches "
        "(kernel grid/CTAs per SM, KiB in flight per SM of needed, bound)"
    )
    for case in cases(args.ops.split(",") if args.ops else None):
        r = predict(case, fig, regs)
        if (case.op, case.tp) in measured:
            r["x_copy_measured"] = round(measured[(case.op, case.tp)], 3)
        records.append(r)
        print(
            f"{case.op:<15}{case.tp:>3} {r['bytes_moved'] / 1e6:>9.1f} {r['predicted_us']:>8.1f} "
            f"{r['x_copy_predicted']:>7.2f} {r.get('x_copy_measured', ''):>9}  "
            + "; ".join(
                f"{lp['kernel']} {lp['grid']}/{lp['ctas_per_sm']}, {lp['in_flight_per_sm'] / 1024:.0f} of "
                f"{lp['needed_in_flight_per_sm'] / 1024:.0f} KiB, {lp['bound']}"
                for lp in r["launches"]
            )
        )
    sweep = sweep_points(args.sweep, fig, regs) if args.sweep else []
    for s in sweep:
        print(
            f"sweep {s['plan']:<14} {s['op']:<6} x copy predicted {s['x_copy_predicted']:.2f}, measured "
            f"{s['x_copy_measured']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"card": fig, "registers": regs, "records": records, "sweep": sweep}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
