"""Extra peak memory of one in-place permutation, measured the way docs/api.md
states its bound: peak RSS above the level just before the call, each case
in a fresh process (no plan cached yet, so the plan's memory counts). The
process first permutes a small tensor along each kind of dim, so that what a
first call touches once per process (the library's code pages, torch's lazy
state: 0.3-0.4 MiB in a CPU build, 0.5-0.6 in a CUDA one) is not counted as the call's;
`first_call` is the same call without that warm-up.

    python scripts/extra_memory.py            # every case, a table
    python scripts/extra_memory.py --json     # one JSON object per case
"""

import argparse
import json
import subprocess
import sys

CASES = {  # name: (shape, dim, what perm)
    "[4, 4Mi] dim 1": ((4, 4 << 20), 1, "random"),
    "[4Mi, 4] dim 0": ((4 << 20, 4), 0, "random"),
    "[64, 256Ki] dim 1": ((64, 256 << 10), 1, "random"),
    "[4Mi, 4] dim 0, 2-cycles": ((4 << 20, 4), 0, "pairs"),
    # Units of 16 bytes: a cycle plan (the cases above gather, planning nothing).
    "[4Mi, 16] dim 0": ((4 << 20, 16), 0, "random"),
    "[4Mi, 16] dim 0, 2-cycles": ((4 << 20, 16), 0, "pairs"),
    "wq_b TP1 (permute_wq_b_)": (None, None, "wq_b"),
    "wo_a TP1 (permute_wo_a_)": (None, None, "wo_a"),
}

CHILD = r"""
import json, sys, torch, flashmla_perm as fp

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

shape, dim, kind, warm = json.loads(sys.argv[1])
torch.manual_seed(0)
if warm:  # another permutation, so nothing of the measured call's plan is cached
    small = torch.randint(0, 256, (64, 64), dtype=torch.uint8)
    fp.permute_(small, torch.randperm(64), 0)
    fp.permute_(small, torch.randperm(64), 1)
if kind == "wq_b":
    tensors = [torch.randint(0, 256, (32768, 1280), dtype=torch.uint8), torch.randint(0, 256, (32768, 40), dtype=torch.uint8)]
    call = lambda: fp.permute_wq_b_(*tensors, 64)
elif kind == "wo_a":
    tensors = [torch.randint(0, 256, (8192, 4096), dtype=torch.uint8), torch.randint(0, 256, (8192, 128), dtype=torch.uint8)]
    call = lambda: fp.permute_wo_a_(*tensors)
else:
    tensors = [torch.randint(0, 256, shape, dtype=torch.uint8)]
    perm = torch.randperm(shape[dim])
    if kind == "pairs":  # every index in a 2-cycle: the most segments a plan can have
        order, perm = perm, torch.empty_like(perm)
        perm[order[0::2]], perm[order[1::2]] = order[1::2], order[0::2]
    call = lambda: fp.permute_(tensors[0], perm, dim)
nbytes = sum(t.numel() * t.element_size() for t in tensors)
indices = 0 if shape is None else shape[dim]
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # peak RSS := RSS now
before = status("VmRSS")
call()
extra = status("VmHWM") - before
print(json.dumps({"bytes": nbytes, "indices": indices, "extra": extra, "native": fp.build_info()["native"]}))
"""


def measure(shape, dim, kind, warm=True):
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([shape, dim, kind, warm])], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    MiB = 1 << 20
    if not args.json:
        print("| case | tensor | extra peak | x tensor | bound (1/32 + 4 B/index + 1 MiB) | first call in a process |")
        print("| --- | --- | --- | --- | --- | --- |")
    for name, (shape, dim, kind) in CASES.items():
        r = measure(shape, dim, kind)
        bound = r["bytes"] / 32 + 4 * r["indices"] + MiB
        r.update(
            case=name,
            bound=bound,
            within=r["extra"] <= bound,
            first_call=measure(shape, dim, kind, warm=False)["extra"],
        )
        if args.json:
            print(json.dumps(r))
        else:
            print(
                f"| {name} | {r['bytes'] / MiB:.1f} MiB | {r['extra'] / MiB:.2f} MiB | {r['extra'] / r['bytes']:.3f} |"
                f" {bound / MiB:.2f} MiB: {'within' if r['within'] else 'OVER'} | {r['first_call'] / MiB:.2f} MiB |"
            )


if __name__ == "__main__":
    main()
