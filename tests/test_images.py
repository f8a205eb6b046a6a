"""flashmla_perm.images: the CUDA images read out of the module's bytes. The
installed module is gated where it has CUDA images, its figures checked against
cuobjdump and its PTX assembled by ptxas where they are at hand; the reader and
the gate are tested on CUDA ELF files made here, byte by byte."""

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from flashmla_perm import images

KERNELS = list(images.SHORT.values())


def tool(name):
    """A CUDA tool: on PATH, in a toolkit, or in an nvidia-* wheel's bin
    (nvidia-cuda-nvcc's ptxas, nvidia-cuda-cuobjdump's cuobjdump)."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    found = [shutil.which(name), *(Path(h, "bin", name) for h in homes if h)]
    found += [p for d in sys.path if d and Path(d, "nvidia").is_dir() for p in Path(d, "nvidia").glob(f"*/bin/{name}")]
    return next((str(p) for p in found if p and Path(p).is_file()), None)


def release(tool):
    """(major, minor) of a CUDA tool's release, or (0, 0)."""
    m = re.search(r"release (\d+)\.(\d+)", subprocess.run([tool, "--version"], capture_output=True, text=True).stdout)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def installed():
    """The installed module and its records, where it has CUDA images; else skip."""
    try:
        path = images.module_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    records = images.images(path)
    if not any(r["kind"] == "cubin" for r in records):
        pytest.skip(f"{path.name} has no cubins (a CPU-only build, or kernels compiled at first use)")
    return path, records


def test_installed_module_passes_the_gate():
    path, records = installed()
    assert images.gate(records) == [], f"python -m flashmla_perm.images --gate {path}"
    assert [r["kind"] for r in records].count("ptx") == 1
    assert all(sorted(r["kernels"]) == sorted(KERNELS) for r in records), records


def test_installed_figures_are_cuobjdumps(tmp_path):
    path, records = installed()
    if not (cuobjdump := tool("cuobjdump")):
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump)")
    for r in (r for r in records if r["kind"] == "cubin"):
        cubin = tmp_path / f"{r['arch']}.cubin"
        cubin.write_bytes(path.read_bytes()[r["offset"] : r["offset"] + r["size"]])
        out = subprocess.run([cuobjdump, "--dump-resource-usage", str(cubin)], capture_output=True, text=True)
        if out.returncode:
            pytest.skip(f"{cuobjdump} ({release(cuobjdump)}) cannot read {r['arch']}: {out.stderr.strip()}")
        found = re.findall(r"Function (\w+):\n(.*)", out.stdout)
        theirs = {images.SHORT.get(n, n): dict(re.findall(r"(\w+):(\d+)", line)) for n, line in found}
        assert sorted(theirs) == sorted(r["kernels"]), r["arch"]
        for k, f in r["kernels"].items():
            mine = (f["registers"], f["stack"], f["local"], f["static_smem"])
            assert mine == tuple(int(theirs[k][c]) for c in ("REG", "STACK", "LOCAL", "SHARED")), (r["arch"], k)


