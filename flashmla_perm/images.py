"""The CUDA images embedded in the native module, read from its bytes: what
users get, whatever the build log said.

    python -m flashmla_perm.images [--gate] [--json FILE] [PATH]

PATH is the module (or a cubin); default the installed package's _C*.so. It
prints, per cubin, each kernel's registers, stack, local memory, static
shared memory and parameter bytes, and each PTX image's ISA and target.
``--gate`` exits 1 unless there is a cubin and a PTX image, every image has
the four kernels, none has a stack frame or local memory, sm_100/sm_103 take
at most 1.1x sm_90's registers, and each kernel's parameter block is one size
on every architecture. Standard library only: CI runs it without a GPU.
"""

import argparse
import json
import re
import struct
import sys
from pathlib import Path

SHORT = {  # csrc/cuda/kernels.cu's extern "C" names
    "flashmla_perm_rows": "rows",
    "flashmla_perm_save_heads": "save_heads",
    "flashmla_perm_cols_staged": "cols_staged",
    "flashmla_perm_cols_direct": "cols_direct",
}
SM100_OVER_SM90 = 1.1  # most registers sm_100 (and sm_103) may take, over sm_90's
# .nv.info attributes (their names as cuobjdump -elf prints them).
FRAME_SIZE, MIN_STACK_SIZE, KPARAM_INFO, CRS_STACK_SIZE, REGCOUNT = 0x11, 0x12, 0x17, 0x1E, 0x2F
ACCELERATOR_TARGET = 0x09  # in .nv.compat: CUDA 13's mark of an sm_XYa cubin


def module_path():
    """The installed package's native module (the _C*.so beside this file)."""
    found = sorted(Path(__file__).resolve().parent.glob("_C*.so"))
    if not found:
        raise FileNotFoundError(f"no native module (_C*.so) in {Path(__file__).resolve().parent}: not built?")
    return found[0]


def u32s(v, n):
    """The first n u32 of a record's payload; zeros where it has fewer."""
    return struct.unpack_from(f"<{n}I", v) if isinstance(v, bytes) and len(v) >= 4 * n else (0,) * n


def nv_info(data):
    """An .nv.info section's records as (attribute, value or payload bytes).
    Each record: u8 format, u8 attribute, u16; format 4 (EIFMT_SVAL) has that
    many bytes of payload after it, formats 2 and 3 (BVAL, HVAL) hold the value
    in the u16, format 1 (NVAL) nothing."""
    out, p = [], 0
    while p + 4 <= len(data):
        fmt, attr, value = struct.unpack_from("<BBH", data, p)
        p += 4
        if fmt == 4:
            out.append((attr, bytes(data[p : p + value])))
            p += value
        else:
            out.append((attr, value))
    return out


def kparam_bytes(records):
    """The parameter block's size: the end of its last parameter. KPARAM_INFO:
    u32 index, u16 ordinal, u16 offset, u32 whose bits 18..31 are the size."""
    ends = [(u32s(v, 2)[1] >> 16) + ((u32s(v, 3)[2] >> 18) & 0x3FFF) for a, v in records if a == KPARAM_INFO]
    return max(ends, default=0)


