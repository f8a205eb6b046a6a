#!/usr/bin/env python3
"""GPU performance model of the model ops' launches, without a GPU.

Takes the launches csrc/launch.cpp plans for each op (through
flashmla_perm._ops._C.gpu_launches: grid, CTAs per SM, tiles, bytes, vector
widths), the kernels' instructions per item (read from a build's SASS with
`--sass`, or the counts recorded below), the layouts' shared-memory bank
conflicts, and an H200's figures (by default those fitted to the first
device run; `--figures stated` for the data sheet's), and predicts each
op's time as a fraction of a device-to-device copy of the same bytes, with
the time split by cause.

    python bench/gpu_model.py [--sass SO_OR_SASS] [--ptxas-log LOG] [--json PATH] [--check]
    python bench/gpu_model.py --measured gpu_check.json   # predicted vs measured, and a fit; and,
                                                          # without the model, each backend's fixed cost
                                                          # and bandwidth across TPs
    python bench/gpu_model.py --sweep sweep.json          # the check's plans, one fit across them for each
                                                          # explanation (a tile's round trip, each warp's issue)

The model (docs/PERFORMANCE.md, "GPU performance model"):

  * memory is one pipe of `--copy-tbps` (reads and writes both count) behind
    the load latency a tile sees, `--latency-us`, first come first served;
  * a copy of N bytes is one kernel per tensor: launch + `--copy-latency-us`
    each, then 2N / bandwidth;
  * a kernel's tiles go grid-stride to its CTAs (tile t to CTA t % grid: the
    scale's tiles come last), CTA c sits on SM c % SMs. With one stage a CTA
    issues a tile's loads (the stage loop), waits for them, then issues its
    stores (the store loop), and only then the next tile's loads; with two
    (a launch's `stages`: permute_q's direct tiles; `--stages` as a what-if)
    the next tile's loads go out before this tile's stores (cta_program).
    Issuing costs SM cycles: instructions per item (from the SASS) x items /
    32 lanes / (schedulers x instructions a clock), plus shared-memory bank
    conflict replays in the store loop; the CTAs issuing on one SM share it
    equally, none faster than its warps allow where `--warp-cpi` sets how
    often a warp can issue. While a CTA issues its stores it has no loads
    in flight, so with few CTAs per SM the pipe stands idle (Little's law);
  * the kernel's time is split by cause through counterfactual runs of the
    same simulation (`components`, microseconds; they sum to the prediction):
    launch, latency (one, as the copy), dram (2N / bandwidth), idle (the
    pipe idle with SM time left out), issue (the SMs' issue time beyond the
    memory time, were it fully overlapped), serialisation (what the real
    schedule, one or two stages, adds to that), bank (conflict replays), tail (the real
    tile sizes and order against every CTA doing an equal share).

Prints one row per op and TP, with PASS or BELOW against `--target` (0.9 of
the copy); exits 0 regardless, unless `--check` is given and a row is below.
"""

import argparse
import concurrent.futures
import heapq
import json
import math
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

KiB = 1024
MiB = 1 << 20

# DeepSeek-V4.1-Flash (DESIGN.md): 64 heads of 512, q_lora_rank 1280, o_lora_rank
# 1024 per group of 8 heads; Q activations: 4096 bf16 tokens.
HEADS, HEAD_DIM, Q_LORA_RANK, O_LORA_RANK, GROUP = 64, 512, 1280, 1024, 8
TOKENS, Q_ELEMENT_SIZE = 4096, 2
TPS = (1, 2, 4, 8)

# Registers per thread today (sm_90, nvcc 13, 128 threads per CTA; ptxas -v).
DEFAULT_REGS = {"rows": 71, "save_heads": 56, "cols": 56}

# Instructions per item (one V-byte vector) of each kernel's inner loops, on
# the path a full batch takes: read with `--sass` from the sm_90 SASS of the
# CUDA build of the change that gathers column chunks of at least 16 bytes in
# the stage loop (nvcc 13.0, torch 2.11). Before it, the staged column kernel
# took 54 + 66.1 instructions per item of the wo_a weight (stage in order,
# gather from the buffer) and 54 + 138.5 of its scale, the direct one 44 +
# 49.2; before FastDiv (commit 0ca06ab) rows took 60 + 89 and save_heads
# 54.8; e8ce307, before the rows store read its buffer with LDS, rows 49 + 59;
# before two-stage direct tiles (the loops averaged over the one-stage and
# the two-stage copies since), direct 39 + 35 and 13504 in the kernel; before
# the staged kernel had its two-stage copy (FLASHMLA_PERM_COL_STAGES; its
# loops averaged the same way since), staged 37.5 + 34.4 (gathered), 39 + 121
# (from the buffer) and 14216 in the kernel; before the rows kernel had its
# two-stage copy (FLASHMLA_PERM_ROW_STAGES; its V = 16 loops averaged the
# same way since), rows 47 + 59.5 and 12520 in the kernel; the direct
# kernel 40 + 32.8 and 15664 before its two-stage loop and the rows' shared
# one dispatch (two_stage_tiles in csrc/cuda_kernels.cu). Before the row
# loops went a warp a line (csrc/tile_bodies.h Warp; 2026-12-06), rows took
# 47.3 + 59.5 an item (V = 16; 47 + 59.5 at V = 8), every item its own
# position load and address, and 15552 instructions in the kernel.
# Key: (job kind, phase, V, bytes of the shared-memory piece the store loop
# reads; 0 for the stage loop). `python bench/gpu_model.py --sass SO` prints
# a build's counts.
SASS_BUILD = ("the CUDA build with row loops a warp a line (nvcc 13.0, sm_90; gathered slices, FastDiv item "
              "splits in the column loops, LDS in the rows store, two-stage staged column and row tiles)")
# (instructions per item, 32-bit divisions per item) on that path; row loops
# also (instructions a warp adds once a line, items a lane moves a trip,
# instructions of a narrow line's one-vector trip): item_instructions
# prices them by the job's line widths.
SASS_DEFAULTS = {
    ("rows", "stage", 16, 0): (10.0, 0.0, 50.0, 1.0, 10.0), ("rows", "store", 16, 16): (5.5, 0.0, 63.5, 4.0, 8.0),
    ("rows", "stage", 8, 0): (10.0, 0.0, 56.0, 1.0, 10.0), ("rows", "store", 8, 8): (5.5, 0.0, 67.0, 4.0, 8.0),
    ("cols_staged", "gather_stage", 16, 0): (37.8, 0.0), ("cols_staged", "linear_store", 16, 16): (33.5, 0.0),
    ("cols_staged", "stage", 16, 0): (40.0, 0.0), ("cols_staged", "store", 16, 1): (121.5, 0.0),
    ("cols_staged", "stage", 4, 0): (37.5, 0.0), ("cols_staged", "store", 4, 1): (57.0, 0.0),
    ("cols_direct", "gather_stage", 16, 0): (36.7, 0.0), ("cols_direct", "linear_store", 16, 16): (31.8, 0.0),
    ("save_heads", "store", 16, 16): (36.0, 0.0),
}
SASS_TOTALS = {"rows": 10192, "save_heads": 8144, "cols_staged": 19088, "cols_direct": 15536}

# Stated device figures (H200 SXM, NVIDIA's data sheet, except where noted).
H200 = {
    "sms": 132, "smem_per_sm_kib": 228, "clock_ghz": 1.98, "schedulers": 4,
    "hbm_tbps": 4.8,      # peak: printed beside the copy; another card's copy scales by its peak over this
    "copy_tbps": 4.3,     # device copy, read + write: ~90 % of peak, what a D2D copy reaches on HBM3e
    "latency_us": 0.7,    # DRAM load latency under load: 600-800 ns on Hopper (microbenchmarks)
    "copy_latency_us": 0.7,  # a copy kernel's first bytes: the same latency
    "launch_us": 2.5,     # per launch, back to back on a stream: 2-4 us
    "ipc": 1.0,           # instructions a scheduler issues a clock (at most one)
    "memory": "fifo",     # how the memory pipe serves its transfers (PIPES)
    "tile_cycles": 400,   # per tile: its setup (64-bit tile geometry), cp.async wait, two barriers; an estimate
    "warp_cpi": 0.0,      # cycles a warp needs between its instructions at best (0: no limit but the SM's)
    "smem_wavefront_bytes": 128,  # shared memory serves 128 bytes a clock per SM (32 banks x 4 bytes)
}

# The figures `--measured` fitted to the first device run (NVIDIA H200, driver
# 580.159.04, torch 2.11.0+cu130, 2026-12-04; bench/gpu_check.sh's bench.json,
# wq_b and wo_a at TP 1-8; docs/PERFORMANCE.md): the bandwidth and launch of
# the benchmark's copies, and the load latency a tile sees and the issue rate
# that best explain the kernels' device times. The default since that run.
H200_MEASURED = {"copy_tbps": 4.065, "launch_us": 1.205, "latency_us": 4.55, "ipc": 0.753, "memory": "fifo",
                 "warp_cpi": 0.0}
