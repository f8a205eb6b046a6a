"""Fails (exit 1) on any compiler warning about the project's own sources in
build logs: the host compiler's and NVRTC's warnings located in csrc/ or
tests/harness/ (csrc/cuda/build_kernels.py names NVRTC's by csrc/ paths), and
every ptxas warning (ptxas only ever compiles our kernels). Warnings located in other
files (torch's headers, the toolkit's) and driver notes without a location
are counted and listed, but pass.

    python scripts/warnings_gate.py BUILD_LOG [BUILD_LOG ...]
"""

import re
import sys

OWN = re.compile(r"(?:^|/)(?:csrc|tests/harness)/[^\s:()]+$")
# g++: "path:line[:col]: warning: text"; NVRTC: "path(line): warning #123-D: text".
LOCATED = re.compile(
    r"^(?P<path>[^\s:()][^:()]*?)(?::(?P<line>\d+)(?::\d+)?|\((?P<nline>\d+)\)):"
    r" warning(?: #[\w-]+)?: (?P<text>.*)$"
)
PTXAS = re.compile(r"^ptxas (?:warning|/ .* warning) ?: (?P<text>.*)$")
UNLOCATED = re.compile(r"^(?:cc1plus|g\+\+|c\+\+)(?:: |\s)warning ?: ", re.I)


def scan(lines):
    own, other = [], []
    for raw in lines:
        line = raw.strip()  # pip -v indents the compilers' output
        located = LOCATED.match(line)
        if located:
            path = located.group("path").strip()
            (own if OWN.search(path) and "site-packages" not in path else other).append(line)
        elif PTXAS.match(line):
            own.append(line)
        elif UNLOCATED.match(line):
            other.append(line)
    return own, other


def main(paths):
    if not paths:
        sys.exit(__doc__)
    failed = False
    for path in paths:
        with open(path, errors="replace") as f:
            own, other = scan(f)
        unique = sorted(set(own))
        for line in unique:
            print(f"  {line}")
        if other:
            print(
                f"  ({len(other)} warning(s) about other files or the driver, not ours:"
                f" {sorted(set(other))[0][:160]} ...)"
            )
        print(
            f"warnings gate: {path}: {len(unique)} warning(s) in the project's own sources"
            f" -> {'FAIL: fix the lines above in csrc/ or tests/harness/' if unique else 'ok'}"
        )
        failed |= bool(unique)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