def test_installed_ptx_assembles(tmp_path):
    """ptxas takes the PTX at the ISA version it declares (as an older driver of the
    same CUDA major must): four kernels, their registers and frames as -v reports."""
    path, records = installed()
    ptx = next((r for r in records if r["kind"] == "ptx"), None)
    if ptx is None:
        pytest.skip(f"{path.name} has no PTX image")
    isa = tuple(map(int, ptx["isa"].split(".")))
    if not (ptxas := tool("ptxas")) or (release(ptxas)[0] - 4, release(ptxas)[1]) < isa:
        pytest.skip(f"no ptxas for PTX ISA {ptx['isa']} (CUDA {isa[0] + 4}.{isa[1]} or later)")
    source, cubin = tmp_path / "image.ptx", tmp_path / "image.cubin"
    source.write_bytes(path.read_bytes()[ptx["offset"] : ptx["offset"] + ptx["size"]])
    cmd = [ptxas, "-v", f"-arch={ptx['arch']}", str(source), "-o", str(cubin)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    said = r"entry function '(\w+)'.*?(\d+) bytes stack frame.*?Used (\d+) registers"
    reported = {images.SHORT[k]: (int(f), int(r)) for k, f, r in re.findall(said, done.stdout + done.stderr, re.S)}
    mine = {k: (f["frame"], f["registers"]) for k, f in images.cubin_kernels(cubin.read_bytes()).items()}
    assert mine == reported and sorted(mine) == sorted(KERNELS)


def rec(attr, payload=None, value=0, fmt=3):
    """An .nv.info record: an SVAL of `payload`, else `value` in format `fmt`."""
    if payload is None:
        return bytes([fmt, attr]) + struct.pack("<H", value)
    return bytes([4, attr]) + struct.pack("<H", len(payload)) + payload


def kparam(ordinal, offset, size):
    return rec(images.KPARAM_INFO, struct.pack("<IHHI", 0, ordinal, offset, size << 18 | 0x1F << 12))


def elf(sections, flags=0x06005A04, abi=8):
    """A CUDA ELF64 of (name, sh_type, bytes or NOBITS size, sh_info) sections."""
    names, body, heads = b"\0", b"", [bytes(64)]
    for name, kind, data, info in [*sections, (".shstrtab", 3, None, 0)]:
        data = names + name.encode() + b"\0" if data is None else data
        size = data if isinstance(data, int) else len(data)
        heads.append(struct.pack("<IIQQQQIIQQ", len(names), kind, 0, 0, 64 + len(body), size, 0, info, 4, 0))
        names += name.encode() + b"\0"
        body += b"" if isinstance(data, int) else data
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x41 if abi == 8 else 0x33, abi]) + bytes(7)
    n = len(heads)
    header = struct.pack("<16sHHIQQQIHHHHHH", ident, 2, 190, 1, 0, 0, 64 + len(body), flags, 64, 56, 0, 64, n, n - 1)
    return header + body + b"".join(heads)


def cubin(sm, figures):
    """A cubin of kernels {short name: (registers, min stack, frame, local)},
    each with 1 KiB of static shared memory and 600 bytes of parameters."""
    info, sections = b"", []
    for i, (k, (regs, stack, frame, local)) in enumerate(figures.items()):
        name, symbol = f"flashmla_perm_{k}", 0x20 + i
        for attr, value in ((images.REGCOUNT, regs), (images.FRAME_SIZE, frame), (images.MIN_STACK_SIZE, stack)):
            info += rec(attr, struct.pack("<II", symbol, value))
        records = kparam(1, 592, 8) + kparam(0, 0, 592) + rec(0x19, value=600) + rec(0x1E, bytes(4))
        sections += [(f".nv.info.{name}", 0x70000000, records, 0), (f".text.{name}", 1, bytes(32), symbol)]
        sections += [(f".nv.shared.{name}", 8, 1024, 0)] + ([(f".nv.local.{name}", 8, local, 0)] if local else [])
    return elf([(".nv.info", 0x70000000, info, 0), *sections], flags=0x06000002 | sm << 8)


PTX = b"//\n// Generated by NVIDIA NVVM Compiler\n//\n\n.version 9.0\n.target sm_80\n.address_size 64\n" + b"".join(
    b".visible .entry flashmla_perm_%s(\n.param .align 8 .b8 p[600]\n)\n{\nret;\n}\n" % k.encode() for k in KERNELS
)


def test_nv_info_records_and_cubin_kernels():
    data = bytes([1, 0x50, 0, 0]) + rec(0x4C, value=1, fmt=2) + rec(0x1B, value=0x38) + rec(0x17, b"abcdefghijkl")
    assert images.nv_info(data) == [(0x50, 0), (0x4C, 1), (0x1B, 0x38), (0x17, b"abcdefghijkl")]
    # The block ends at its last parameter, whichever order the records come in.
    assert images.kparam_bytes(images.nv_info(kparam(2, 0x58, 2) + kparam(1, 0x50, 8) + kparam(0, 0, 0x50))) == 90
    assert images.kparam_bytes([]) == 0
    got = images.cubin_kernels(cubin(100, {"rows": (80, 8, 8, 0), "save_heads": (64, 0, 0, 16)}))
    figures = {"registers": 80, "stack": 8, "frame": 8, "local": 0, "static_smem": 1024, "param_bytes": 600}
    assert got == {"rows": figures, "save_heads": {**figures, "registers": 64, "stack": 0, "frame": 0, "local": 16}}


