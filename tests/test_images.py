"""flashmla_perm.images: the CUDA images read out of the module's bytes.

The installed module is gated where it has CUDA images (and its figures and PTX
checked by cuobjdump and ptxas where they are at hand); the reader itself is
tested on CUDA ELF files made here, byte by byte (no toolkit needed), and, where
nvcc and a C compiler are, on a module of real cubins.
"""

import os
import re
import shutil
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flashmla_perm import images

ROOT = Path(__file__).resolve().parent.parent
KERNELS = list(images.SHORT.values())


def tool(name):
    """A CUDA tool: on PATH, in a toolkit, or in an nvidia-* wheel's bin
    (nvidia-cuda-nvcc's ptxas, nvidia-cuda-cuobjdump's cuobjdump)."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    found = [shutil.which(name), *(Path(h, "bin", name) for h in homes if h)]
    found += [
        p for d in sys.path if d and Path(d, "nvidia").is_dir() for p in sorted(Path(d, "nvidia").glob(f"*/bin/{name}"))
    ]
    return next((str(p) for p in found if p and Path(p).is_file()), None)


def release(tool):
    """(major, minor) of a CUDA tool's release, or (0, 0)."""
    m = re.search(r"release (\d+)\.(\d+)", subprocess.run([tool, "--version"], capture_output=True, text=True).stdout)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# ---------------------------------------------------------------- the installed module


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
    assert len([r for r in records if r["kind"] == "ptx"]) == 1
    cubins = [r for r in records if r["kind"] == "cubin"]
    for r in cubins:
        assert sorted(r["kernels"]) == sorted(KERNELS), r["arch"]
    for k in KERNELS:
        assert len({r["kernels"][k]["param_bytes"] for r in cubins}) == 1, k


