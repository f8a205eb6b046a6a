"""The CUDA kernels through NVRTC, without a GPU: compiles every kernel for an
architecture and reports, per kernel, what ptxas says of it (registers, spill
stores and loads, stack frame, static shared memory). ``--gate`` fails on any
spill or stack frame, or sm_100 over 1.1x sm_90's registers, as
scripts/ptxas_gate.py does for nvcc's build.

    python -m flashmla_perm.nvrtc --arch sm_90 [--arch sm_100 ...] [--json FILE] [--gate]

Needs a module with the CUDA kernels (either compiler: both embed the source)
and NVRTC (the nvidia-cuda-nvrtc package torch's CUDA wheels bring).
"""

import argparse
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\w+)'")
PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
SM100_OVER_SM90 = 1.1  # most registers sm_100 may take, over sm_90's (scripts/ptxas_gate.py too)
# The lowered names as cuda_kernels.cu's kernels are called (the anonymous
# namespace's part of the mangled name differs between compilers).
SHORT = [
    ("flashmla_perm_rowsE", "rows"),
    ("flashmla_perm_save_headsE", "save_heads"),
    ("flashmla_perm_colsILb1E", "cols<true>"),
    ("flashmla_perm_colsILb0E", "cols<false>"),
]


def parse(log):
    """ptxas's -v report as records: kernel, arch, registers, spill_stores,
    spill_loads, stack, static_smem."""
    records, current = [], None
    for line in log.splitlines():
        if m := ENTRY.search(line):
            name = next((short for key, short in SHORT if key in m.group(1)), m.group(1))
            current = {"kernel": name, "arch": m.group(2)}
            records.append(current)
        elif current and (m := PROPS.search(line)):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif current and (m := USED.search(line)):
            current.update(registers=int(m.group(1)), static_smem=int(m.group(2) or 0))
    return records


def compile_arch(arch):
    from flashmla_perm import _ops

    if _ops._C is None or not hasattr(_ops._C, "nvrtc_compile"):
        raise SystemExit(
            "flashmla_perm.nvrtc: the native module has no CUDA kernels "
            f"(build_info: {__import__('flashmla_perm').build_info()})"
        )
    out = _ops._C.nvrtc_compile(arch)
    records = parse(out["log"])
    for r in records:
        r["seconds"] = round(out["seconds"], 2)
    return records


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", action="append", required=True, help="sm_80, sm_90, sm_100, ... (repeatable)")
    ap.add_argument("--json", help="write the records here, a JSON list")
    ap.add_argument(
        "--gate", action="store_true", help="fail on any spill or stack frame, or sm_100 over 1.1x sm_90's registers"
    )
    args = ap.parse_args(argv)
    # NVRTC runs without the GIL: the architectures compile side by side.
    with ThreadPoolExecutor(max_workers=len(args.arch)) as pool:
        records = [r for rs in pool.map(compile_arch, args.arch) for r in rs]
    print(f"{'arch':7} {'regs':>4} {'smem':>5} {'stack':>5} {'spill':>5} {'secs':>5}  kernel")
    bad = []
    for r in records:
        spill = r.get("spill_stores", 0) + r.get("spill_loads", 0)
        print(
            f"{r['arch']:7} {r.get('registers', -1):4} {r.get('static_smem', 0):5} {r.get('stack', -1):5} "
            f"{spill:5} {r['seconds']:5}  {r['kernel']}"
        )
        if r.get("stack", 1) or spill or "registers" not in r:
            bad.append(f"{r['arch']} {r['kernel']}")
    # sm_100 (B200, GB200; B300 runs its code) within 1.1x sm_90's registers,
    # as scripts/ptxas_gate.py holds nvcc's build: fewer CTAs per SM otherwise.
    sm90 = {r["kernel"]: r.get("registers", 0) for r in records if r["arch"] == "sm_90"}
    for r in records:
        if (
            r["arch"] == "sm_100"
            and r["kernel"] in sm90
            and r.get("registers", 0) > SM100_OVER_SM90 * sm90[r["kernel"]]
        ):
            bad.append(f"sm_100 {r['kernel']} ({r['registers']} registers, sm_90 {sm90[r['kernel']]})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=2)
    expected = 4 * len(args.arch)
    if len(records) != expected:
        print(f"NVRTC gate: {len(records)} kernel reports, expected {expected}")
        return 1
    if args.gate and bad:
        print(f"NVRTC gate FAILED: spills, stack frames or sm_100 registers in {bad}")
        return 1
    if args.gate:
        print(
            f"NVRTC gate passed: {len(records)} kernel builds, no spills, no stack frames, sm_100 within "
            f"{SM100_OVER_SM90}x sm_90's registers"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
