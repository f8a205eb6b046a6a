#!/usr/bin/env python3
"""The kernels' hot loops in their SASS: instructions per trip of each
innermost loop that moves memory, per kernel, from a cubin (through
cuobjdump -sass) or a file of its SASS text.

A loop is a backward branch (a BRA whose target is at a lower address) and
the code from its target to it; innermost: no other loop that moves memory
inside it. A trip is counted as the instructions on the shortest and on the
longest path from the loop's head to its backward branch (an inner loop
without memory work, such as a multi-dim line offset's, counts once). Each loop
is named by its memory instructions (LDGSTS, LDG, STG, LDS, STS, with their
widths), which tells the vector width and the loop's kind apart; a kernel
holds several copies of some (the two jobs of a launch).

    python scripts/sass_loops.py CUBIN_OR_SASS                 # the loops
    python scripts/sass_loops.py --diff BEFORE AFTER           # fails if a loop grew

cuobjdump comes from PATH, $CUOBJDUMP, or the nvidia-cuda-cuobjdump wheel
(whose -sass needs the nvidia-cuda-nvdisasm wheel beside it).
--diff compares, per kernel and memory signature, the longest loop and the
set of distinct lengths; it fails where a signature's longest loop grew.
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict

FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
MEMORY = ("LDGSTS", "LDG", "STG", "LDS", "STS")


def parse(text):
    """{kernel: [(address, predicate, opcode, operands)]} from cuobjdump -sass text."""
    kernels, current = {}, None
    for line in text.splitlines():
        if m := FUNCTION.match(line):
            current = kernels.setdefault(m.group(1), [])
        elif current is not None and (m := INSTR.match(line)):
            current.append((int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return kernels


def loops(code):
    """Innermost loops that move memory: [(start, end, shortest, longest, signature)]."""
    spans = []
    for addr, _, op, args in code:
        m = re.search(r"0x([0-9a-f]+)$", args)
        if op.split(".")[0] == "BRA" and m and int(m.group(1), 16) < addr:
            spans.append((int(m.group(1), 16), addr))
    mem = {}
    for s, e in spans:
        ops = Counter(op for a, pred, op, _ in code if s <= a <= e and op.split(".")[0] in MEMORY and pred != "@!PT")
        if ops:  # (padding under @!PT is no access)
            mem[s, e] = " ".join(f"{op}x{n}" for op, n in sorted(ops.items()))
    return [
        (s, e, *trip([c for c in code if s <= c[0] <= e]), sig)
        for (s, e), sig in mem.items()
        if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in mem)  # holds no other
    ]


def trip(body):
    """Instructions on the shortest and the longest path from a loop's head to
    its backward branch: the fast path (every `if` skipped: a line of one
    dim, no tail) and the slowest. Inside an innermost loop every branch
    goes forward but an inner loop's, which is taken as not taken, so one
    pass in address order finds both."""
    at = {c[0]: i for i, c in enumerate(body)}
    short, long = [None] * len(body), [None] * len(body)
    short[0] = long[0] = 1
    for i, (_, pred, op, args) in enumerate(body):
        if short[i] is None:
            continue
        nexts = []
        m = re.search(r"0x([0-9a-f]+)$", args)
        if op.split(".")[0] == "BRA" and m and int(m.group(1), 16) in at:
            nexts.append(at[int(m.group(1), 16)])
        if not ((op.split(".")[0] in ("BRA", "EXIT") and pred in ("", "@PT")) or i + 1 == len(body)):
            nexts.append(i + 1)
        for j in nexts:
            if j > i:
                short[j] = short[i] + 1 if short[j] is None else min(short[j], short[i] + 1)
                long[j] = long[i] + 1 if long[j] is None else max(long[j], long[i] + 1)
    return short[-1], long[-1]


def sass_of(path):
    if not path.endswith(".cubin"):
        return open(path).read()
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    try:
        import nvidia  # the nvidia-cuda-cuobjdump wheel

        tool = tool or next(glob.iglob(os.path.join(nvidia.__path__[0], "cu*", "bin", "cuobjdump")))
    except (ImportError, StopIteration):
        pass
    wheels = "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"
    if not tool:
        sys.exit(f"no cuobjdump: put it on PATH, set CUOBJDUMP, or {wheels}")
    done = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
    if done.returncode:  # e.g. no nvdisasm beside it
        sys.exit(f"{done.stderr.strip()}\n(cuobjdump -sass {path} failed: {wheels} gives both)")
    return done.stdout


def by_signature(path):
    """{kernel: {signature: [(shortest, longest) per trip, ...]}}."""
    out = {}
    for kernel, code in parse(sass_of(path)).items():
        sigs = defaultdict(set)
        for _, _, short, long, sig in loops(code):
            sigs[sig].add((short, long))
        out[kernel] = {s: sorted(ns) for s, ns in sigs.items()}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--diff", action="store_true", help="two files: before and after")
    args = ap.parse_args()
    if not args.diff:
        for path in args.files:
            for kernel, code in sorted(parse(sass_of(path)).items()):
                print(f"{kernel}: {len(code)} instructions")
                for s, e, short, long, sig in loops(code):
                    print(f"  {short:4} {long:4} per trip  [{s:#x}, {e:#x}]  {sig}")
        return 0
    before, after = (by_signature(p) for p in args.files)
    grew = []
    for kernel in sorted(set(before) | set(after)):
        b, a = before.get(kernel, {}), after.get(kernel, {})
        print(f"{kernel}: shortest and longest path per trip, before -> after")
        for sig in sorted(set(b) | set(a)):
            nb, na = b.get(sig, []), a.get(sig, [])
            worse = nb and na and (max(na)[0] > max(nb)[0] or max(x[1] for x in na) > max(x[1] for x in nb))
            print(f"  {fmt(nb):>24} -> {fmt(na):24}{' GREW' if worse else ''}  {sig}")
            grew += [(kernel, sig)] if worse else []
    if grew:
        print(f"{len(grew)} loop signature(s) grew")
    return 1 if grew else 0


def fmt(pairs):
    return " ".join(f"{s}/{n}" for s, n in pairs) or "-"


if __name__ == "__main__":
    sys.exit(main())