H200_RUNTIME_PEAK_TBPS = 2 * 3.201e9 * 6144 / 8 / 1e12  # 4.917: the runtime's clock x bus, not the data sheet's
FIGURE_SETS = {"measured": "fitted to the H200 run of 2026-12-04",
               "stated": "data sheet and microbenchmarks, before any device run"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = p.add_argument_group("device figures (H200 defaults: --figures; each flag overrides its own)")
    d.add_argument("--figures", choices=tuple(FIGURE_SETS), default="measured",
                   help="defaults for bandwidth, launch, latency and issue rate: " +
                        "; ".join(f"{k}: {v}" for k, v in FIGURE_SETS.items()))
    d.add_argument("--card", metavar="JSON",
                   help="the card a device run was on (gpu_check's gpu.json, or bench_load_time.py's --json): its "
                        "SMs, shared memory, clock and memory peak in place of the H200's, and the copy's "
                        "bandwidth scaled by its peak over the H200's (bench/card.py)")
    d.add_argument("--sms", type=int, help="SMs")
    d.add_argument("--smem-per-sm-kib", type=int, help="shared memory per SM")
    d.add_argument("--smem-reserved-per-cta", type=int, default=1024, help="bytes the runtime keeps per CTA")
    d.add_argument("--regs-per-sm", type=int, default=64 * 1024)
    d.add_argument("--threads-per-sm", type=int, default=2048)
    d.add_argument("--max-ctas-per-sm", type=int, default=32)
    d.add_argument("--clock-ghz", type=float, help="SM clock (boost)")
    d.add_argument("--schedulers", type=int, default=H200["schedulers"], help="warp schedulers per SM")
    d.add_argument("--ipc", type=float, default=None, help="instructions a scheduler issues a clock")
    d.add_argument("--hbm-tbps", type=float,
                   help="HBM peak (printed; the copy's default bandwidth scales by it over the H200's 4.8)")
    d.add_argument("--copy-tbps", type=float, default=None,
                   help="device-to-device copy bandwidth, read and write bytes both counted (TB/s)")
    d.add_argument("--latency-us", type=float, default=None,
                   help="load latency a tile of our kernels sees (us)")
    d.add_argument("--copy-latency-us", type=float, default=H200["copy_latency_us"],
                   help="a copy kernel's latency to its first bytes (us): its fixed cost is launch + this")
    d.add_argument("--launch-us", type=float, default=None, help="per launch (us)")
    d.add_argument("--memory", choices=tuple(PIPES), default=None,
                   help="how the memory pipe serves the transfers in it: shared (every one at an equal share, "
                        "as DRAM interleaves the requests it holds) or fifo (one at a time, whole)")
    d.add_argument("--warp-cpi", type=float, default=None,
                   help="cycles a warp needs from one instruction to its next at best, its dependent chain "
                        "(the per-item index loads, FastDivs and 64-bit addresses), so that a CTA of W warps "
                        "issues at most W / this a clock whatever the SM has spare: then fewer CTAs a SM issue "
                        "slower (0, the default: no such limit, only the SM's issue rate)")
    d.add_argument("--tile-cycles", type=float, default=H200["tile_cycles"],
                   help="SM cycles per tile outside the item loops (stated estimate)")
    d.add_argument("--tile-instructions", type=float, default=0.0,
                   help="warp instructions per tile outside the item loops, in place of --tile-cycles: "
                        "SM cycles at the issue rate (so that a fit of the issue rate keeps a tile's "
                        "instructions, not its cycles; 0: --tile-cycles)")
    r = p.add_argument_group("kernels")
    r.add_argument("--sass", metavar="SO_OR_SASS",
                   help="count instructions per item from this build (.so: cuobjdump -sass; or its text)")
    r.add_argument("--ptxas-log", metavar="PATH", help="build log with ptxas -v output (default: today's figures)")
    r.add_argument("--arch", default="sm_90", help="architecture to read from the log or the .so")
    for k, v in DEFAULT_REGS.items():
        r.add_argument(f"--regs-{k.replace('_', '-')}", type=int, help=f"override ({k} kernel; today {v})")
    r.add_argument("--max-ctas", type=int, help="cap CTAs per SM (a what-if: the launches are re-planned)")
    r.add_argument("--col-stages", type=int, choices=(1, 2),
                   help="tile buffers a CTA of staged column tiles cycles through, as FLASHMLA_PERM_COL_STAGES "
                        "plans them (the launches are re-planned: half-size tiles with 2; default: the "
                        "executor's, 1)")
    r.add_argument("--row-stages", type=int, choices=(1, 2),
                   help="the same for row tiles of one pass, as FLASHMLA_PERM_ROW_STAGES plans them (default: "
                        "the executor's, 2 where every tile is one pass; 1 to re-read a run of the 2026-12-04 "
                        "build, which had one)")
    r.add_argument("--tile-budget", type=int, default=0,
                   help="bytes a row or staged column tile buffers, as FLASHMLA_PERM_TILE_BUDGET plans them "
                        "(0: the kernels' 32 KiB)")
    r.add_argument("--stages", type=int, default=1,
                   help="tile buffers a CTA cycles through (a what-if; the kernels have 1): with 2, a tile's "
                        "loads are in flight while the one before it stores. Each buffer is the planned tile, "
                        "so the CTAs a SM fall to what the shared memory holds")
    p.add_argument("--target", type=float, default=0.9, help="fraction of the copy the kernels aim for")
    p.add_argument("--json", metavar="PATH", help="write one record per op and case here")
    p.add_argument("--check", action="store_true", help="exit 1 if any case is below the target")
    p.add_argument("--measured", metavar="FILE",
                   help="a device run's gpu_check.json (or bench_load_time.py --json): predicted vs measured, fit")
    p.add_argument("--ops", help="only these ops (comma-separated)")
    p.add_argument("--explanation", choices=tuple(EXPLANATIONS), default="round_trip",
                   help="what --measured fits the native rows by (EXPLANATIONS; --sweep fits each): a tile's "
                        "round trip (latency and issue rate) or each warp's issue (warp_cpi); the figures it "
                        "holds replace the flags'")
    p.add_argument("--sweep", metavar="FILE",
                   help="a device check's sweep.json: each plan predicted vs measured, and one fit across them")
    p.add_argument("--fit-evals", type=int, default=160,
                   help="most evaluations a fit (--measured, --sweep) makes; few only to exercise the plumbing")
    args = p.parse_args(argv)
    apply_figures(args)
    return args


def apply_figures(args):
    """Fills each device figure no flag gave: from the card (--card, else
    the one a --measured or --sweep run recorded) where it has it, else the
    H200's; the figure set's bandwidth, launch, latency and issue rate (both
    sets were taken on an H200), the copy's bandwidth scaled by the card's
    memory peak over the H200's. Every card the device tool lends has the
    same Hopper SM, so the rest carries over."""
    card = {}
    if args.card:
        card = find_card(args.card)
        if card is None:
            sys.exit(f"gpu_model: {args.card} names no CUDA card (no 'card' with its SMs)")
    elif args.measured or args.sweep:
        card = find_card(args.measured or args.sweep) or {}
    args.card_name = card.get("name", "H200 (no card given)")
    assumed = []
    for k, card_key in (("sms", "sms"), ("smem_per_sm_kib", "smem_per_sm_kib"), ("clock_ghz", "clock_ghz"),
                        ("hbm_tbps", "peak_tbps")):
        if getattr(args, k) is None:
            setattr(args, k, card.get(card_key) or H200[k])
            if card and not card.get(card_key):
                assumed.append(f"{k} {H200[k]}")
    if assumed:  # said where the figures are printed and recorded
        args.card_name += f" (not known, the H200's assumed: {', '.join(assumed)})"
    # Peaks compare on one footing: a card's from the runtime against the
    # H200's from the runtime (2 x its 3201 MHz x 6144 bits, the first run).
    runtime_peak = card.get("source", "").startswith("runtime") and args.hbm_tbps == card.get("peak_tbps")
    chosen = dict(H200_MEASURED if args.figures == "measured" else H200)
    chosen["copy_tbps"] *= args.hbm_tbps / (H200_RUNTIME_PEAK_TBPS if runtime_peak else H200["hbm_tbps"])
    for k in H200_MEASURED:
        if getattr(args, k) is None:
            setattr(args, k, chosen[k])


def find_card(path):
    """The card a gpu.json, bench.json or gpu_check.json recorded (or the
    gpu.json beside it), or None."""
    from card import card_in  # bench/card.py

    with open(path) as f:
        card = card_in(json.load(f))
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "gpu.json")
    if card is None and os.path.basename(path) != "gpu.json" and os.path.exists(beside):
        return find_card(beside)
    return card


# --------------------------------------------------------------------------- SASS: instructions per item

STG = {16: "STG.E.128", 8: "STG.E.64", 4: "STG.E", 2: "STG.E.U16", 1: "STG.E.U8"}
LDGSTS = {16: "LDGSTS.E.BYPASS.128", 8: "LDGSTS.E.64", 4: "LDGSTS.E"}  # cp.async .cg 16 / .ca 8, 4
LDS = {16: "LDS.128", 8: "LDS.64", 4: "LDS", 2: "LDS.U16", 1: "LDS.U8"}
LDG = {16: "LDG.E.128", 8: "LDG.E.64", 4: "LDG.E", 2: "LDG.E.U16", 1: "LDG.E.U8"}
KERNEL_OF_SYMBOL = (("flashmla_perm_colsILb1", "cols_staged"), ("flashmla_perm_colsILb0", "cols_direct"),
                    ("flashmla_perm_save_heads", "save_heads"), ("flashmla_perm_rows", "rows"))
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;")


def opcode(text):
    words = text.split()
    return words[1] if words[0].startswith("@") else words[0]


def sass_functions(text):
    """{kernel kind: [(address, instruction text)]} from cuobjdump -sass output."""
    parts = re.split(r"\n\s*Function : (\S+)\n", text)
    out = {}
    for symbol, body in zip(parts[1::2], parts[2::2]):
        kind = next((k for s, k in KERNEL_OF_SYMBOL if s in symbol), None)
        if kind:
            out[kind] = [(int(a, 16), t) for a, t in INSTRUCTION.findall(body)]
    return out


def inner_loops(instructions):
    """(first, last) indices of every innermost loop: a backward branch and
    its target, with no other loop inside."""
    index = {a: i for i, (a, _) in enumerate(instructions)}
    loops = []
    for i, (a, t) in enumerate(instructions):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in index:
            loops.append((index[int(m.group(1), 16)], i))
    return [l for l in loops if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]


def enclosing_loop(instructions, first, last):
    """(first, last) of the smallest loop around the loop first..last, or
    None; None too where that loop holds a barrier (BAR): it is then a
    pass's or a tile's loop, not a warp's loop over lines (builds before the
    row loops went a warp a line)."""
    index = {a: i for i, (a, _) in enumerate(instructions)}
    around = []
    for i, (a, t) in enumerate(instructions[last + 1:], last + 1):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", t)
        if m and int(m.group(1), 16) <= a and index.get(int(m.group(1), 16), last + 1) <= first:
            around.append((index[int(m.group(1), 16)], i))
    if not around:
        return None
    outer = min(around, key=lambda l: l[1] - l[0])
    has_barrier = any(opcode(t).startswith("BAR") for _, t in instructions[outer[0]:outer[1] + 1])
    return None if has_barrier else outer


def unconditional(text):
    """A branch taken whatever its predicates: no guard (@P0 BRA) and no
    predicate operand (sm_100's BRA.U UP0, ... and BRA.U !UP0, ...)."""
    return not text.startswith("@") and not re.match(r"BRA\S*\s+!?U?P[0-9T]", text)


def loop_path(instructions, first, last, mark, piece):
    """The path through one loop body (forward branches only) that executes
    the most `mark` instructions (the item's store or cp.async), then the
    most `piece` ones (its shared-memory read), then the fewest instructions:
    a full batch on the fast path. Returns (instructions, marks, divisions)
    along it; divisions: MUFU.RCP, the reciprocal a 32-bit division starts with."""
    best = {first: (0, 0, 0, 0)}  # index -> (marks, pieces, -instructions, divisions) on arrival
    for i in range(first, last + 1):
        if i not in best:
            continue
        marks, pieces, neg, divs = best[i]
        op = opcode(instructions[i][1])
        state = (marks + (op == mark), pieces + (op == piece), neg - 1, divs + (op == "MUFU.RCP"))
        if i == last:
            best["end"] = state
            break
        targets = []
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", instructions[i][1])
        if m:
            target = int(m.group(1), 16)
            targets += [j for j in range(i + 1, last + 1) if instructions[j][0] == target][:1]
        if not (m and unconditional(instructions[i][1])):  # falls through unless an unconditional branch
            targets.append(i + 1)
        for j in targets:
            if j not in best or state[:3] > best[j][:3]:
                best[j] = state
    marks, _, neg, divs = best.get("end", (0, 0, 0, 0))
    return -neg, marks, divs