def _sections(data):
    """{name: (type, offset, size, info)} of an ELF64's section headers."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    name = lambda o: data[strtab + o : data.index(b"\0", strtab + o)].decode()
    return {name(h[0]): (h[1], h[4], h[5], h[7]) for h in heads}


def cubin_arch(data):
    """sm_XY[a] from the header. ABI version 7 (CUDA 12's sm_90 and older):
    e_flags' low byte is the SM, 0x800 marks sm_XYa. Version 8 (CUDA 12.8+'s
    sm_100+, all of CUDA 13's): bits 8..15 are the SM; 0x8 marks sm_XYa in
    CUDA 12, .nv.compat's ACCELERATOR_TARGET in CUDA 13. (sm_XYf leaves no
    mark: cuobjdump calls it sm_XY too.)"""
    (flags,) = struct.unpack_from("<I", data, 0x30)
    if data[8] < 8:
        return f"sm_{flags & 0xFF}" + ("a" if flags & 0x800 else "")
    accel = bool(flags & 0x8)
    compat = _sections(data).get(".nv.compat")
    if compat:
        accel |= dict(nv_info(data[compat[1] : compat[1] + compat[2]])).get(ACCELERATOR_TARGET) == 1
    return f"sm_{(flags >> 8) & 0xFF}" + ("a" if accel else "")


def cubin_kernels(data):
    """{kernel: {registers, stack, frame, local, static_smem, param_bytes}}
    of one cubin. Its entry kernels are those with an .nv.info.<name> section;
    .text.<name>'s sh_info is the kernel's symbol index, by which .nv.info's
    REGCOUNT, FRAME_SIZE and MIN_STACK_SIZE records name it. (sh_info's top
    byte, the registers in old toolkits' cubins, is 0 in CUDA 12.8's and 13's.)"""
    secs = _sections(data)
    body = lambda n: data[secs[n][1] : secs[n][1] + secs[n][2]] if n in secs else b""
    size = lambda n: secs.get(n, (0, 0, 0))[2]
    per_symbol = {}
    for attr, v in nv_info(body(".nv.info")):
        symbol, value = u32s(v, 2)
        per_symbol.setdefault(symbol, {})[attr] = value
    out = {}
    for name in (n[len(".nv.info.") :] for n in secs if n.startswith(".nv.info.")):
        info = nv_info(body(f".nv.info.{name}"))
        sh_info = secs.get(f".text.{name}", (0, 0, 0, 0))[3]
        of = per_symbol.get(sh_info & 0xFFFFFF, {})
        crs = [u32s(v, 1)[0] for a, v in info if a == CRS_STACK_SIZE]
        out[SHORT.get(name, name)] = {
            "registers": of.get(REGCOUNT, sh_info >> 24),
            "stack": max([of.get(MIN_STACK_SIZE, 0), *crs]),  # cuobjdump's STACK
            "frame": of.get(FRAME_SIZE, 0),  # ptxas's "bytes stack frame"
            "local": size(f".nv.local.{name}"),  # cuobjdump's LOCAL
            "static_smem": size(f".nv.shared.{name}"),  # cuobjdump's SHARED
            "param_bytes": kparam_bytes(info),
        }
    return out


def _elf_end(data, at):
    """The length of the CUDA ELF (ELF64, e_machine 190) at `at`, or 0: where its
    section header table, sections or program headers end, whichever last."""
    if at + 64 > len(data) or data[at + 4 : at + 6] != b"\x02\x01" or data[at + 18 : at + 20] != b"\xbe\0":
        return 0
    phoff, shoff = struct.unpack_from("<QQ", data, at + 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, at + 0x36)
    end = max(shoff + shnum * shentsize, phoff + phnum * phentsize)
    if not shnum or shentsize != 64 or phnum and phentsize != 56 or at + end > len(data):
        return 0
    for i in range(shnum):
        kind, offset, size = struct.unpack_from("<4xI16xQQ", data, at + shoff + i * shentsize)
        end = max(end, offset + (size if kind != 8 else 0))  # 8: SHT_NOBITS, no bytes in the file
    for i in range(phnum):
        offset, _, _, filesz = struct.unpack_from("<QQQQ", data, at + phoff + i * phentsize + 8)
        end = max(end, offset + filesz)
    return end if at + end <= len(data) else 0


PTX_VERSION = re.compile(rb"^\.version (\d+\.\d+)\s*$", re.M)
PTX_TARGET = re.compile(rb"^\.target (\w+)", re.M)
PTX_ENTRY = re.compile(rb"\.entry\s+(\w+)\s*\(")


def images(path):
    """Every cubin and PTX image in the file at `path`, as records: kind,
    arch, offset, size, kernels ({short name: figures}; a PTX image's
    kernels name only its entries), and a PTX image's isa."""
    data, out, taken, at = Path(path).read_bytes(), [], [], 0
    while (at := data.find(b"\x7fELF", at)) >= 0:
        size = _elf_end(data, at)
        cubin = data[at : at + size]
        try:  # bytes that only look like a CUDA ELF's header are no cubin
            kernels = cubin_kernels(cubin) if size else None
        except (struct.error, ValueError, IndexError):
            kernels = None
        if kernels is not None:
            out.append({"kind": "cubin", "arch": cubin_arch(cubin), "offset": at, "size": size, "kernels": kernels})
            taken.append((at, at + size))
        at += size if kernels is not None else 1
    # A PTX image: a NUL-terminated text (after a NUL or a cubin) with a `.version` line and a `.target`.
    for m in PTX_VERSION.finditer(data):
        if any(a <= m.start() < b for a, b in taken):
            continue
        start = max([data.rfind(b"\0", 0, m.start()) + 1, *(b for a, b in taken if b <= m.start())])
        end = data.find(b"\0", m.end())
        text = data[start : end if end >= 0 else len(data)]
        if (target := PTX_TARGET.search(text)) and all(r["offset"] != start for r in out):
            kernels = {SHORT.get(n, n): {} for n in (e.decode() for e in PTX_ENTRY.findall(text))}
            isa, arch = m.group(1).decode(), target.group(1).decode()
            out.append(
                {"kind": "ptx", "arch": arch, "isa": isa, "offset": start, "size": len(text), "kernels": kernels}
            )
    return out


def gate(records):
    """What fails in `records` (images()'s), in words; empty where all is well."""
    cubins = [r for r in records if r["kind"] == "cubin"]
    fails = [f"no {k}" for k in ("cubin", "ptx") if not any(r["kind"] == k for r in records)]
    for r in records:
        missing = [k for k in SHORT.values() if k not in r["kernels"]]
        if missing:
            fails.append(f"{r['arch']} {r['kind']} lacks {', '.join(missing)}")
    for r in cubins:
        for k, f in r["kernels"].items():
            if f["stack"] or f["frame"]:
                fails.append(f"{r['arch']} {k}: {max(f['stack'], f['frame'])} bytes stack frame")
            if f["local"]:
                fails.append(f"{r['arch']} {k}: {f['local']} bytes local memory")
    sm = lambda r: int(re.sub(r"\D", "", r["arch"]))
    base = {k: f["registers"] for r in cubins if sm(r) == 90 for k, f in r["kernels"].items()}
    for r in (r for r in cubins if sm(r) in (100, 103)):
        for k, f in r["kernels"].items():
            if k in base and f["registers"] > SM100_OVER_SM90 * base[k] + 1e-9:  # 88 of 80 is within
                fails.append(f"{r['arch']} {k}: {f['registers']} registers, over 1.1x sm_90's {base[k]}")
    for k in sorted({k for r in cubins for k in r["kernels"]}):
        sizes = {r["arch"]: r["kernels"][k]["param_bytes"] for r in cubins if k in r["kernels"]}
        if len(set(sizes.values())) > 1:
            fails.append(f"{k}: parameter blocks differ: {sizes}")
    return fails


def table(records):
    cols = ("registers", "stack", "local", "static_smem", "param_bytes")
    lines = [f"{'arch':8} {'kernel':12} " + " ".join(f"{c:>11}" for c in cols)]
    for r in records:
        if r["kind"] == "ptx":
            lines.append(f"{'PTX':8} .version {r['isa']}, .target {r['arch']}, {r['size']} bytes at {r['offset']:#x}")
            continue
        for k, f in sorted(r["kernels"].items()):
            lines.append(f"{r['arch']:8} {k:12} " + " ".join(f"{f[c]:>11}" for c in cols))
    return "\n".join(lines if records else ["no CUDA images (a CPU-only build, or kernels compiled at first use)"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", help="the module or a cubin (default: the installed _C*.so)")
    ap.add_argument("--gate", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    try:
        path = Path(args.path) if args.path else module_path()
        records = images(path)
    except OSError as e:
        sys.exit(f"flashmla_perm.images: {e}")
    print(f"{path}:\n{table(records)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"path": str(path), "images": records}, indent=1) + "\n")
    if args.gate:
        fails = gate(records)
        if fails:
            sys.exit(f"image gate FAILED: {'; '.join(fails)} (see: python -m flashmla_perm.images {path})")
        cubins = [r["arch"] for r in records if r["kind"] == "cubin"]
        ptx = ", ".join(f"{r['arch']} (ISA {r['isa']})" for r in records if r["kind"] == "ptx")
        sms = {int(re.sub(r"\D", "", a)) for a in cubins}
        both = 90 in sms and sms & {100, 103}
        regs = "sm_100 within 1.1x sm_90's registers" if both else "no sm_90/sm_100 pair to compare registers"
        print(
            f"image gate passed: {len(cubins)} cubins ({', '.join(cubins)}), PTX for {ptx}, no stack, "
            f"no local memory, {regs}"
        )


if __name__ == "__main__":
    main()