def test_installed_figures_are_cuobjdumps(tmp_path):
    path, records = installed()
    if not (cuobjdump := tool("cuobjdump")):
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump)")
    data = path.read_bytes()
    for r in (r for r in records if r["kind"] == "cubin"):
        cubin = tmp_path / f"{r['arch']}.cubin"
        cubin.write_bytes(data[r["offset"] : r["offset"] + r["size"]])
        out = subprocess.run([cuobjdump, "--dump-resource-usage", str(cubin)], capture_output=True, text=True)
        if out.returncode:
            pytest.skip(f"{cuobjdump} ({release(cuobjdump)}) cannot read {r['arch']}: {out.stderr.strip()}")
        theirs = {
            images.SHORT.get(name, name): {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", line)}
            for name, line in re.findall(r"Function (\w+):\n(.*)", out.stdout)
        }
        assert sorted(theirs) == sorted(r["kernels"]), r["arch"]
        for k, f in r["kernels"].items():
            mine = (f["registers"], f["stack"], f["local"], f["static_smem"])
            assert mine == tuple(theirs[k][c] for c in ("REG", "STACK", "LOCAL", "SHARED")), (r["arch"], k)


def test_installed_ptx_assembles(tmp_path):
    """ptxas takes the PTX at the ISA version it declares (an older driver of
    the same CUDA major must), and makes the four kernels of it."""
    path, records = installed()
    ptx = next((r for r in records if r["kind"] == "ptx"), None)
    if ptx is None:
        pytest.skip(f"{path.name} has no PTX image")
    isa = tuple(map(int, ptx["isa"].split(".")))
    if not (ptxas := tool("ptxas")) or (release(ptxas)[0] - 4, release(ptxas)[1]) < isa:
        pytest.skip(f"no ptxas for PTX ISA {ptx['isa']} (CUDA {isa[0] + 4}.{isa[1]} or later)")
    source, cubin = tmp_path / "image.ptx", tmp_path / "image.cubin"
    source.write_bytes(path.read_bytes()[ptx["offset"] : ptx["offset"] + ptx["size"]])
    done = subprocess.run(
        [ptxas, f"-arch={ptx['arch']}", str(source), "-o", str(cubin)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert sorted(images.cubin_kernels(cubin.read_bytes())) == sorted(KERNELS)


# ---------------------------------------------------------------- CUDA ELF files made here


def svals(attr, payload):
    return bytes([4, attr]) + struct.pack("<H", len(payload)) + payload


def hval(attr, value, fmt=3):
    return bytes([fmt, attr]) + struct.pack("<H", value)


def kparam(ordinal, offset, size):
    return svals(images.KPARAM_INFO, struct.pack("<IHHI", 0, ordinal, offset, size << 18 | 0x1F << 12))


def elf(sections, flags=0x06005A04, abi=8):
    """A CUDA ELF64 of (name, sh_type, bytes or NOBITS size, sh_info) sections."""
    names, body, heads = b"\0", b"", [bytes(64)]
    for name, kind, data, info in [*sections, (".shstrtab", 3, None, 0)]:
        if name == ".shstrtab":
            data = names + name.encode() + b"\0"
        size = data if isinstance(data, int) else len(data)
        heads.append(struct.pack("<IIQQQQIIQQ", len(names), kind, 0, 0, 64 + len(body), size, 0, info, 4, 0))
        names += name.encode() + b"\0"
        body += b"" if isinstance(data, int) else data
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x41 if abi == 8 else 0x33, abi]) + bytes(7)
    header = struct.pack(
        "<16sHHIQQQIHHHHHH", ident, 2, 190, 1, 0, 0, 64 + len(body), flags, 64, 56, 0, 64, len(heads), len(heads) - 1
    )
    return header + body + b"".join(heads)


def fake_cubin(sm, figures, params=None):
    """A cubin with kernels {short name: (registers, min stack, frame, local)}."""
    params = params or {}
    info, sections = b"", []
    for i, (k, (regs, stack, frame, local)) in enumerate(figures.items()):
        name, symbol = f"flashmla_perm_{k}", 0x20 + i
        for attr, value in ((images.REGCOUNT, regs), (images.FRAME_SIZE, frame), (images.MIN_STACK_SIZE, stack)):
            info += svals(attr, struct.pack("<II", symbol, value))
        size = params.get(k, 600)
        blocks = kparam(1, size - 8, 8) + kparam(0, 0, size - 8) + hval(0x19, size) + hval(0x4C, 1, fmt=2)
        sections += [
            (f".nv.info.{name}", 0x70000000, svals(0x37, b"\x82\0\0\0") + blocks + svals(0x1E, bytes(4)), 0),
            (f".text.{name}", 1, bytes(32), symbol),
            (f".nv.shared.{name}", 8, 1024, 0),
        ]
        if local:
            sections.append((f".nv.local.{name}", 8, local, 0))
    return elf([(".nv.info", 0x70000000, info, 0), *sections], flags=0x06000002 | sm << 8)


PTX = b"//\n// Generated by NVIDIA NVVM Compiler\n//\n\n.version 9.0\n.target sm_80\n.address_size 64\n" + b"".join(
    b".visible .entry flashmla_perm_%s(\n.param .align 8 .b8 p[600]\n)\n{\nret;\n}\n" % k.encode() for k in KERNELS
)


def blob(tmp_path, *parts):
    host = b"\x7fELF\x02\x01\x01" + bytes(11) + struct.pack("<H", 62) + bytes(45)  # an x86-64 header: no cubin
    path = tmp_path / "_C.fake.so"
    path.write_bytes(host + b"".join(p + bytes(-len(p) % 64) for p in parts))
    return path


def test_nv_info_records():
    data = bytes([1, 0x50, 0, 0]) + hval(0x4C, 1, fmt=2) + hval(0x1B, 0x38) + svals(0x17, b"abcdefghijkl")
    assert images.nv_info(data) == [(0x50, 0), (0x4C, 1), (0x1B, 0x38), (0x17, b"abcdefghijkl")]
    # The block ends at its last parameter, whichever order the records come in.
    assert images.kparam_bytes(images.nv_info(kparam(2, 0x58, 2) + kparam(1, 0x50, 8) + kparam(0, 0, 0x50))) == 90
    assert images.kparam_bytes(images.nv_info(kparam(0, 0, 0x2B8))) == 0x2B8
    assert images.kparam_bytes([]) == 0


def test_cubin_arch_from_each_abi():
    # e_flags of NVRTC 12.8's and 13.0's cubins: ABI 7 keeps the SM in the low byte, ABI 8 in bits 8..15.
    assert images.cubin_arch(elf([], flags=0x005A055A, abi=7)) == "sm_90"
    assert images.cubin_arch(elf([], flags=0x005A0D5A, abi=7)) == "sm_90a"
    assert images.cubin_arch(elf([], flags=0x06006402)) == "sm_100"
    assert images.cubin_arch(elf([], flags=0x0600640A)) == "sm_100a"
    assert images.cubin_arch(elf([], flags=0x06006702)) == "sm_103"
    compat = [(".nv.compat", 0x70000086, hval(images.ACCELERATOR_TARGET, 1, fmt=2), 0)]
    assert images.cubin_arch(elf(compat, flags=0x06005A04)) == "sm_90a"  # CUDA 13 marks 'a' there


def test_cubin_kernels_figures():
    figures = {"rows": (80, 8, 8, 0), "save_heads": (64, 0, 0, 16)}
    got = images.cubin_kernels(fake_cubin(100, figures))
    assert got["rows"] == {
        "registers": 80, "stack": 8, "frame": 8, "local": 0, "static_smem": 1024, "param_bytes": 600,
    }  # fmt: skip
    assert got["save_heads"]["local"] == 16 and got["save_heads"]["registers"] == 64


def clean(regs=64):
    return {k: (regs, 0, 0, 0) for k in KERNELS}


def test_images_scans_a_module(tmp_path):
    decoy = b"text that is no PTX\n.version 1.0\n"  # a .version but no .target
    path = blob(tmp_path, b"\0" * 100, fake_cubin(90, clean()), decoy + b"\0", fake_cubin(100, clean()), PTX + b"\0")
    # Headers that only look like a cubin's: sections past the end; cut short at the end of the file.
    bogus = bytearray(fake_cubin(90, clean())[:64])
    bogus[0x28:0x30] = struct.pack("<Q", 1 << 40)
    path.write_bytes(path.read_bytes() + bogus + b"\x7fELF\x02\x01\x01\x41\x08")
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


# ---------------------------------------------------------------- the gate


def record(sm, figures, params=None):
    return {"kind": "cubin", "arch": f"sm_{sm}", "kernels": images.cubin_kernels(fake_cubin(sm, figures, params))}


PTX_RECORD = {"kind": "ptx", "arch": "sm_80", "isa": "9.0", "kernels": {k: {} for k in KERNELS}}


def gate(*records):
    return " ".join(images.gate(list(records)))


def test_gate_passes_clean_images():
    assert gate(record(90, clean(100)), record(100, clean(110)), record(103, clean(100)), PTX_RECORD) == ""


@pytest.mark.parametrize(
    "figures, why",
    [
        ({**clean(), "rows": (64, 8, 8, 0)}, "sm_100 rows: 8 bytes stack frame"),
        ({**clean(), "rows": (64, 0, 16, 0)}, "sm_100 rows: 16 bytes stack frame"),
        ({**clean(), "cols_staged": (64, 0, 0, 32)}, "sm_100 cols_staged: 32 bytes local memory"),
        ({**clean(), "save_heads": (71, 0, 0, 0)}, "sm_100 save_heads: 71 registers, over 1.1x sm_90's 64"),
        ({k: v for k, v in clean().items() if k != "cols_direct"}, "sm_100 cubin lacks cols_direct"),
    ],
)
def test_gate_fails(figures, why):
    assert why in gate(record(90, clean()), record(100, figures), PTX_RECORD)


def test_gate_fails_without_ptx_or_cubins():
    assert "no ptx" in gate(record(90, clean()))
    assert "no cubin" in gate(PTX_RECORD)
    assert "sm_80 ptx lacks rows" in gate(record(90, clean()), {**PTX_RECORD, "kernels": {}})


def test_gate_fails_on_parameter_blocks_that_differ():
    assert "rows: parameter blocks differ" in gate(record(90, clean()), record(120, clean(), {"rows": 608}), PTX_RECORD)


def test_gate_compares_registers_only_where_both_are_present():
    assert gate(record(100, clean(200)), PTX_RECORD) == ""


# ---------------------------------------------------------------- a module of real cubins


def ptxas_report(log):
    """{kernel: {frame, registers}} as ptxas -v reports them."""
    out, k = {}, None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            k = images.SHORT.get(m.group(1), m.group(1))
            out[k] = {}
        elif k and (m := re.search(r"(\d+) bytes stack frame", line)):
            out[k]["frame"] = int(m.group(1))
        elif k and (m := re.search(r"Used (\d+) registers", line)):
            out[k]["registers"] = int(m.group(1))
    return out


@pytest.mark.skipif(not tool("nvcc") or not shutil.which("cc"), reason="needs a CUDA toolkit (nvcc) and a C compiler")
def test_a_module_of_real_cubins(tmp_path):
    base = [tool("nvcc"), "-std=c++17", "-O3", f"-I{ROOT / 'csrc'}", str(ROOT / "csrc" / "cuda" / "kernels.cu")]
    jobs = {"sm_90": ["-cubin", "-arch=sm_90", "-Xptxas=-v"], "sm_100": ["-cubin", "-arch=sm_100", "-Xptxas=-v"]}
    jobs["ptx"] = ["-ptx", "-arch=compute_80"]
    run = lambda a: subprocess.run([*base, *jobs[a], "-o", str(tmp_path / a)], capture_output=True, text=True)
    with ThreadPoolExecutor(3) as pool:
        done = dict(zip(jobs, pool.map(run, jobs)))
    if any(d.returncode for d in done.values()):
        pytest.skip(f"this nvcc cannot build the kernels: {[d.stderr[-300:] for d in done.values() if d.returncode]}")
    (tmp_path / "ptx").write_bytes((tmp_path / "ptx").read_bytes() + b"\0")  # as the module holds it
    asm = "".join(
        f'asm(".section .rodata\\n.balign 64\\nimg{i}:\\n.incbin \\"{tmp_path / a}\\"\\n.previous\\n");\n'
        for i, a in enumerate(jobs)
    )
    (tmp_path / "m.c").write_text(asm)
    module = tmp_path / "_C.test.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(tmp_path / "m.c"), "-o", str(module)], check=True)
    records = images.images(module)
    assert [(r["kind"], r["arch"]) for r in records] == [("cubin", "sm_90"), ("cubin", "sm_100"), ("ptx", "sm_80")]
    for r in records:
        assert sorted(r["kernels"]) == sorted(KERNELS), r["arch"]
    for k in KERNELS:
        assert records[0]["kernels"][k]["param_bytes"] == records[1]["kernels"][k]["param_bytes"] > 0
    # Registers and stack frame as ptxas reported them.
    for r in records[:2]:
        mine = {k: {"frame": f["frame"], "registers": f["registers"]} for k, f in r["kernels"].items()}
        assert mine == ptxas_report(done[r["arch"]].stderr + done[r["arch"]].stdout), r["arch"]