# Column kernels read their map (source_offset[], int32) in exactly one loop
# of a tile: the stage loop of a gathered slice ("gather_stage", then a
# "linear_store"), or the store loop of a gather from the tile buffer
# ("stage" of rows in order, then "store").
OFFSET_LOAD = "LDG.E"
READS_OFFSETS = {"gather_stage": True, "linear_store": False, "stage": False, "store": True}


def loop_figures(functions, kind, phase, vec, piece):
    """Instructions and divisions per item of one kernel's loop for (phase, V,
    piece), averaged over its copies (one per job slot); None if absent."""
    if phase.endswith("stage"):
        mark, read = LDGSTS.get(vec), None
    else:
        mark = STG[vec]
        read = {"save_heads": LDG}.get(kind, LDS)[piece]
    offsets = READS_OFFSETS[phase] if kind.startswith("cols") else None
    instructions = functions.get(kind, [])
    found = []
    for first, last in inner_loops(instructions):
        ops = {opcode(t) for _, t in instructions[first:last + 1]}
        if mark in ops and (read is None or read in ops) and offsets in (None, OFFSET_LOAD in ops):
            n, marks, divs = loop_path(instructions, first, last, mark, read)
            if marks:
                line = 0
                if kind == "rows":  # the line loop around it: what a warp adds once a line
                    outer = enclosing_loop(instructions, first, last)
                    line = loop_path(instructions, *outer, mark, read)[0] - n if outer else 0
                found.append((n / marks, divs / marks, line, marks))
    if not found:
        return None

    def mean(fs, k):
        return round(sum(f[k] for f in fs) / len(fs), 1)
    if kind != "rows":
        return mean(found, 0), mean(found, 1)
    # Row loops: a warp's line loop takes the widest batch (a whole warp's
    # line, kBatch vectors a lane); narrower lines, several to a warp, the
    # one-vector loop (its trip). The line's setup is read beside the widest
    # (the narrow loop shares its line loop).
    wide = [f for f in found if f[3] == max(g[3] for g in found)]
    narrow = [f for f in found if f[3] == 1] or wide
    return (mean(wide, 0), mean(wide, 1), mean(wide, 2), mean(wide, 3),
            round(sum(f[0] * f[3] for f in narrow) / len(narrow), 1))


# The loops the model ops run: (job kind, phase, V, piece).
LOOPS = [("rows", "stage", 16, 0), ("rows", "store", 16, 16), ("rows", "stage", 8, 0), ("rows", "store", 8, 8),
         ("cols_staged", "gather_stage", 16, 0), ("cols_staged", "linear_store", 16, 16),
         ("cols_staged", "stage", 16, 0), ("cols_staged", "store", 16, 1),
         ("cols_staged", "stage", 4, 0), ("cols_staged", "store", 4, 1),
         ("cols_direct", "gather_stage", 16, 0), ("cols_direct", "linear_store", 16, 16),
         ("save_heads", "store", 16, 16)]


def read_sass(text):
    """{loop key: (instructions per item, divisions per item)}, {kernel: instructions}."""
    functions = sass_functions(text)
    counts = {key: loop_figures(functions, *key) for key in LOOPS}
    return {k: v for k, v in counts.items() if v}, {k: len(v) for k, v in functions.items()}


