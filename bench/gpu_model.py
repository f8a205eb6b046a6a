#!/usr/bin/env python3
"""GPU performance model of the model ops' launches, without a GPU.

Takes the launches csrc/launch.cpp plans for each op (through
flashmla_perm._ops._C.gpu_launches: grid, CTAs per SM, tiles, bytes, loads in
flight per tile), the kernels' register use (a ptxas log, or today's figures)
and stated device figures (an H200 by default), and predicts each op's time
as a fraction of a device-to-device copy of the same bytes.

    python bench/gpu_model.py [--ptxas-log BUILD_LOG] [--json PATH] [--check]

The model (docs/PERFORMANCE.md, "GPU performance model"):

  * memory is one pipe of `--copy-tbps` (reads and writes both count) behind a
    round-trip latency of `--latency-us`: a load issued at time t can be
    served from t + latency on, in the order requests become servable
    (first come, first served, a tile at a time);
  * a device copy of N bytes takes latency + 2N / bandwidth;
  * a kernel's tiles go grid-stride to its CTAs (tile t to CTA t % grid); a
    CTA issues all its tile's loads at once (cp.async: the whole tile is in
    flight), and when the last of them lands it posts the tile's stores
    (servable at once, the CTA does not wait for them) and issues its next
    tile's loads. So consecutive tiles of different CTAs overlap: while one
    CTA's stores drain, others' loads are in flight (Little's law: the pipe
    stays busy once the loads in flight cover bandwidth x latency);
  * SM-side time (issuing, shared memory, barriers), L2 hits and DRAM page
    effects are not modelled; the host's launch overhead is kept apart.

Prints one row per op and case, with PASS or BELOW against the target
(`--target`, 0.9 of the copy's bandwidth); exits 0 regardless, unless
`--check` is given and some row is below it.
"""

import argparse
import heapq
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

KiB = 1024
MiB = 1 << 20

# DeepSeek-V4.1-Flash (DESIGN.md): 64 heads of 512, q_lora_rank 1280, o_lora_rank
# 1024 per group of 8 heads; Q activations: 4096 bf16 tokens.
HEADS, HEAD_DIM, Q_LORA_RANK, O_LORA_RANK, GROUP = 64, 512, 1280, 1024, 8
TOKENS, Q_ELEMENT_SIZE = 4096, 2
TPS = (1, 2, 4, 8)
Q_HEADS = (64, 128)

# Registers per thread today (sm_90, nvcc 13, 128 threads per CTA; ptxas -v).
DEFAULT_REGS = {"rows": 96, "save_heads": 76, "cols": 78}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = p.add_argument_group("device figures (H200 defaults; stated, not measured here)")
    d.add_argument("--sms", type=int, default=132, help="SMs")
    d.add_argument("--smem-per-sm-kib", type=int, default=228, help="shared memory per SM")
    d.add_argument("--smem-reserved-per-cta", type=int, default=1024, help="bytes the runtime keeps per CTA")
    d.add_argument("--regs-per-sm", type=int, default=64 * 1024)
    d.add_argument("--threads-per-sm", type=int, default=2048)
    d.add_argument("--max-ctas-per-sm", type=int, default=32)
    d.add_argument("--copy-tbps", type=float, default=4.3,
                   help="device-to-device copy bandwidth, read and write bytes both counted (TB/s)")
    d.add_argument("--latency-us", type=float, default=1.0, help="DRAM load latency under load (us)")
    d.add_argument("--launch-us", type=float, default=4.0, help="host overhead per launch (us), reported apart")
    r = p.add_argument_group("kernel registers per thread")
    r.add_argument("--ptxas-log", metavar="PATH", help="build log with ptxas -v output (default: today's figures)")
    r.add_argument("--arch", default="sm_90", help="architecture to read from the log")
    for k, v in DEFAULT_REGS.items():
        r.add_argument(f"--regs-{k.replace('_', '-')}", type=int, help=f"override ({k} kernel; today {v})")
    p.add_argument("--target", type=float, default=0.9, help="fraction of the copy the kernels aim for")
    p.add_argument("--json", metavar="PATH", help="write one record per op and case here")
    p.add_argument("--check", action="store_true", help="exit 1 if any case is below the target")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- inputs

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
    """DeviceSpec fields (csrc/launch.h) for gpu_launches."""
    return {"sm_count": args.sms, "smem_per_sm": args.smem_per_sm_kib * KiB,
            "smem_reserved_per_cta": args.smem_reserved_per_cta, "threads_per_sm": args.threads_per_sm,
            "regs_per_sm": args.regs_per_sm, "max_ctas_per_sm": args.max_ctas_per_sm,
            "regs_per_thread": regs_per_thread}


