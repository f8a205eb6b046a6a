"""What the C++ sources include, which is most of the build's time (docs/design.md,
"Build time"): no file includes ATen/ATen.h (every op's declaration, 18.6 s
of parsing per file on the CI machine); the CUDA kernels include no torch
header at all; and no source includes a CUDA header, so that the module
builds with torch alone (docs/design.md, "Build")."""

import re
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parent.parent / "csrc"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def includes(path):
    return INCLUDE.findall(path.read_text())


def sources():
    if not CSRC.is_dir():
        pytest.skip("no csrc/ beside the tests (a tree that holds only the package and tests)")
    return sorted(p for p in CSRC.rglob("*") if p.suffix in {".h", ".cpp", ".cu"})


def test_the_pattern_reads_includes():
    text = '#include <ATen/ATen.h>\n  # include "launch.h"\n// #include <x.h> in a comment line\n'
    assert INCLUDE.findall(text) == ["ATen/ATen.h", "launch.h"]


def test_no_source_includes_all_of_aten():
    heavy = {"ATen/ATen.h", "torch/extension.h", "torch/torch.h", "torch/all.h", "ATen/Functions.h"}
    found = {p.name: sorted(set(includes(p)) & heavy) for p in sources()}
    assert {name: hs for name, hs in found.items() if hs} == {}


def headers_reached(path, seen=None):
    """Every header `path` includes, following the project's own headers."""
    seen = set() if seen is None else seen
    for name in includes(path):
        if name in seen:
            continue
        seen.add(name)
        if (CSRC / name).is_file():
            headers_reached(CSRC / name, seen)
    return seen


def test_the_kernels_include_no_torch_header():
    kernels = [p for p in sources() if p.suffix == ".cu"]
    assert kernels, "no .cu file in csrc/"
    for path in kernels:
        torch_headers = sorted(
            h for h in headers_reached(path) if h.split("/")[0] in {"ATen", "c10", "torch", "pybind11", "Python.h"}
        )
        assert torch_headers == [], f"{path.name} reaches {torch_headers}"


def test_no_source_includes_a_cuda_header():
    cuda = re.compile(r"^(cuda|cuda_runtime|cuda_runtime_api|nvrtc|cudaTypedefs)\.h$|^(c10|ATen)/cuda/|^crt/")
    found = {p.name: [h for h in includes(p) if cuda.search(h)] for p in sources()}
    assert {name: hs for name, hs in found.items() if hs} == {}