def test_cubin_arch_from_each_abi():
    # e_flags of NVRTC 12.8's and 13.0's cubins: ABI 7 keeps the SM in the low byte, ABI 8 in bits 8..15.
    assert images.cubin_arch(elf([], flags=0x005A055A, abi=7)) == "sm_90"
    assert images.cubin_arch(elf([], flags=0x005A0D5A, abi=7)) == "sm_90a"
    assert images.cubin_arch(elf([], flags=0x06006402)) == "sm_100"
    assert images.cubin_arch(elf([], flags=0x0600640A)) == "sm_100a"
    compat = [(".nv.compat", 0x70000086, rec(images.ACCELERATOR_TARGET, value=1, fmt=2), 0)]
    assert images.cubin_arch(elf(compat)) == "sm_90a"  # CUDA 13 marks 'a' there


def test_images_scans_a_module(tmp_path):
    host = b"\x7fELF\x02\x01\x01" + bytes(11) + struct.pack("<H", 62) + bytes(45)  # an x86-64 header: no cubin
    decoy = b"text that is no PTX\n.version 1.0\n\0"  # a .version but no .target
    # Then headers that only look like a cubin's: sections past the end; cut short at the end of the file.
    clean = {k: (64, 0, 0, 0) for k in KERNELS}
    bogus = bytearray(cubin(90, clean)[:64])
    bogus[0x28:0x30] = struct.pack("<Q", 1 << 40)
    parts = [host, b"\0" * 100, cubin(90, clean), decoy, cubin(100, clean), PTX + b"\0"]
    path = tmp_path / "_C.fake.so"
    path.write_bytes(b"".join(p + bytes(-len(p) % 64) for p in parts) + bogus + b"\x7fELF\x02\x01\x01\x41\x08")
    records = images.images(path)
    assert [(r["kind"], r["arch"]) for r in records] == [("cubin", "sm_90"), ("cubin", "sm_100"), ("ptx", "sm_80")]
    data = path.read_bytes()
    for r in records[:2]:
        assert images.cubin_kernels(data[r["offset"] : r["offset"] + r["size"]]) == r["kernels"]
    assert records[2]["isa"] == "9.0" and sorted(records[2]["kernels"]) == sorted(KERNELS)
    assert data[records[2]["offset"] :].startswith(b"//\n// Generated") and records[2]["size"] == len(PTX)
    assert images.gate(records) == []
    images.main([str(path), "--gate", "--json", str(tmp_path / "out.json")])
    assert "sm_100" in (tmp_path / "out.json").read_text()


def record(sm, regs=64, **changed):
    """A cubin's record: clean kernels of `regs` registers, but for `changed` fields (None: no such kernel)."""
    clean = {"registers": regs, "stack": 0, "frame": 0, "local": 0, "static_smem": 1024, "param_bytes": 600}
    kernels = {k: {**clean, **changed.get(k, {})} for k in KERNELS if changed.get(k, {}) is not None}
    return {"kind": "cubin", "arch": f"sm_{sm}", "kernels": kernels}


PTX_RECORD = {"kind": "ptx", "arch": "sm_80", "isa": "9.0", "kernels": {k: {} for k in KERNELS}}
with_sm100 = lambda **changed: [record(90), record(100, **changed), PTX_RECORD]


@pytest.mark.parametrize(
    "records, why",
    [
        ([record(90, 100), record(100, 110), record(103, 100), PTX_RECORD], ""),
        ([record(100, 200), PTX_RECORD], ""),  # registers compared only where sm_90 is too
        (with_sm100(rows={"stack": 8}), "sm_100 rows: 8 bytes stack frame"),
        (with_sm100(rows={"frame": 16}), "sm_100 rows: 16 bytes stack frame"),
        (with_sm100(cols_staged={"local": 32}), "sm_100 cols_staged: 32 bytes local memory"),
        (with_sm100(save_heads={"registers": 71}), "sm_100 save_heads: 71 registers, over 1.1x sm_90's 64"),
        (with_sm100(cols_direct=None), "sm_100 cubin lacks cols_direct"),
        (with_sm100(rows={"param_bytes": 608}), "rows: parameter blocks differ"),
        ([record(90)], "no ptx"),
        ([PTX_RECORD], "no cubin"),
        ([record(90), {**PTX_RECORD, "kernels": {}}], "sm_80 ptx lacks rows"),
    ],
)
def test_gate(records, why):
    fails = " ".join(images.gate(records))
    assert (why in fails) if why else fails == "", fails
