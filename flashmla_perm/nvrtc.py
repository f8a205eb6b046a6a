"""The CUDA kernels without a GPU: warm the kernel cache, or report what
ptxas says of them (and gate it).

    python -m flashmla_perm.nvrtc --warm [--arch sm_XY ...]
    python -m flashmla_perm.nvrtc --arch sm_XY [--arch ...] [--json FILE] [--gate]
    python -m flashmla_perm.nvrtc --log BUILD_LOG [--json FILE] [--gate]

``--warm`` makes every architecture's kernels ready on this machine, one line
each: built at install (nothing to do), found in the kernel cache, or compiled
by NVRTC now (and cached, with the seconds; in vLLM's cache where vLLM is
installed, as its plugin reads it). Without ``--arch``, the visible
GPUs' architectures; with it, no GPU is needed (an image builder: one line in
a Dockerfile). The report compiles every kernel with NVRTC for ``--arch``
(or reads ptxas's lines in a build's log: ``--log``, the kernels built at
install) and prints, per kernel, registers, spill stores and loads, stack
frame and static shared memory; ``--gate`` fails on any spill or stack
frame, or sm_100 over 1.1x sm_90's registers.

Needs a module with the CUDA side, and NVRTC (the nvidia-cuda-nvrtc package
torch's CUDA wheels bring) for anything it compiles.
"""

import argparse
import importlib.util
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\w+)'")
PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
SM100_OVER_SM90 = 1.1  # most registers sm_100 may take, over sm_90's
SHORT = {  # csrc/cuda/kernels.cu's extern "C" names
    "flashmla_perm_rows": "rows",
    "flashmla_perm_save_heads": "save_heads",
    "flashmla_perm_cols_staged": "cols_staged",
    "flashmla_perm_cols_direct": "cols_direct",
}


def parse(log):
    """ptxas's -v report as records: kernel, arch, registers, spill_stores,
    spill_loads, stack, static_smem."""
    records, current = [], None
    for line in log.splitlines():
        if m := ENTRY.search(line):
            current = {"kernel": SHORT.get(m.group(1), m.group(1)), "arch": m.group(2)}
            records.append(current)
        elif current and (m := PROPS.search(line)):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif current and (m := USED.search(line)):
            current.update(registers=int(m.group(1)), static_smem=int(m.group(2) or 0))
    return records


def native():
    from flashmla_perm import _ops

    if _ops._C is None or not hasattr(_ops._C, "prepare_kernels"):
        raise SystemExit(
            "flashmla_perm.nvrtc: the native module has no CUDA side "
            f"(build_info: {__import__('flashmla_perm').build_info()})"
        )
    return _ops._C


def compile_arch(arch):
    out = native().nvrtc_compile(arch)
    records = parse(out["log"])
    for r in records:
        r["seconds"] = round(out["seconds"], 2)
    return records


def visible_archs():
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("flashmla_perm.nvrtc --warm: no GPU visible; name the architectures with --arch sm_XY")
    return sorted({"sm_%d%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})


def warm(archs):
    """One line per architecture, as each is ready: where its kernels come
    from. Where vLLM is installed, into its cache, as the plugin reads it."""
    C = native()
    if importlib.util.find_spec("vllm") is not None:
        from . import _kernels

        _kernels.use_vllm_cache()
    for arch in archs:
        yield f"{arch}: {C.prepare_kernels(arch)['text']}"


def report(records, json_path=None, gate=False):
    print(f"{'arch':7} {'regs':>4} {'smem':>5} {'stack':>5} {'spill':>5} {'secs':>5}  kernel")
    bad = []
    for r in sorted(records, key=lambda r: (r["arch"], r["kernel"])):
        spill = r.get("spill_stores", 0) + r.get("spill_loads", 0)
        print(
            f"{r['arch']:7} {r.get('registers', -1):4} {r.get('static_smem', 0):5} {r.get('stack', -1):5} "
            f"{spill:5} {r.get('seconds', ''):>5}  {r['kernel']}"
        )
        if r.get("stack", 1) or spill or "registers" not in r:
            bad.append(f"{r['arch']} {r['kernel']}")
    # sm_100 (B200, GB200; B300 runs its code) within 1.1x sm_90's registers:
    # fewer CTAs per SM otherwise (NVVM 20 once took 2x).
    sm90 = {r["kernel"]: r.get("registers", 0) for r in records if r["arch"] == "sm_90"}
    for r in records:
        if (
            r["arch"] == "sm_100"
            and r["kernel"] in sm90
            and r.get("registers", 0) > SM100_OVER_SM90 * sm90[r["kernel"]]
        ):
            bad.append(f"sm_100 {r['kernel']} ({r['registers']} registers, sm_90 {sm90[r['kernel']]})")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(records, f, indent=2)
    archs = {r["arch"] for r in records}
    if not records or len(records) != len(SHORT) * len(archs):
        print(f"ptxas gate: {len(records)} kernel reports for {len(archs)} architectures, expected {len(SHORT)} each")
        return 1
    if gate and bad:
        print(f"ptxas gate FAILED: spills, stack frames or sm_100 registers in {bad}")
        return 1
    if gate:
        print(
            f"ptxas gate passed: {len(records)} kernel builds, no spills, no stack frames, sm_100 within "
            f"{SM100_OVER_SM90}x sm_90's registers (shared memory is dynamic: tile sizes in csrc/launch.h)"
        )
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", action="append", help="sm_80, sm_90, sm_100, ... (repeatable)")
    ap.add_argument("--warm", action="store_true", help="make the kernels ready (default: the visible GPUs')")
    ap.add_argument("--log", help="report on the ptxas lines of this build log instead of compiling")
    ap.add_argument("--json", help="the report: write its records here, a JSON list")
    ap.add_argument(
        "--gate", action="store_true", help="fail on any spill or stack frame, or sm_100 over 1.1x sm_90's registers"
    )
    args = ap.parse_args(argv)
    if args.warm:
        for line in warm(args.arch or visible_archs()):
            print(line, flush=True)
        return 0
    if args.log:
        with open(args.log, errors="replace") as f:
            return report(parse(f.read()), args.json, args.gate)
    if not args.arch:
        ap.error("--arch or --log is needed for the report (or --warm)")
    # NVRTC runs without the GIL: the architectures compile side by side.
    with ThreadPoolExecutor(max_workers=len(args.arch)) as pool:
        records = [r for rs in pool.map(compile_arch, args.arch) for r in rs]
    return report(records, args.json, args.gate)


if __name__ == "__main__":
    sys.exit(main())