def cases():
    """(op, tp, heads, dims for gpu_launches, kernel whose registers size it, tensor bytes)."""
    for tp in TPS:
        rows = HEADS // tp * HEAD_DIM  # wq_b weight [rows, K] fp8 + scale [rows, K / 32] uint8
        yield ("wq_b", tp, HEADS // tp, [rows, Q_LORA_RANK, HEADS // tp], "rows",
               rows * (Q_LORA_RANK + Q_LORA_RANK // 32))
    for tp in TPS:
        rows = HEADS // GROUP // tp * O_LORA_RANK  # wo_a weight [rows, G * D] + scale [rows, G * D / 32]
        cols = GROUP * HEAD_DIM
        yield "wo_a", tp, None, [rows, cols, GROUP], "cols", rows * (cols + cols // 32)
    # FlashMLA's own layouts: DeepGEMM's packed MN-major int32 scales (one word
    # per 128 columns, gran 32), wq_b 2-D and wv 3-D [n_groups, out, G * D].
    for tp in TPS:
        rows = HEADS // tp * HEAD_DIM
        yield ("wq_b_packed", tp, HEADS // tp, [rows, Q_LORA_RANK, HEADS // tp, 32], "rows",
               rows * (Q_LORA_RANK + Q_LORA_RANK // 32))
    for tp in TPS:
        groups, cols = max(HEADS // GROUP // tp, 1), GROUP * HEAD_DIM
        yield ("wv_packed", tp, None, [groups, O_LORA_RANK, cols, GROUP], "cols",
               groups * O_LORA_RANK * (cols + cols // 32))
    for heads in Q_HEADS:  # Q activations [tokens, heads, head_dim] bf16, out of place
        yield "permute_q", None, heads, [TOKENS, heads, HEAD_DIM, Q_ELEMENT_SIZE], "cols", \
            TOKENS * heads * HEAD_DIM * Q_ELEMENT_SIZE


# --------------------------------------------------------------------------- the model

def cta_work(launch):
    """Per CTA, the loads it issues in sequence: one list of step bytes per CTA.

    Tile t of the launch belongs to job 0 while t < its tile count, then to
    job 1 (cuda_executor.cu), and goes to CTA t % grid (grid-stride). Every
    tile of a job is taken to move the job's mean tile bytes (bytes / tiles;
    the launch reports only that and the largest: exact for wo_a, permute_q
    and wq_b at TP 1 and 2, whose tiles are even; wq_b's cycles differ in
    length at TP 4 and 8). A tile whose bytes exceed what the job has in flight at
    once (inflight_bytes; the model ops stage whole tiles, so never there)
    runs as several steps, each a full latency."""
    grid = launch["grid"]
    work = [[] for _ in range(grid)]
    t = 0
    for job in launch["jobs"]:
        if job["tiles"] == 0:
            continue
        tile = job["bytes"] / job["tiles"]
        step = min(tile, job["inflight_bytes"])
        steps = [step] * int(tile // step) + ([tile % step] if tile % step else [])
        for _ in range(job["tiles"]):
            work[t % grid].extend(steps)
            t += 1
    return work


def simulate(launch, bw, latency, sms):
    """Kernel time (s): every resident CTA runs its steps; the memory pipe
    serves requests first come first served once they are servable.

    Loads of a step become servable `latency` after the CTA issues them;
    the step is done when the pipe has served its last byte. Then the CTA
    posts the step's stores (servable at once) and issues its next step.
    CTAs beyond the resident slots (sms x ctas_per_sm; launch.cpp never
    plans more) start when a resident one finishes.

    Returns the time the pipe stood idle (at least the first latency) plus
    the time it was busy (all bytes read and written at `bw`), summed apart
    so that a kernel that never leaves the pipe idle after the first latency
    comes out exactly as the copy, not a rounding error above it."""
    work = cta_work(launch)
    slots = sms * launch["ctas_per_sm"]
    waiting = [c for c in range(len(work)) if work[c]][::-1]  # CTAs not yet resident, next one last
    done = [0] * len(work)  # steps each CTA has finished
    heap, seq = [], 0  # requests: (servable at, order issued, CTA or -1 for stores, bytes)

    def push(at, cta, nbytes):
        nonlocal seq
        heapq.heappush(heap, (at, seq, cta, nbytes))
        seq += 1

    for _ in range(min(slots, len(waiting))):
        c = waiting.pop()
        push(latency, c, work[c][0])
    pipe = idle = 0.0  # the pipe is busy until `pipe`; it stood idle for `idle`
    while heap:
        servable, _, cta, nbytes = heapq.heappop(heap)
        idle += max(0.0, servable - pipe)
        pipe = max(pipe, servable) + nbytes / bw
        if cta < 0:
            continue  # stores: nobody waits on them
        push(pipe, -1, nbytes)  # this step's stores, posted as its loads land
        done[cta] += 1
        if done[cta] < len(work[cta]):
            push(pipe + latency, cta, work[cta][done[cta]])
        elif waiting:  # this CTA exits: the next one takes its slot
            c = waiting.pop()
            push(pipe + latency, c, work[c][0])
    return idle + 2 * sum(j["bytes"] for j in launch["jobs"]) / bw


def lockstep_time(launch, bw, latency):
    """Bound without overlap: CTAs in lock-step rounds (round r = the r-th
    step of every CTA that has one), each round one latency plus its reads
    and writes at the copy's bandwidth. What the kernel would take if no
    CTA ever loaded while another stored."""
    work = cta_work(launch)
    rounds = max((len(w) for w in work), default=0)
    return sum(latency + 2 * sum(w[r] for w in work if r < len(w)) / bw for r in range(rounds))


def model_case(args, op, tp, heads, dims, kernel, tensor_bytes, regs, C):
    bw = args.copy_tbps * 1e12
    latency = args.latency_us * 1e-6
    launches = C.gpu_launches(op, dims, device_dict(args, regs[kernel]))
    kernel_s = sum(simulate(l, bw, latency, args.sms) for l in launches if l["tiles"])
    lockstep_s = sum(lockstep_time(l, bw, latency) for l in launches if l["tiles"])
    # The copy moves the bytes the permutation moves (fixed points stay: 2046 of
    # 2048 blocks of wq_b at TP1); a save launch's scratch copies are extra work.
    moved = sum(j["bytes"] for l in launches if l["kernel"] != "save_heads" for j in l["jobs"])
    copy_s = latency + 2 * moved / bw
    main = max(launches, key=lambda l: sum(j["bytes"] for j in l["jobs"]))
    first = [w[0] for w in cta_work(main) if w]  # what every resident CTA has in flight at the start
    launch_s = len(launches) * args.launch_us * 1e-6
    fraction = copy_s / kernel_s
    return {
        "op": op, "tp": tp, **({"heads": heads} if op == "permute_q" else {}),
        "kernel": main["kernel"], "regs_per_thread": regs[kernel],
        "launches": len(launches), "ctas": main["grid"], "ctas_per_sm": main["ctas_per_sm"],
        "tiles": main["tiles"], "waves": main["tiles"] / (args.sms * main["ctas_per_sm"]),
        "smem_bytes": main["smem_bytes"],
        "in_flight_bytes_per_sm": sum(first) / args.sms,
        "bytes": moved, "tensor_bytes": tensor_bytes,
        "copy_us": copy_s * 1e6, "predicted_us": kernel_s * 1e6, "lockstep_us": lockstep_s * 1e6,
        "predicted_fraction": fraction, "lockstep_fraction": copy_s / lockstep_s,
        "launch_us": launch_s * 1e6, "fraction_incl_launch": copy_s / (kernel_s + launch_s),
        "target": args.target, "meets_target": fraction >= args.target,
        "launch_details": launches,
    }


# --------------------------------------------------------------------------- output

def print_table(args, regs, source, records):
    bw = args.copy_tbps * 1e12
    need = bw / 2 * args.latency_us * 1e-6  # Little's law: reads in flight for full bandwidth
    print(f"device: {args.sms} SMs, {args.smem_per_sm_kib} KiB shared memory, {args.regs_per_sm // 1024} K registers, "
          f"{args.threads_per_sm} threads, {args.max_ctas_per_sm} CTAs per SM; copy {args.copy_tbps} TB/s "
          f"(read + write), load latency {args.latency_us} us, launch {args.launch_us} us (apart)")
    print(f"registers per thread: {', '.join(f'{k} {v}' for k, v in regs.items())} [{source}]")
    print(f"loads in flight for full bandwidth (bandwidth/2 x latency): {need / MiB:.2f} MiB, "
          f"{need / args.sms / KiB:.1f} KiB per SM; target {args.target:.2f} of the copy")
    head = (f"{'op':11} {'case':7} {'kernel':6} {'regs':>4} {'launch':>6} {'CTAs':>5} {'CTA/SM':>6} {'tiles':>6} "
            f"{'waves':>5} {'KiB/SM':>7} {'MiB':>7} {'copy us':>8} {'kern us':>8} {'fraction':>8} "
            f"{'lockstep':>8} {'w/launch':>8}  target")
    print(head)
    print("-" * len(head))
    for r in records:
        case = f"TP{r['tp']}" if r["tp"] is not None else f"{r['heads']}h"
        print(f"{r['op']:11} {case:7} {r['kernel']:6} {r['regs_per_thread']:4} {r['launches']:6} {r['ctas']:5} "
              f"{r['ctas_per_sm']:6} {r['tiles']:6} {r['waves']:5.2f} {r['in_flight_bytes_per_sm'] / KiB:7.1f} "
              f"{r['bytes'] / MiB:7.2f} {r['copy_us']:8.2f} {r['predicted_us']:8.2f} "
              f"{r['predicted_fraction']:8.3f} {r['lockstep_fraction']:8.3f} {r['fraction_incl_launch']:8.3f}  "
              f"{'PASS' if r['meets_target'] else 'BELOW'}")
    print("fraction: copy time / modelled kernel time (overlapped CTAs); lockstep: the same without "
          "overlap between rounds (a lower bound); w/launch: with the host launch overhead, which "
          "back-to-back layers hide except for the first")


def main(argv=None):
    args = parse_args(argv)
    import flashmla_perm
    from flashmla_perm import _ops

    if not flashmla_perm.build_info()["native"] or not hasattr(_ops._C, "gpu_launches"):
        print(f"gpu_model: needs the native module (gpu_launches): {flashmla_perm.build_info()['native_error']}")
        return 2
    regs, source = kernel_registers(args)
    records = [model_case(args, *c, regs, _ops._C) for c in cases()]
    print_table(args, regs, source, records)
    if args.json:
        figures = {k: v for k, v in vars(args).items() if k not in ("json", "check")}
        with open(args.json, "w") as f:
            json.dump([{**r, "device": figures, "registers_source": source} for r in records], f, indent=2)
    below = [r for r in records if not r["meets_target"]]
    if below:
        print(f"{len(below)} case(s) below the target {args.target}")
    return 1 if args.check and below else 0


if __name__ == "__main__":
    sys.exit(main())