def find_cuobjdump():
    """cuobjdump from $CUOBJDUMP, PATH, the toolkit, or a pip package (triton
    bundles one; so does nvidia-cuda-cuobjdump)."""
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                  os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")]
    try:
        import triton  # noqa: F401

        candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except Exception:
        pass
    for base in sys.path:
        candidates.append(os.path.join(base, "nvidia", "cuda_cuobjdump", "bin", "cuobjdump"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def sass_text(path, arch):
    if not path.endswith(".so"):
        with open(path, errors="replace") as f:
            return f.read()
    tool = find_cuobjdump()
    if not tool:
        sys.exit("gpu_model: --sass with a .so needs cuobjdump (CUOBJDUMP=..., or pip install nvidia-cuda-cuobjdump)")
    out = subprocess.run([tool, "-sass", "-arch", arch, path], capture_output=True, text=True)
    if out.returncode or "Function" not in out.stdout:
        sys.exit(f"gpu_model: no {arch} SASS in {path}: {out.stderr.strip()[:300]}")
    return out.stdout


def kernel_loops(args):
    """Per-item counts and where they came from."""
    if not args.sass:
        return dict(SASS_DEFAULTS), dict(SASS_TOTALS), f"recorded counts, read from {SASS_BUILD}"
    counts, totals = read_sass(sass_text(args.sass, args.arch))
    missing = [k for k in LOOPS if k not in counts]
    source = f"{args.sass} ({args.arch})"
    if missing:
        source += f"; recorded counts for {len(missing)} loop(s) not found there"
        counts = {**{k: SASS_DEFAULTS[k] for k in missing if k in SASS_DEFAULTS}, **counts}
    return counts, totals, source


# --------------------------------------------------------------------------- layouts

def q_unit_permutation(heads, head_dim):
    """The Q permutation on 16-row blocks (DESIGN.md): fused block c * H + h
    <- standard block h * (D / 16) + c."""
    n = head_dim // 16
    perm = [0] * (heads * n)
    for h in range(heads):
        for c in range(n):
            perm[c * heads + h] = h * n + c
    return perm


def cycle_lengths(perm):
    """Lengths of the cycles that move, in the order the plan walks them
    (csrc/plan.cpp: from the lowest unmoved unit; fixed points dropped)."""
    done, out = [False] * len(perm), []
    for start in range(len(perm)):
        length, u = 0, start
        while not done[u]:
            done[u], u, length = True, perm[u], length + 1
        if length > 1:
            out.append(length)
    return out


def o_offsets(group, head_dim, chunk):
    """Source byte of each destination chunk of a wo_a row (chunk bytes per
    element: 1 for the fp8 weight, the O permutation; the per-32 scale is the
    O chunk permutation of one byte per 32 columns)."""
    if chunk == 32:  # weight: fused (c * G + h) * 32 <- h * D + c * 32
        return [h * head_dim + c * 32 for c in range(head_dim // 32) for h in range(group)]
    return [h * (head_dim // 32) + c for c in range(head_dim // 32) for h in range(group)]


def bank_wavefronts(addresses, width):
    """Shared-memory wavefronts one warp-wide load takes: the warp is served in
    phases (16 bytes a lane: 8 lanes at once; 8 bytes: 16; else all 32), and a
    phase takes as many wavefronts as the most distinct 4-byte words any of the
    32 banks holds. Returns (wavefronts, phases): conflict-free is equal."""
    lanes = 128 // max(width, 4) if width >= 8 else 32
    total = phases = 0
    for p in range(0, 32, lanes):
        banks = {}
        for a in addresses[p:p + lanes]:
            for word in range(a // 4, (a + width - 1) // 4 + 1):
                banks.setdefault(word % 32, set()).add(word)
        total += max(len(w) for w in banks.values())
        phases += 1
    return total, phases


def gather_wavefronts(offsets, chunk, vec, row_bytes):
    """Shared-memory wavefronts per item of a staged column gather's store
    loop, (conflict-free, as the layout has them): lane l takes vector l of a
    row (rows of whole runs: the row's vectors are neighbours;
    csrc/tile_bodies.h col_staged_tile), and each piece load is one warp-wide
    load of min(V, chunk) bytes at the gathered source."""
    piece = min(vec, chunk)
    per_row = row_bytes // vec
    ideal = actual = 0
    for k in range(vec // piece):
        addrs = []
        for lane in range(32):
            r, b = divmod(lane, per_row)
            src = b * vec + k * piece
            addrs.append(r * row_bytes + offsets[src // chunk] + src % chunk)
        waves, phases = bank_wavefronts(addrs, piece)
        ideal, actual = ideal + phases, actual + waves
    return ideal / 32, actual / 32


# --------------------------------------------------------------------------- cases

@dataclass
class Case:
    op: str
    tp: int
    dims: list
    kernel: str          # which kernel's registers size the launch
    tensors: int         # tensors the op touches (the copy: one kernel each)
    chunks: tuple        # per job: bytes a destination chunk moves as one (rows: the line, 0)
    cycles: list         # rows jobs: cycle lengths in plan order (tile bytes follow them)
    offsets: tuple       # per job: gather map of a staged column job (bank conflicts), or None
    row_bytes: tuple     # per job: logical bytes of a staged row


def cases(ops=None):
    out = []
    for tp in TPS:
        rows, heads = HEADS // tp * HEAD_DIM, HEADS // tp
        cyc = cycle_lengths(q_unit_permutation(heads, HEAD_DIM))
        out.append(Case("wq_b", tp, [rows, Q_LORA_RANK, heads], "rows", 2, (0, 0), cyc, (None, None), (0, 0)))
        out.append(Case("wq_b_packed", tp, [rows, Q_LORA_RANK, heads, 32], "rows", 2, (0, 0), cyc, (None, None),
                        (0, 0)))
    cols = GROUP * HEAD_DIM
    offs = (o_offsets(GROUP, HEAD_DIM, 32), o_offsets(GROUP, HEAD_DIM, 1))
    for tp in TPS:
        rows = HEADS // GROUP // tp * O_LORA_RANK
        out.append(Case("wo_a", tp, [rows, cols, GROUP], "cols", 2, (32, 1), [], offs, (cols, cols // 32)))
        groups = max(HEADS // GROUP // tp, 1)
        # The packed scale's rows are 32 words of 4 bytes staged rows-fastest (padded pitch): no gather conflicts
        # are modelled for it.
        out.append(Case("wv_packed", tp, [groups, O_LORA_RANK, cols, GROUP], "cols", 2, (32, 1), [],
                        (offs[0], None), (cols, cols // 32)))
    for name, heads in (("permute_q", HEADS), ("permute_q_h128", 2 * HEADS)):
        for tp in TPS:  # Q activations [tokens, heads / tp, 512] bf16, out of place (chunks of 16 elements)
            out.append(Case(name, tp, [TOKENS, heads // tp, HEAD_DIM, Q_ELEMENT_SIZE], "cols", 1, (32,), [],
                            (None,), (0,)))
    order = ("wq_b", "wo_a", "wq_b_packed", "wv_packed", "permute_q", "permute_q_h128")
    out.sort(key=lambda c: (order.index(c.op), c.tp))
    return [c for c in out if not ops or c.op in ops]


# --------------------------------------------------------------------------- tiles and their SM cost

@dataclass
class Tile:
    bytes: float
    stage: float  # SM cycles issuing the loads (its whole share of the SM)
    store: float  # SM cycles issuing the stores, bank replays included
    bank: float   # of which bank-conflict replays
    inline: bool = False  # under two stages, runs whole in its store half (cta_program)
    # Of `stage` and `store`, the cycles that are issuing (the rest: the
    # shared-memory path, where it takes longer); None: all of them. Only a
    # warp's limit (issue_cap) tells them apart.
    stage_issue: float = None
    store_issue: float = None
    # Of `stage` and `store`, the issuing cycles the busiest warp adds
    # beyond an even share: the row loops give whole lines to line slots
    # (csrc/tile_bodies.h Warp: a warp each, or several narrow lines to a
    # warp), so a loop over L lines on W slots takes ceil(L / W) / (L / W)
    # of its even time (warp_spread). Only a warp's limit (issue_cap) feels
    # it: idle warps leave the SM's slots to others.
    stage_uneven: float = 0.0
    store_uneven: float = 0.0


def tile_bytes(job, cycles):
    """Bytes of each tile of a job, in tile order. Row jobs: a tile is one
    (segment, slice), so its bytes follow its cycle's length when the tiles
    split every segment alike; column jobs: full tiles, the last the rest."""
    n, total = job["tiles"], job["bytes"]
    if job["kind"] in ("rows", "save_heads"):
        if cycles and n % len(cycles) == 0:
            per = n // len(cycles)
            unit = total / (sum(cycles) * per)
            return [length * unit for length in cycles for _ in range(per)]
        return [total / n] * n
    full = job["max_tile_bytes"]
    return [full] * (n - 1) + [total - full * (n - 1)]


def job_loops(job, chunk):
    """The (kind, phase, V, piece) loops one item of a job goes through.
    Column jobs the launch marks `gathered_stage` gather in the stage loop
    and store linearly (csrc/tile_bodies.h gathers_in_stage,
    col_gathered_slice); the others gather from the staged rows (staged) or
    from memory (direct)."""
    kind, vec = job["kind"], job["vec"]
    if kind == "save_heads":
        return [(kind, "store", vec, vec)]
    if job.get("gathered_stage"):
        return [(kind, "gather_stage", vec, 0), (kind, "linear_store", vec, vec)]
    piece = min(vec, chunk) if kind.startswith("cols") else vec  # the shared-memory (direct: global) read
    if kind == "cols_direct":
        return [(kind, "store", vec, piece)]  # gathered straight from memory (not in the model ops)
    return [(kind, "stage", vec, 0), (kind, "store", vec, piece)]


def sm_cycles(instructions_per_item, items, fig):
    """SM cycles to issue `items` items: 32 a warp instruction, the SM's
    schedulers each issuing `ipc` a clock."""
    return items / 32 * instructions_per_item / (fig["schedulers"] * fig["ipc"])


def item_instructions(loop, job):
    """Instructions a lane issues an item in one loop, on average. A row
    loop (csrc/tile_bodies.h row_pass_stage / row_pass_store, Warp) gives
    each warp whole lines: its lanes move `batch` vectors a trip, trip
    after trip, and the warp pays `line` instructions once a line (the
    position's load, the line's address). A line of over 16 vectors takes
    a whole warp: ceil(w / (32 batch)) trips and the setup; a narrower one
    gets line_lanes(w) lanes, 32 / lanes lines to a warp, and costs that
    share of one `narrow` trip and the setup. Each slice of the job's
    lines, the last one narrower, weighted by its vectors."""
    if len(loop) < 5 or not loop[2]:
        return loop[0]
    n, _, line, batch, narrow = loop
    width, whole = job["slice_vectors"], job["line_vectors"]
    slices = [width] * (whole // width) + ([whole % width] if whole % width else [])

    def warp_instructions(w):
        lanes = line_lanes(w)
        if lanes == 32:
            return math.ceil(w / (32 * batch)) * batch * n + line
        return (narrow + line) * lanes / 32
    return 32 * sum(warp_instructions(w) for w in slices) / whole


def line_lanes(vectors):
    """Lanes the row loops give a line of `vectors` (csrc/tile_bodies.h
    Warp): the power of two at or above it, at most a warp."""
    return min(32, 2 ** math.ceil(math.log2(max(1, vectors))))


def job_tiles(job, case, j, loops, fig, stages=1):
    """The job's tiles with their SM cost. Under two stages a staged tile
    that gathers from its buffer (the scales) runs whole in its store half
    (csrc/tile_bodies.h col_staged_half): inline."""
    chunk = case.chunks[j] if j < len(case.chunks) else 0
    per_item = {}
    for key in job_loops(job, chunk):
        if key not in loops:
            raise KeyError(f"no instruction count for loop {key}")
        per_item["stage" if key[1].endswith("stage") else "store"] = item_instructions(loops[key], job)
    # The L1/shared-memory data path: 128 bytes a clock per SM. Loads fill the
    # tile buffer (V / 128 wavefronts an item); stores read it (gathers: a
    # wavefront per phase of each piece load, more where banks conflict) and
    # write V bytes out. It overlaps issuing: a phase takes the longer of the two.
    vec = job["vec"]
    ideal = actual = vec / fig["smem_wavefront_bytes"]
    offsets = case.offsets[j] if j < len(case.offsets) else None
    if job["kind"] == "cols_staged" and offsets is not None and not job.get("gathered_stage"):
        ideal, actual = gather_wavefronts(offsets, chunk, vec, case.row_bytes[j])
    write = vec / fig["smem_wavefront_bytes"]
    inline = stages > 1 and job["kind"] == "cols_staged" and not job.get("gathered_stage")
    out = []
    for b in tile_bytes(job, case.cycles):
        items = b / vec
        stage_issue = sm_cycles(per_item.get("stage", 0), items, fig) if "stage" in per_item else 0.0
        stage = max(stage_issue, items * write) if "stage" in per_item else 0.0
        issue = sm_cycles(per_item["store"], items, fig)
        store, store_ideal = max(issue, items * (actual + write)), max(issue, items * (ideal + write))
        uneven = warp_spread(job, items, fig) - 1
        out.append(Tile(b, stage + fig["tile_cycles"], store, store - store_ideal, inline,
                        stage_issue + fig["tile_cycles"], issue, stage_issue * uneven, issue * uneven))
    return out


def warp_spread(job, items, fig):
    """How much longer than an even share the busiest warp of a row tile of
    `items` vectors issues its loops: the tile's lines (its units times their
    lines, each a slice wide) dealt to the CTA's line slots (a warp each, or
    32 / line_lanes for narrow lines) a line at a time. From the tile's
    bytes: a pass's lines where the tile is one pass (the model ops'; a cut
    segment's stage loop has a line fewer). Other tiles spread their items
    over every thread: 1."""
    if job["kind"] != "rows" or not job.get("slice_vectors"):
        return 1.0
    width = job["slice_vectors"]
    lines, slots = max(1, round(items / width)), fig.get("warps", 4) * (32 // line_lanes(width))
    return math.ceil(lines / slots) * slots / lines


def launch_tiles(launch, case, loops, fig):
    """Every tile of a launch, in launch order (job 0's first)."""
    out = []
    for j, job in enumerate(launch["jobs"]):
        if job["tiles"]:
            out += job_tiles(job, case, j, loops, fig, launch.get("stages", 1))
    return out


def balanced(tiles, grid):
    """The same work with no tail: every CTA the same number of tiles (as
    near the real count as a whole number allows), each tile the mean of all
    the launch's tiles (bytes, cycles)."""
    per_cta = max(1, round(len(tiles) / grid))
    scale = len(tiles) / (per_cta * grid)
    mean = Tile(*(sum(getattr(t, f) for t in tiles) / len(tiles) * scale for f in ("bytes", "stage", "store", "bank")),
                stage_issue=sum(issuing(t, "stage") for t in tiles) / len(tiles) * scale,
                store_issue=sum(issuing(t, "store") for t in tiles) / len(tiles) * scale,
                stage_uneven=sum(t.stage_uneven for t in tiles) / len(tiles) * scale,
                store_uneven=sum(t.store_uneven for t in tiles) / len(tiles) * scale)
    return [mean] * (per_cta * grid)


def issuing(tile, which, bank=True):
    """SM cycles of a tile's stage or store loop that are issuing."""
    given = tile.stage_issue if which == "stage" else tile.store_issue
    total = tile.stage if which == "stage" else tile.store - (0.0 if bank else tile.bank)
    return total if given is None else min(given, total)


def warp_issuing(tile, which, bank=True):
    """The same, as a warp's limit sees it: the busiest warp's share."""
    return issuing(tile, which, bank) + (tile.stage_uneven if which == "stage" else tile.store_uneven)


# --------------------------------------------------------------------------- the simulation

def cta_program(tiles, stages, inline=None):
    """The order a CTA issues its tiles' loops in, with `stages` tile buffers:
    ("stage", k) issues tile k's loads, ("wait", k) waits for them to land,
    ("store", k) issues its stores. One stage: stage 0, wait 0, store 0,
    stage 1, ...; two (two_stage_loop): stage 0, stage 1, wait 0, store 0,
    stage 2, wait 1, ... An inline tile (inline[k]: its loads issued in its
    store half, csrc/tile_bodies.h col_staged_half) is not staged ahead: at
    its turn it stages, waits for its own loads and for the next tile's
    already in flight (cp.async.wait_all), then stores."""
    inline = inline or [False] * tiles
    if not any(inline):  # `stages` buffers: tile k + stages is staged once tile k has stored
        prog = [("stage", k) for k in range(min(stages, tiles))]
        for k in range(tiles):
            prog += [("wait", k), ("store", k)]
            if k + stages < tiles:
                prog.append(("stage", k + stages))
        return prog
    assert stages == 2, "inline tiles come only from two_stage_loop"
    prog = [] if inline[0] else [("stage", 0)]
    for k in range(tiles):
        ahead = k + 1 < tiles and not inline[k + 1]
        if ahead:
            prog.append(("stage", k + 1))
        if inline[k]:
            prog += [("stage", k), ("wait", k)] + ([("wait", k + 1)] if ahead else [])
        else:
            prog.append(("wait", k))
        prog.append(("store", k))
    return prog


class FifoPipe:
    """Memory as one pipe, first come first served: a transfer is served
    whole at the full bandwidth, after every transfer that came before it."""

    def __init__(self, bw):
        self.bw, self.free, self.queue, self.seq = bw, 0.0, [], 0

    def arrive(self, now, nbytes, who):
        self.free = max(self.free, now) + nbytes / self.bw
        heapq.heappush(self.queue, (self.free, self.seq, who))
        self.seq += 1

    def next_done(self):
        return self.queue[0][0] if self.queue else None

    def done(self, now):
        out = []
        while self.queue and self.queue[0][0] <= now:
            out.append(heapq.heappop(self.queue)[2])
        return out


class SharedPipe:
    """Memory as one pipe shared equally by every transfer in it (processor
    sharing): n transfers each move at bw / n, so tiles issued together land
    together, as a DRAM system interleaves all the requests it holds. Kept in
    virtual time: v grows at bw / n, and a transfer of b bytes that arrives at
    v = v0 is done when v reaches v0 + b."""

    def __init__(self, bw):
        self.bw, self.v, self.t, self.queue, self.seq = bw, 0.0, 0.0, [], 0

    def advance(self, now):
        if self.queue:
            self.v += (now - self.t) * self.bw / len(self.queue)
        self.t = now

    def arrive(self, now, nbytes, who):
        self.advance(now)
        heapq.heappush(self.queue, (self.v + nbytes, self.seq, who))
        self.seq += 1

    def next_done(self):
        if not self.queue:
            return None
        return self.t + max(self.queue[0][0] - self.v, 0.0) * len(self.queue) / self.bw

    def done(self, now):
        """The transfers done by `now`, which is next_done()'s time: the
        front one always (rounding may leave it a hair short, and waiting
        for that hair would schedule the same instant forever)."""
        self.advance(now)
        out = []
        if self.queue:
            finish, _, who = heapq.heappop(self.queue)
            self.v = max(self.v, finish)
            out.append(who)
        while self.queue and self.queue[0][0] <= self.v * (1 + 1e-12) + 1e-6:
            out.append(heapq.heappop(self.queue)[2])
        return out


PIPES = {"fifo": FifoPipe, "shared": SharedPipe}


def simulate(tiles, grid, fig, sm_time=True, bank=True):
    """Kernel time (s) of one launch: tile t to CTA t % grid, CTA c on SM c %
    SMs; each CTA runs cta_program with fig["stages"] tile buffers (1, the
    kernels today: it stages a tile, waits, stores it, then goes on).

    Memory: one pipe of `bw`, fig["memory"] says how it serves (PIPES:
    "shared", every transfer in it at an equal share, or "fifo", one at a
    time); a tile's loads are servable `latency` after its stage loop starts
    and land no earlier than `latency` after it ends; its stores are
    servable from its store loop's start (nobody waits for them). SM: the
    CTAs issuing on one SM share its cycles equally (processor sharing), at
    `clock`, none faster than its warps allow (issue_cap over the issuing
    part of its loop: the rest waits on the shared-memory path, which the
    warps' limit does not slow), what a capped CTA leaves going to the
    others."""
    bw, latency, clock, sms = fig["bw"], fig["latency"], fig["clock"], fig["sms"]
    cap = issue_cap(fig)

    work = [[] for _ in range(grid)]
    for t, tile in enumerate(tiles):
        work[t % grid].append(tile)
    n = len(work)
    issuing_part = [1.0] * n  # of each CTA's current loop's cycles, the part that is issuing
    prog = [cta_program(len(w), fig.get("stages", 1), [t.inline for t in w]) for w in work]
    pc = [0] * n             # the op each CTA is at
    left = [0.0] * n         # SM cycles left in the current issue op
    served = [{} for _ in range(n)]     # tile -> when the pipe finished its loads
    stage_end = [{} for _ in range(n)]  # tile -> when its stage loop ended
    landed = [{} for _ in range(n)]     # tile -> when its loads landed
    sm_of = [c % sms for c in range(n)]
    sm_ctas = [[] for _ in range(sms)]  # SM -> CTAs issuing on it
    sm_clock = [0.0] * sms   # SM -> time their `left` was last brought up to date
    version = [0] * sms
    events, seq = [], 0
    pipe, pipe_version, end = PIPES[fig.get("memory", "fifo")](bw), 0, 0.0
    pipe_at = None  # when the pipe's live event is

    def push(at, kind, who, tag=0):
        nonlocal seq
        heapq.heappush(events, (at, seq, kind, who, tag))
        seq += 1

    def cycles_of(tile, which):
        if not sm_time:
            return 0.0
        return tile.stage if which == "stage" else tile.store - (0.0 if bank else tile.bank)

    def rates(ctas):
        """SM cycles a second each of the SM's issuing CTAs gets: an equal
        share, none more than its warps allow, what a capped one leaves
        shared by the others (water-filling)."""
        most = {c: cap / issuing_part[c] if issuing_part[c] > 0 else math.inf for c in ctas}
        out, share = {}, 1.0
        for i, c in enumerate(sorted(ctas, key=most.__getitem__)):
            out[c] = min(most[c], share / (len(ctas) - i))
            share -= out[c]
        return {c: clock * v for c, v in out.items()}

    def advance(sm, now):
        """Bring the SM's issuing CTAs' cycles left up to `now` (they share
        its clock equally, or by rates() under a warps' limit)."""
        ctas = sm_ctas[sm]
        if ctas and cap == math.inf:
            spent = clock / len(ctas) * (now - sm_clock[sm])
            for c in ctas:
                left[c] -= spent
        elif ctas:
            for c, r in rates(ctas).items():
                left[c] -= r * (now - sm_clock[sm])
        sm_clock[sm] = now

    def schedule(sm, now):
        """After a change of the SM's issuing CTAs: schedule the first of
        them to finish at the new shares (one event an SM: the others' ends
        move with every change of the share, and the version retires the
        event an earlier share scheduled)."""
        ctas = sm_ctas[sm]
        version[sm] += 1
        if ctas and cap == math.inf:
            first = min(ctas, key=left.__getitem__)
            push(now + max(left[first], 0.0) / (clock / len(ctas)), "issued", first, version[sm])
        elif ctas:
            r = rates(ctas)
            first = min(ctas, key=lambda c: left[c] / r[c])
            push(now + max(left[first], 0.0) / r[first], "issued", first, version[sm])

    def maybe_land(c, k):
        if k in served[c] and k in stage_end[c]:
            push(max(served[c][k], stage_end[c][k] + latency), "landed", c, k)

    def run(c, now):
        """CTA c starts its next op (a wait that has landed passes at once)."""
        while pc[c] < len(prog[c]):
            op, k = prog[c][pc[c]]
            if op == "wait":
                if k not in landed[c]:
                    return  # the landed event resumes it
                pc[c] += 1
                continue
            if op == "stage":
                push(now + latency, "servable", c, k)
            else:
                # The store loop's stores reach the pipe as it issues them: they
                # are servable from its start (as a tile's loads are from its
                # stage loop's start); nobody waits for them.
                push(now, "servable", -1, -work[c][k].bytes)
            sm = sm_of[c]
            advance(sm, now)
            left[c] = cycles_of(work[c][k], op)
            issuing_part[c] = warp_issuing(work[c][k], op, bank) / left[c] if left[c] > 0 else 1.0
            sm_ctas[sm].append(c)
            schedule(sm, now)
            return

    for c in range(n):
        run(c, 0.0)
    while events:
        now, _, kind, c, tag = heapq.heappop(events)
        if kind == "servable":  # a tile's loads (c >= 0, tile tag) or stores (c < 0: -bytes) reach the pipe
            pipe.arrive(now, work[c][tag].bytes if c >= 0 else -tag, (c, tag) if c >= 0 else None)
            if pipe.next_done() != pipe_at:  # (a fifo pipe's next stays put behind its front)
                pipe_version += 1
                pipe_at = pipe.next_done()
                push(pipe_at, "pipe", -1, pipe_version)
        elif kind == "pipe":  # transfers done; a later arrival may have moved the next one
            if tag != pipe_version:
                continue
            for who in pipe.done(now):
                end = max(end, now)
                if who is not None:
                    served[who[0]][who[1]] = now
                    maybe_land(*who)
            pipe_at = pipe.next_done()
            if pipe_at is not None:
                pipe_version += 1
                push(pipe_at, "pipe", -1, pipe_version)
        elif kind == "issued":
            sm = sm_of[c]
            if tag != version[sm]:
                continue  # superseded by a later share
            advance(sm, now)
            sm_ctas[sm].remove(c)
            schedule(sm, now)
            op, k = prog[c][pc[c]]
            if op == "stage":
                stage_end[c][k] = now
                maybe_land(c, k)
            else:  # stores issued (they reached the pipe as the loop began)
                end = max(end, now)
            pc[c] += 1
            run(c, now)
        elif kind == "landed":
            landed[c][tag] = now
            if pc[c] < len(prog[c]) and prog[c][pc[c]] == ("wait", tag):
                pc[c] += 1
                run(c, now)
    return end


def issue_bound(tiles, grid, fig, bank=True):
    """Time (s) the busiest SM needs to issue its tiles, with nothing else in
    the way: what issuing costs were it fully overlapped with memory (at the
    rate its CTAs' warps allow, where that is below the SM's)."""
    per_sm, issuing_sm, ctas = [0.0] * fig["sms"], [0.0] * fig["sms"], [0] * fig["sms"]
    for t, tile in enumerate(tiles):
        sm = (t % grid) % fig["sms"]
        per_sm[sm] += tile.stage + tile.store - (0.0 if bank else tile.bank)
        issuing_sm[sm] += warp_issuing(tile, "stage") + warp_issuing(tile, "store", bank)
    for c in range(min(grid, len(tiles))):
        ctas[c % fig["sms"]] += 1
    cap = issue_cap(fig)
    return max((max(total, issue / (n * cap)) for total, issue, n in zip(per_sm, issuing_sm, ctas) if n),
               default=0.0) / fig["clock"]


def launch_components(launch, case, loops, fig):
    """One launch's time (s) by cause; the causes sum to the simulated time."""
    fig = launch_fig(launch, fig)
    grid = launch["grid"]
    tiles = launch_tiles(launch, case, loops, fig)
    even = balanced(tiles, grid)
    nbytes = sum(t.bytes for t in tiles)
    dram = 2 * nbytes / fig["bw"]
    memory_only = simulate(even, grid, fig, sm_time=False)
    overlapped = max(memory_only, issue_bound(even, grid, fig, bank=False) + fig["latency"])
    one_stage = simulate(even, grid, fig, bank=False)
    with_bank = simulate(even, grid, fig)
    actual = simulate(tiles, grid, fig)
    return {"latency": fig["latency"], "dram": dram, "idle": memory_only - dram - fig["latency"],
            "issue": overlapped - memory_only, "serialisation": one_stage - overlapped,
            "bank": with_bank - one_stage, "tail": actual - with_bank}


def figures(args):
    return {"bw": args.copy_tbps * 1e12, "latency": args.latency_us * 1e-6,
            "copy_latency": args.copy_latency_us * 1e-6, "clock": args.clock_ghz * 1e9,
            "sms": args.sms, "schedulers": args.schedulers, "ipc": args.ipc,
            "tile_cycles": (args.tile_instructions / (args.schedulers * args.ipc) if args.tile_instructions
                            else args.tile_cycles),
            "launch": args.launch_us * 1e-6, "smem_wavefront_bytes": H200["smem_wavefront_bytes"],
            "memory": args.memory, "warp_cpi": args.warp_cpi}


def with_stages(launch, args):
    """A launch of one stage given `args.stages` buffers of its tile a CTA (a
    what-if): as many CTAs a SM as the shared memory then holds (never more
    than planned). Launches the executor already plans with two (direct
    gathered tiles: launch.cpp set_two_stages) keep theirs."""
    if args.stages == 1 or launch.get("stages", 1) > 1 or not launch["smem_bytes"]:
        return launch
    per_cta = args.stages * launch["smem_bytes"] + args.smem_reserved_per_cta
    ctas = max(1, min(launch["ctas_per_sm"], args.smem_per_sm_kib * KiB // per_cta))
    return {**launch, "stages": args.stages, "ctas_per_sm": ctas, "grid": min(launch["tiles"], args.sms * ctas)}


def launch_fig(launch, fig):
    """The figures one launch simulates with: its tile buffers and warps a CTA."""
    return {**fig, "stages": launch.get("stages", 1), "warps": launch.get("threads", 128) // 32}


def issue_cap(fig):
    """The most of its SM's issue rate one CTA can use: its warps, each
    issuing once every warp_cpi cycles at best, over the SM's schedulers x
    ipc a clock (inf with no warp_cpi: a CTA alone can use the whole SM)."""
    if not fig.get("warp_cpi"):
        return math.inf
    return fig.get("warps", 4) / fig["warp_cpi"] / (fig["schedulers"] * fig["ipc"])


# --------------------------------------------------------------------------- inputs: registers, launches

def kernel_registers(args):
    """Registers per thread of each kernel, and where they came from."""
    regs, source = dict(DEFAULT_REGS), "today's sm_90 figures (no --ptxas-log)"
    if args.ptxas_log:
        from ptxas_gate import parse  # scripts/ptxas_gate.py: the one reader of ptxas logs

        with open(args.ptxas_log, errors="replace") as f:
            kernels = [k for k in parse(f.read()) if k["arch"] == args.arch and "registers" in k]
        found = {}
        for name in regs:
            counts = [k["registers"] for k in kernels if f"flashmla_perm_{name}" in k["kernel"]]
            if counts:
                found[name] = max(counts)  # several builds of one kernel: the worst
        if not found:
            sys.exit(f"gpu_model: no ptxas figures for {args.arch} flashmla_perm kernels in {args.ptxas_log}")
        missing = sorted(set(regs) - set(found))
        regs.update(found)
        source = f"{args.ptxas_log} ({args.arch})" + (f"; defaults for {', '.join(missing)}" if missing else "")
    for name in regs:
        override = getattr(args, f"regs_{name}")
        if override is not None:
            regs[name] = override
            source += f"; --regs-{name.replace('_', '-')}"
    return regs, source


def device_dict(args, regs_per_thread):
    """DeviceSpec fields (csrc/launch.h) for gpu_launches. Stages left
    unset (None) keep DeviceSpec's defaults, the executor's: one place says
    what the default plan is."""
    stages = {k: v for k, v in (("col_stages", args.col_stages), ("row_stages", args.row_stages)) if v is not None}
    return {"sm_count": args.sms, "smem_per_sm": args.smem_per_sm_kib * KiB,
            "smem_reserved_per_cta": args.smem_reserved_per_cta, "threads_per_sm": args.threads_per_sm,
            "regs_per_sm": args.regs_per_sm, "max_ctas_per_sm": args.max_ctas or args.max_ctas_per_sm,
            "regs_per_thread": regs_per_thread, **stages, "tile_budget": args.tile_budget}


# --------------------------------------------------------------------------- one case

def copy_time(kernels, nbytes, fig):
    """A device copy of nbytes in `kernels` kernels: each a launch and a
    latency, then every byte read and written at the copy's bandwidth."""
    return kernels * (fig["launch"] + fig.get("copy_latency", fig["latency"])) + 2 * nbytes / fig["bw"]


def model_case(case, launches, fig, loops, target):
    """The record of one op and TP from its launches."""
    parts = [launch_components(l, case, loops, fig) for l in launches if l["tiles"]]
    comp = {k: sum(p[k] for p in parts) for k in parts[0]} if parts else {}
    comp = {"launch": len(launches) * fig["launch"], **comp}
    predicted = sum(comp.values())
    # The copy moves the bytes the permutation moves (fixed points stay: 2046 of
    # 2048 blocks of wq_b at TP1) in one kernel, as the op's main launch does;
    # a save launch's scratch copies are the kernel's extra work.
    moved = sum(j["bytes"] for l in launches if l["kernel"] != "save_heads" for j in l["jobs"])
    copy = copy_time(1, moved, fig)
    main = max(launches, key=lambda l: sum(j["bytes"] for j in l["jobs"]))
    fraction = copy / predicted
    return {
        "op": case.op, "tp": case.tp, "kernel": main["kernel"], "launches": len(launches),
        "ctas": main["grid"], "ctas_per_sm": main["ctas_per_sm"], "tiles": main["tiles"],
        "waves": main["tiles"] / (fig["sms"] * main["ctas_per_sm"]),
        "in_flight_bytes_per_sm": main["ctas_per_sm"] * max(j["inflight_bytes"] for j in main["jobs"]),
        "bytes": moved, "copy_us": copy * 1e6, "predicted_us": predicted * 1e6,
        "predicted_fraction": fraction, "fraction_excl_launch": (copy - fig["launch"]) / (predicted - comp["launch"]),
        "copy_per_tensor_us": copy_time(case.tensors, moved, fig) * 1e6,
        "components": {k: v * 1e6 for k, v in comp.items()},
        "target": target, "meets_target": fraction >= target,
        "launch_details": launches,
    }


def model_cases(args, fig, loops, regs, C, only=None):
    records = []
    for case in cases(only or (args.ops.split(",") if args.ops else None)):
        launches = C.gpu_launches(case.op.replace("_h128", ""), case.dims, device_dict(args, regs[case.kernel]))
        launches = [with_stages(l, args) for l in launches]
        records.append(model_case(case, launches, fig, loops, args.target))
    return records


# --------------------------------------------------------------------------- output

COMPONENTS = ("launch", "latency", "dram", "idle", "issue", "serialisation", "bank", "tail")


def print_table(args, records, sources):
    fig = figures(args)
    need = fig["bw"] / 2 * fig["latency"]  # Little's law: reads in flight for full bandwidth
    print(f"device: {args.card_name}, {args.sms} SMs at {args.clock_ghz} GHz, {args.schedulers} schedulers x "
          f"{args.ipc} instr/clk, "
          f"{args.smem_per_sm_kib} KiB shared memory; copy {args.copy_tbps:.4g} TB/s (read + write; HBM peak "
          f"{args.hbm_tbps}), latency {args.latency_us} us, launch {args.launch_us} us, {fig['tile_cycles']:.4g} "
          f"cycles a tile" + (f" ({args.tile_instructions:g} instructions)" if args.tile_instructions else "")
          + (f", a warp {args.warp_cpi:g} cycles an instruction at best" if args.warp_cpi else "")
          + f" [{args.figures}: {FIGURE_SETS[args.figures]}; flags override]")
    for name, src in sources.items():
        print(f"{name}: {src}")
    print(f"loads in flight for full bandwidth (bandwidth/2 x latency): {need / MiB:.2f} MiB, "
          f"{need / args.sms / KiB:.1f} KiB per SM; target {args.target:.2f} of the copy")
    head = (f"{'op':14} {'TP':>2} {'kernel':6} {'CTA/SM':>6} {'tiles':>6} {'MiB':>7} {'copy us':>8} {'pred us':>8} "
            f"{'fraction':>8}  " + " ".join(f"{c[:6]:>6}" for c in COMPONENTS) + "  target")
    print(head)
    print("-" * len(head))
    for r in records:
        comp = " ".join(f"{r['components'][c]:6.2f}" for c in COMPONENTS)
        print(f"{r['op']:14} {r['tp']:2} {r['kernel']:6} {r['ctas_per_sm']:6} {r['tiles']:6} "
              f"{r['bytes'] / MiB:7.2f} {r['copy_us']:8.2f} {r['predicted_us']:8.2f} "
              f"{r['predicted_fraction']:8.3f}  {comp}  {'PASS' if r['meets_target'] else 'BELOW'}")
    print("fraction: copy time / predicted time, launches included on both sides; components in us, summing to "
          "the prediction (see the module docstring)")


def print_loops(loops, totals):
    print("instructions per item (V-byte vector) by loop [kernel, phase, V, shared-memory piece]:")
    for key in LOOPS:
        if key in loops:
            n, divs = loops[key][:2]
            line = (f", {loops[key][2]:.0f} a warp's line, {loops[key][3]:.0f} a lane's trip"
                    if len(loops[key]) > 2 else "")
            print(f"  {key[0]:12} {key[1]:5} V={key[2]:<2} piece={key[3]:<2} {n:7.1f} instructions, "
                  f"{divs:.1f} divisions{line}")
    if totals:
        print("  kernels: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())) + " instructions")


# --------------------------------------------------------------------------- measured: compare and fit

def measured_rows(path):
    """Device rows (kind, tp, backend -> device ms a layer, x copy) from a
    gpu_check.json (its bench step's figures, or bench.json beside it) or a
    bench_load_time.py --json document."""
    with open(path) as f:
        doc = json.load(f)
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if rows is None and isinstance(doc, dict):
        beside = os.path.join(os.path.dirname(path), "bench.json")
        bench = next((s for s in doc.get("steps", []) if s.get("name") == "bench"), {})
        figs = bench.get("figures") or {}
        rows = []
        for key, v in figs.items():
            m = re.fullmatch(r"(\S+) (\S+) tp(\d+) (\S+)", key)
            if m and isinstance(v, dict):
                rows.append({"device": m.group(1), "kind": m.group(2), "tp": int(m.group(3)),
                             "backend": m.group(4), **v})
        if not rows and os.path.exists(beside):
            return measured_rows(beside)
    out = {}
    for r in rows or []:
        if str(r.get("device", "")).startswith("cuda"):
            out[(r["kind"], int(r["tp"]), r["backend"])] = r
    return out


def fit_copy(records, rows):
    """Latency and bandwidth from the measured copies, by least squares:
    copy = tensors x (launch + latency) + 2N / bw is linear in (launch +
    latency, 1 / bw). Returns (fixed cost per copy kernel, bw) or None."""
    xs, ys = [], []
    for r in records:
        m = rows.get((r["op"], r["tp"], "copy"))
        if m:
            tensors = 1 if r["op"].startswith("permute_q") else 2
            xs.append((tensors, 2 * r["bytes"]))
            ys.append(m["device_ms_per_layer"] * 1e-3)
    if len(xs) < 2:
        return None
    # Normal equations of the 2-parameter fit.
    a11 = sum(x[0] * x[0] for x in xs)
    a12 = sum(x[0] * x[1] for x in xs)
    a22 = sum(x[1] * x[1] for x in xs)
    b1 = sum(x[0] * y for x, y in zip(xs, ys))
    b2 = sum(x[1] * y for x, y in zip(xs, ys))
    det = a11 * a22 - a12 * a12
    if det <= 0:
        return None
    fixed, inv_bw = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
    return (fixed, 1 / inv_bw) if inv_bw > 0 else None


# The benchmark's baselines beside the copy (bench_load_time.py): torch's
# elementwise kernel streaming the weights in place, and into a buffer; the
# copy into one buffer every layer reuses (the first device run's copy).
BASELINES = ("inplace", "outofplace", "copy_1buf")


def line_fit(xs, ys):
    """y = a + b x by least squares: (a, b, the largest residual); None
    where the xs do not spread (sums about their means, so that equal large
    xs cannot round into a fit)."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12 * mx * mx:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    return a, b, max(abs(a + b * x - y) for x, y in zip(xs, ys))


def scaling_across_tp(records, rows):
    """Without the model: per op, each backend's measured device times
    across TPs as a fixed cost plus the bytes moved (read + write) over a
    bandwidth, and the smallest TP's gap to the copy split into the two: a
    kernel short of bandwidth falls further behind as the bytes grow, a
    fixed cost (launch, first round trip, tail) does not. Ops with fewer
    than three TPs are left out."""
    out = []
    for op in sorted({r["op"] for r in records}):
        fits = {}
        for backend in ("copy", "native", *BASELINES):
            pts = [(2 * r["bytes"], rows[(op, r["tp"], backend)]["device_ms_per_layer"] * 1e-3)
                   for r in records if r["op"] == op and (op, r["tp"], backend) in rows]
            fit = line_fit([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= 3 else None
            if fit and fit[1] > 0:
                fits[backend] = {"fixed_us": fit[0] * 1e6, "tbps": 1e-12 / fit[1], "worst_residual_us": fit[2] * 1e6,
                                 "points": len(pts)}
        if "copy" not in fits or "native" not in fits:
            continue
        c, n = fits["copy"], fits["native"]
        first = min((r for r in records if r["op"] == op), key=lambda r: r["tp"])
        smallest_tp, moved = first["tp"], 2 * first["bytes"]
        from_bandwidth = moved * (1 / n["tbps"] - 1 / c["tbps"]) * 1e-6  # bytes / (TB/s) -> us
        out.append({"op": op, "tp": smallest_tp, "copy": c, "native": n,
                    "bandwidth_ratio": n["tbps"] / c["tbps"], "gap_from_fixed_us": n["fixed_us"] - c["fixed_us"],
                    "gap_from_bandwidth_us": from_bandwidth,
                    **{b: {**fits[b], "bandwidth_ratio": fits[b]["tbps"] / c["tbps"]} for b in BASELINES if b in fits}})
    return out


def print_scaling(scaling):
    if not scaling:
        return
    print("across TPs, without the model (time = fixed + bytes moved / bandwidth, least squares a backend):")
    print(f"{'op':14} {'copy us':>8} {'TB/s':>6} {'native us':>9} {'TB/s':>6} {'bw ratio':>8} "
          f"{'TP':>3} {'gap: fixed':>10} {'bandwidth':>9} {'worst resid':>11}")
    for s in scaling:
        c, n = s["copy"], s["native"]
        print(f"{s['op']:14} {c['fixed_us']:8.2f} {c['tbps']:6.2f} {n['fixed_us']:9.2f} {n['tbps']:6.2f} "
              f"{s['bandwidth_ratio']:8.3f} {s['tp']:3} {s['gap_from_fixed_us']:10.2f} "
              f"{s['gap_from_bandwidth_us']:9.2f} {max(c['worst_residual_us'], n['worst_residual_us']):11.2f}")
        for b in BASELINES:
            if b in s:
                print(f"{'':14} {b}: fixed {s[b]['fixed_us']:.2f} us, {s[b]['tbps']:.2f} TB/s "
                      f"({s[b]['bandwidth_ratio']:.3f} of the copy's bandwidth)")
    print("(gap: the smallest TP's native time over the copy's, us, from the fixed costs and from the bandwidths)")


def predicted_time(case, launches, fig, loops):
    """The prediction alone (s): the launches and the real schedule, no
    counterfactual runs (what a fit evaluates many times)."""
    return len(launches) * fig["launch"] + sum(
        simulate(launch_tiles(l, case, loops, fig), l["grid"], launch_fig(l, fig)) for l in launches if l["tiles"])


def nelder_mead(err, x0, step=0.5, evals=120, tol=1e-4):
    """A minimum of err near x0 (a list of floats): the Nelder-Mead simplex,
    for a few smooth parameters with no derivatives."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [err(x) for x in simplex]
    used = n + 1
    while used < evals:
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol * (abs(values[0]) + tol):
            break
        centre = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        toward = lambda t: [c + t * (w - c) for c, w in zip(centre, simplex[-1])]  # noqa: E731
        reflected = toward(-1.0)
        fr = err(reflected)
        used += 1
        if fr < values[0]:
            expanded = toward(-2.0)
            fe = err(expanded)
            used += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = toward(0.5)
            fc = err(contracted)
            used += 1
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink toward the best
                for i in range(1, n + 1):
                    simplex[i] = [b + 0.5 * (x - b) for b, x in zip(simplex[0], simplex[i])]
                    values[i] = err(simplex[i])
                used += n
    return simplex[min(range(n + 1), key=values.__getitem__)]


# Where a fit of (log latency in us, log issue rate) starts: the current
# figures and this coarse grid. Two-stage tiles hide part of a tile's
# latency behind the tile before it, and past some issue rate issuing costs
# nothing: the error has plateaus and a narrow valley, on which a simplex
# from one start stalls (from the defaults, fits of the model's own output
# at latency 1.4 us and issue rates 0.3 and 0.45, two-stage rows, ended
# near 2.9 and 1.8 us, issue rates 1.5 and 3.3).
FIT_GRID = tuple((math.log(0.5) + i * math.log(2) / 2, math.log(0.25) + j * math.log(2) / 2)
                 for i in range(9) for j in range(7))  # 0.5-8 us by sqrt(2), issue rates 0.25-2
# The same for log warp_cpi: 4-64 cycles by sqrt(2).
WARP_FIT_GRID = tuple((math.log(4) + i * math.log(2) / 2,) for i in range(9))

# A tile's instructions beyond its item loops, all its warps': 400 SM cycles
# at the first run's fitted 0.753 a scheduler, 1205. (That run's ncu counted
# 1242 a wq_b tile and 617 a wo_a tile beyond the item loops' counted paths:
# 134 and 84 warp instructions an item against 106.5 and 71.9.)
TILE_INSTRUCTIONS = H200["tile_cycles"] * H200["schedulers"] * H200_MEASURED["ipc"]
WARP_CPI_START = 16.0  # where a warp_issue fit starts with no warp_cpi given (20 warps a SM at 1.29 a clock: 15.5)

# What a fit may explain the native times by: the figures it fits, the grid
# it starts from, and the figures it holds (a number, or one of args').
# round_trip: a tile's loads take latency_us to land, and the SM issues at
#   ipc (the fit the first device run's rows gave: 4.55 us, 0.753).
# warp_issue: a tile's loads land after the copy's latency, and each warp
#   issues once every warp_cpi cycles at best (its dependent chain of index
#   loads, FastDivs and addresses), so that time grows as CTAs a SM fall but
#   not as tiles shrink; the SM's schedulers could issue one a clock each
#   (ipc 1, the hardware's most), and a tile costs TILE_INSTRUCTIONS. (ipc
#   is held, not fitted: where the warps' limit binds the SM's rate plays
#   no part, and a fit of it once ran past 1, which no scheduler issues.)
# The sweep's plans tell the two apart: tile16k and tile8k cost round_trip a
# round trip a tile, ctas1 and ctas2 cost warp_issue their missing warps.
EXPLANATIONS = {
    "round_trip": {"fit": ("latency_us", "ipc"), "grid": FIT_GRID,
                   "hold": {"warp_cpi": 0.0, "tile_instructions": 0.0}},
    "warp_issue": {"fit": ("warp_cpi",), "grid": WARP_FIT_GRID,
                   "hold": {"latency_us": "copy_latency_us", "ipc": 1.0, "tile_instructions": TILE_INSTRUCTIONS}},
}


def grid_started_fit(err, x0, evals, grid=FIT_GRID):
    """nelder_mead from the best of x0 and the grid, within `evals`
    evaluations in all (from x0 alone where they would leave the simplex
    under 30: the plumbing checks' few)."""
    if evals < len(grid) + 31:
        return nelder_mead(err, x0, evals=evals)
    starts = [list(x0)] + [list(g) for g in grid]
    return nelder_mead(err, min(starts, key=err), step=0.25, evals=evals - len(starts))


def point_predictions(args, loops, regs, C, points):
    """Predicted seconds a layer for each point (label, plan, op, measured
    seconds, TP), each under its plan (PLAN_ENV's arguments)."""
    saved = {a: getattr(args, a) for a in PLAN_ENV.values()}
    out = []
    try:
        for _, plan, op, _, tp in points:
            for a in PLAN_ENV.values():
                setattr(args, a, plan[a])
            case = next(c for c in cases([op]) if c.tp == tp)
            launches = C.gpu_launches(op.replace("_h128", ""), case.dims, device_dict(args, regs[case.kernel]))
            out.append(predicted_time(case, launches, figures(args), loops))
    finally:
        for a, v in saved.items():
            setattr(args, a, v)
    return out


_FIT_STATE = {}  # what forked workers of fit_points read: (args, loops, regs, C, points)


def _predict_point(i, values):
    args, loops, regs, C, points = _FIT_STATE["state"]
    for name, value in values.items():
        setattr(args, name, value)
    return point_predictions(args, loops, regs, C, [points[i]])[0]


def fit_points(args, loops, regs, C, points, explanation="round_trip"):
    """The figures an explanation fits (EXPLANATIONS; by default the tiles'
    load latency in us and the issue rate, instructions a scheduler issues a
    clock) that best explain the points' measured native times, fitted
    together (they trade against each other) on their logarithms, into args,
    its held figures set first. Returns each point's predicted seconds at
    the fitted figures. The points of one evaluation simulate in parallel (forked
    workers: the GPU machine has 16 cores, and a fit takes 160 evaluations)."""
    how = EXPLANATIONS[explanation]
    for name, value in how["hold"].items():
        setattr(args, name, getattr(args, value) if isinstance(value, str) else value)
    names = how["fit"]
    if not args.warp_cpi and "warp_cpi" in names:
        args.warp_cpi = WARP_CPI_START
    _FIT_STATE["state"] = (args, loops, regs, C, points)
    n = len(points)
    # Workers find _predict_point by its module's name, which a copy of this
    # file loaded by path (the tests') does not answer to: that one maps here.
    forked = getattr(sys.modules.get(__name__), "_predict_point", None) is _predict_point
    pool = concurrent.futures.ProcessPoolExecutor(min(n, os.cpu_count() or 1),
                                                  mp_context=multiprocessing.get_context("fork")) if forked else None
    try:
        def predict(x):
            values = dict(zip(names, map(math.exp, x)))
            return list((pool.map if pool else map)(_predict_point, range(n), [values] * n))

        x0 = [math.log(getattr(args, name)) for name in names]

        def err(x):
            return sum(math.log(p / m[3]) ** 2 for p, m in zip(predict(x), points))

        best = grid_started_fit(err, x0, args.fit_evals, how["grid"])
        for name, x in zip(names, best):
            setattr(args, name, math.exp(x))
        return predict(best)
    finally:
        if pool:
            pool.shutdown()


def compare_measured(args, loops, regs, C):
    """Predicted against measured per op and TP, then the fit: bandwidth and
    launch from the copies (least squares), the tiles' latency and the issue
    rate from the native rows (Nelder-Mead on their logarithms). Returns the
    fitted figures."""
    rows = measured_rows(args.measured)
    ops = sorted({k for k, _, _ in rows if k in {c.op for c in cases(args.ops.split(",") if args.ops else None)}})
    if not ops:
        print(f"gpu_model: no device rows of the model's ops in {args.measured}: nothing to compare")
        return {}, []
    fig = figures(args)
    records = model_cases(args, fig, loops, regs, C, ops)
    print(f"measured: {args.measured} (card: {args.card_name})")
    print(f"{'op':14} {'TP':>2} {'pred us':>8} {'meas us':>8} {'pred frac':>9} {'meas frac':>9}")
    for r in records:
        m = rows.get((r["op"], r["tp"], "native"))
        if m:
            print(f"{r['op']:14} {r['tp']:2} {r['predicted_us']:8.2f} {m['device_ms_per_layer'] * 1e3:8.2f} "
                  f"{r['copy_per_tensor_us'] / r['predicted_us']:9.3f} {1 / m['x_copy_device']:9.3f}")
    print("(fractions of the benchmark's copy: one copy kernel per tensor)")
    scaling = scaling_across_tp(records, rows)
    print_scaling(scaling)
    fitted = {}
    copy = fit_copy(records, rows)
    if copy:
        fixed, bw = copy
        args.copy_tbps = bw / 1e12
        args.launch_us = max(fixed * 1e6 - args.copy_latency_us, 0.0)
        fitted.update(copy_tbps=args.copy_tbps, launch_us=args.launch_us)
    plan = {a: getattr(args, a) for a in PLAN_ENV.values()}  # the run's: the arguments'
    points = [(None, plan, r["op"], rows[(r["op"], r["tp"], "native")]["device_ms_per_layer"] * 1e-3, r["tp"])
              for r in records if (r["op"], r["tp"], "native") in rows]
    how = EXPLANATIONS[args.explanation]
    if points:
        fit_points(args, loops, regs, C, points, args.explanation)
        fitted.update({name: getattr(args, name) for name in how["fit"]})
    held = {name: getattr(args, name) for name in how["hold"]}
    print("fit: " + ", ".join(f"{k} {v:.4g}" for k, v in fitted.items())
          + f" (the copies give bandwidth and launch + their latency, held at {args.copy_latency_us} us;"
          f" the native rows give {' and '.join(how['fit'])}, explained by {args.explanation}, which holds "
          + ", ".join(f"{k} {v:.4g}" for k, v in held.items()) + ")")
    after = model_cases(args, figures(args), loops, regs, C, ops)
    for r in after:
        m = rows.get((r["op"], r["tp"], "native"))
        if m:
            print(f"  fitted {r['op']:14} TP{r['tp']}: predicted {r['predicted_us']:8.2f} us, "
                  f"measured {m['device_ms_per_layer'] * 1e3:8.2f} us")
    return fitted, scaling


# --------------------------------------------------------------------------- the sweep: several plans, one fit

# The executor's environment (csrc/cuda_executor.cpp) as this model's arguments.
PLAN_ENV = {"FLASHMLA_PERM_MAX_CTAS_PER_SM": "max_ctas", "FLASHMLA_PERM_COL_STAGES": "col_stages",
            "FLASHMLA_PERM_ROW_STAGES": "row_stages", "FLASHMLA_PERM_TILE_BUDGET": "tile_budget"}
# The same environment as gpu_launches' fields (DeviceSpec's names, csrc/launch.h).
PLAN_FIELDS = {env: "max_ctas_per_sm" if arg == "max_ctas" else arg for env, arg in PLAN_ENV.items()}
# Each of those arguments unset: the default plan (the stages: DeviceSpec's).
PLAN_DEFAULTS = {"max_ctas": None, "col_stages": None, "row_stages": None, "tile_budget": 0}


def sweep_points(path):
    """(label, plan, op, measured native device seconds a layer, TP 1) from
    a device check's sweep.json (bench/gpu_check.py: each plan's environment
    and its TP1 rows); the plan: PLAN_ENV's arguments, its environment's
    over the defaults."""
    with open(path) as f:
        doc = json.load(f)
    points = []
    for label, plan in doc.items():
        args = {**PLAN_DEFAULTS, **{PLAN_ENV[k]: int(v) for k, v in plan.get("env", {}).items() if k in PLAN_ENV}}
        for key, row in plan.get("rows", {}).items():
            op, backend = key.split()
            if backend == "native" and row.get("device_ms_per_layer"):
                points.append((label, args, op, row["device_ms_per_layer"] * 1e-3, 1))
    return points


def compare_sweep(args, loops, regs, C):
    """Each plan of a sweep predicted against measured, then each
    explanation's figures (EXPLANATIONS) fitted across all of them at once:
    one set of figures must explain every plan, or the model is missing a
    cause; of the two, the one with the smaller error says which cause the
    plans point to. The record's "fitted" and "worst_ratio" are round_trip's."""
    points = [p for p in sweep_points(args.sweep) if p[2] in {c.op for c in cases()}]
    if not points:
        print(f"gpu_model: no native TP1 rows of the model's ops in {args.sweep}: nothing to compare")
        return {}
    given = {name: getattr(args, name) for name in ("latency_us", "ipc", "warp_cpi", "tile_instructions")}
    predicted = point_predictions(args, loops, regs, C, points)  # at the figures given
    fits = {}
    for explanation, how in EXPLANATIONS.items():
        for name, value in given.items():
            setattr(args, name, value)
        after = fit_points(args, loops, regs, C, points, explanation)
        errors = [math.log(a / p[3]) for a, p in zip(after, points)]
        fits[explanation] = {"fitted": {name: getattr(args, name) for name in how["fit"]},
                             "held": {name: getattr(args, name) for name in how["hold"]},
                             "worst_ratio": math.exp(max(map(abs, errors))),
                             "rms_log_error": math.sqrt(sum(e * e for e in errors) / len(errors)),
                             "after": after}
    first = fits["round_trip"]
    print(f"sweep: {args.sweep} (TP1; device us a layer)")
    print(f"{'plan':14} {'op':6} {'measured':>9} {'predicted':>9} {'round_trip':>10} {'warp_issue':>10}")
    records = []
    for i, (label, plan, op, measured, _) in enumerate(points):
        b, a, w = predicted[i], first["after"][i], fits["warp_issue"]["after"][i]
        print(f"{label:14} {op:6} {measured * 1e6:9.2f} {b * 1e6:9.2f} {a * 1e6:10.2f} {w * 1e6:10.2f}")
        overrides = {k: v for k, v in plan.items() if v != PLAN_DEFAULTS[k]}
        records.append({"plan": label, "overrides": overrides, "op": op, "measured_us": measured * 1e6,
                        "predicted_us": b * 1e6, "fitted_us": a * 1e6, "warp_issue_fitted_us": w * 1e6})
    for explanation, f in fits.items():
        figures_text = ", ".join(f"{k} {v:.4g}" for k, v in {**f["fitted"], **f["held"]}.items())
        print(f"one fit across the plans, {explanation}: {figures_text}; worst point off by "
              f"{f['worst_ratio'] - 1:.0%}, rms {f['rms_log_error']:.3f} (log)")
    better = min(fits, key=lambda e: fits[e]["rms_log_error"])
    print(f"the plans are explained better by {better}")
    return {"points": records, "fitted": first["fitted"], "worst_ratio": first["worst_ratio"], "better": better,
            "explanations": {e: {k: v for k, v in f.items() if k != "after"}
                             for e, f in fits.items()}}


# --------------------------------------------------------------------------- main

def main(argv=None):
    args = parse_args(argv)
    import flashmla_perm
    from flashmla_perm import _ops

    if not flashmla_perm.build_info()["native"] or not hasattr(_ops._C, "gpu_launches"):
        print(f"gpu_model: needs the native module (gpu_launches): {flashmla_perm.build_info()['native_error']}")
        return 2
    regs, reg_source = kernel_registers(args)
    loops, totals, loop_source = kernel_loops(args)
    if args.sweep:
        result = compare_sweep(args, loops, regs, _ops._C)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"sweep": args.sweep, "card": args.card_name, **result}, f, indent=2)
        return 0
    if args.measured:
        fitted, scaling = compare_measured(args, loops, regs, _ops._C)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"measured": args.measured, "card": args.card_name, "explanation": args.explanation,
                       "fitted": fitted, "scaling": scaling},
                          f, indent=2)
        return 0
    records = model_cases(args, figures(args), loops, regs, _ops._C)
    print_table(args, records, {"registers per thread": f"{regs} [{reg_source}]",
                                "instructions per item": loop_source})
    print_loops(loops, totals)
    if args.json:
        inputs = {k: v for k, v in vars(args).items() if k not in ("json", "check", "measured")}
        loop_list = [{"kernel": k[0], "phase": k[1], "vec": k[2], "piece": k[3], "instructions": v[0],
                      "divisions": v[1]} for k, v in loops.items()]
        with open(args.json, "w") as f:
            json.dump([{**r, "inputs": inputs, "registers": regs, "registers_source": reg_source,
                        "instructions_per_item": loop_list, "instructions_source": loop_source}
                       for r in records], f, indent=2)
    below = [r for r in records if not r["meets_target"]]
    if below:
        print(f"{len(below)} case(s) below the target {args.target}")
    return 1 if args.check and below else 0


if __name__ == "__main__":
    sys.exit(main())
