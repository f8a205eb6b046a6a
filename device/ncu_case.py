#!/usr/bin/env python3
"""One native call of a model op on one DeepSeek-V4.1 TP1 layer, checked
byte for byte against flashmla_perm.reference: the device check runs it
under `ncu` once per kind, and on the CPU in its dry mode.

    python device/ncu_case.py KIND [--device cuda|cpu] [--json PATH]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import bench_load_time as bench  # noqa: E402  (puts the repository root first on sys.path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=bench.WEIGHT_KINDS)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    _, _, arg = bench.shapes(bench.parse_args(["--tp", "1"]), args.kind, 1)
    layer = bench.make_layer(bench.parse_args(["--tp", "1"]), args.kind, 1, args.device)
    expected = [t.clone() for t in layer]
    bench.weight_fn("native", args.kind, arg)(layer)  # the call ncu profiles
    bench.weight_fn("reference", args.kind, arg)(expected)
    nbytes = bench.tensors_bytes(layer)
    result = {
        "kind": args.kind,
        "device": args.device,
        "bytes_moved": 2 * nbytes,
        "ok": bench.same_bytes(layer, expected),
        "native": bench.flashmla_perm.build_info()["native"],
    }
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
