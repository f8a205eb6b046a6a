#!/usr/bin/env python3
"""The CUDA kernels, compiled at install by the NVRTC of the torch being built
against (every CUDA torch wheel brings it): one cubin per architecture, side
by side, and one PTX image for any later GPU, all embedded in the module.
Used by setup.py and CMakeLists.txt.

Writes into OUT_DIR:
  kernel_images.cpp   the images, embedded (.incbin), as csrc/cuda/kernel_images.h declares
  kernels/*           the images themselves, each with the key it was made from

The architectures: FLASHMLA_PERM_CUDA_ARCHS ("9.0;10.0" or "sm_90 sm_100"),
all of which must build; else csrc/build_config.txt's default_cuda_archs,
less those this NVRTC cannot target. (TORCH_CUDA_ARCH_LIST is not read: it
is set for other extensions' builds, in their forms, 9.0a or 10.0f.)

    python csrc/cuda/build_kernels.py OUT_DIR

Prints one line starting "flashmla_perm: kernels" that says what it built.
"""

import ctypes
import hashlib
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1]
# The standard headers the kernels name and NVRTC lacks: what the device code
# uses of them, no more (uint4 and memcpy are NVRTC built-ins).
SHIMS = {
    "cstdint": "#pragma once\n"
    "typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;\n"
    "typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;\n"
    "typedef unsigned long long uint64_t; typedef unsigned long long uintptr_t;\n"
    "namespace std { using ::int8_t; using ::int16_t; using ::int32_t; using ::int64_t; using ::uint8_t;\n"
    "using ::uint16_t; using ::uint32_t; using ::uint64_t; using ::uintptr_t; using ::size_t; }\n",
    "cstring": "#pragma once\nnamespace std { using ::memcpy; using ::memset; }\n",
    "type_traits": "#pragma once\nnamespace std {\n"
    "template <class T, T v> struct integral_constant {\n"
    "  static constexpr T value = v; using value_type = T; using type = integral_constant;\n"
    "  constexpr operator T() const { return v; } };\n}\n",
}
# Unannotated functions are device code (tile_bodies.h's inline helpers, and
# the lambdas, which nvcc takes as device code inside a kernel).
OPTIONS = ["-std=c++17", "-default-device"]
# The PTX image: the oldest architecture built, so that any later GPU runs it.
PTX_TARGET = "compute_80"


def config():
    pairs = (l.split("=", 1) for l in (CSRC / "build_config.txt").read_text().splitlines())
    return {k.strip(): v.strip() for k, v in (p for p in pairs if len(p) == 2) if not k.lstrip().startswith("#")}


SOURCES = config()["kernel_sources"].split()


class Failed(Exception):
    """NVRTC cannot build the kernels here, in words."""


# ---------------------------------------------------------------- NVRTC, through ctypes


def nvrtc_candidates(torch):
    """Where torch's NVRTC is: beside torch (the nvidia pip packages: CUDA 13's
    nvidia/cu13/lib, CUDA 12's nvidia/cuda_nvrtc/lib), else a toolkit's of the
    same major."""
    major = torch.version.cuda.split(".")[0]
    name = f"libnvrtc.so.{major}"
    site = Path(torch.__file__).resolve().parent.parent
    out = [site / "nvidia" / f"cu{major}" / "lib" / name, site / "nvidia" / "cuda_nvrtc" / "lib" / name]
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    out += [Path(h, "lib64", name) for h in homes if h and os.path.isabs(h)]
    return out


class Nvrtc:
    def __init__(self, torch):
        tried = nvrtc_candidates(torch)
        path = next((p for p in tried if p.is_file()), None)
        if path is None:
            package = "nvidia-cuda-nvrtc" + ("-cu12" if torch.version.cuda.startswith("12") else "")
            raise Failed(
                f"no NVRTC of CUDA {torch.version.cuda} (pip install {package}); looked at {', '.join(map(str, tried))}"
            )
        self.lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = f"{major.value}.{minor.value}"
        self.major = major.value
        # NVRTC opens its builtins by name; the pip package's folder is on no
        # search path, so they are loaded first, from beside it.
        builtins = path.with_name(f"libnvrtc-builtins.so.{self.version}")
        if builtins.is_file():
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        stat = path.stat()
        self.identity = f"{path} {stat.st_size} {stat.st_mtime_ns}"  # tells apart releases of one major.minor
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def archs(self):
        n = ctypes.c_int()
        self.lib.nvrtcGetNumSupportedArchs(ctypes.byref(n))
        archs = (ctypes.c_int * n.value)()
        self.lib.nvrtcGetSupportedArchs(archs)
        return set(archs)

    def check(self, result, call):
        if result != 0:
            raise Failed(f"NVRTC {self.version} {call} failed: {self.lib.nvrtcGetErrorString(result).decode()}")

    def compile(self, target):
        """The image for `target` ("sm_90": a cubin; "compute_80": PTX), bytes.
        ctypes lets go of the GIL: targets compile side by side in threads."""
        texts = [(CSRC / n).read_bytes() for n in SOURCES]
        names = [Path(n).name.encode() for n in SOURCES[1:]] + [n.encode() for n in SHIMS]
        headers = texts[1:] + [t.encode() for t in SHIMS.values()]
        strings = lambda items: (ctypes.c_char_p * len(items))(*items)  # noqa: E731
        prog = ctypes.c_void_p()
        self.check(
            self.lib.nvrtcCreateProgram(
                ctypes.byref(prog), texts[0], SOURCES[0].encode(), len(headers), strings(headers), strings(names)
            ),
            "nvrtcCreateProgram",
        )
        try:
            options = [f"--gpu-architecture={target}".encode(), *(o.encode() for o in OPTIONS)]
            result = self.lib.nvrtcCompileProgram(prog, len(options), strings(options))
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, log)
            # Its warnings, located as csrc/ paths, for the build log's gate.
            said = re.sub(r"(?m)^(\S+\(\d+\): )", r"csrc/\1", log.value.decode(errors="replace")).strip()
            if result != 0:
                raise Failed(f"NVRTC {self.version} failed to compile the kernels for {target}:\n{said}")
            if said:
                print(f"NVRTC {self.version}, {target}:\n{said}", flush=True)
            kind = "PTX" if target.startswith("compute_") else "CUBIN"
            self.check(getattr(self.lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)), f"nvrtcGet{kind}Size")
            image = ctypes.create_string_buffer(size.value)
            self.check(getattr(self.lib, f"nvrtcGet{kind}")(prog, image), f"nvrtcGet{kind}")
            return image.raw
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def ptx(self):
        """PTX that every driver of this CUDA major accepts: NVRTC writes its
        own ISA version (9.1 by NVRTC 13.1, say), which an older driver of the
        same major refuses; the kernels use nothing of a later ISA than the
        major's first (CUDA 12.0: ISA 8.0, 13.0: 9.0; tests/test_images.py
        has ptxas assemble it at that version)."""
        text = self.compile(PTX_TARGET).rstrip(b"\0")
        return re.sub(rb"^\.version \d+\.\d+", f".version {self.major - 4}.0".encode(), text, count=1, flags=re.M)


# ---------------------------------------------------------------- architectures and images


def wanted_archs():
    """(archs as integers like 90 and 103, whether all must build)."""
    given = os.environ.get("FLASHMLA_PERM_CUDA_ARCHS", "").strip()
    archs = []
    for item in re.split(r"[;\s,]+", given or config()["default_cuda_archs"]):
        m = re.fullmatch(r"(\d+)\.(\d)|sm_(\d+)", item)
        if item and not m:
            raise SystemExit(f"flashmla_perm: FLASHMLA_PERM_CUDA_ARCHS: cannot read {item!r} (as in '9.0;10.0')")
        if m:
            archs.append(int(m.group(3)) if m.group(3) else int(m.group(1)) * 10 + int(m.group(2)))
    return sorted(set(archs)), bool(given)


def digest(*parts):
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def made(nvrtc, out, target):
    """The image for `target`, compiled unless its file was made from the same
    sources, options and NVRTC (a rebuild of unchanged kernels compiles nothing)."""
    path = out / "kernels" / (f"{target}.cubin" if target.startswith("sm_") else f"{target}.ptx")
    key = digest(*((CSRC / n).read_bytes() for n in SOURCES), *SHIMS.values(), *OPTIONS, nvrtc.identity, target)
    stamp = path.with_name(path.name + ".key")
    if path.exists() and stamp.exists() and stamp.read_text() == key:
        return path
    stamp.unlink(missing_ok=True)
    path.write_bytes(nvrtc.ptx() if target == PTX_TARGET else nvrtc.compile(target))
    stamp.write_text(key)
    return path


def write_images(out, compiler, images):
    """kernel_images.cpp: each image embedded by the assembler (.incbin: no
    source text of megabytes; the PTX gets its NUL), with its size and a hash
    in the text so that a changed image changes the file and rebuilds it."""
    lines = ['#include "cuda/kernel_images.h"', "", "// Generated by csrc/cuda/build_kernels.py.", ""]
    entries = []
    for i, (target, path) in enumerate(images):
        data = path.read_bytes()
        symbol = f"flashmla_perm_kernel_image_{i}"
        nul = "\\n.byte 0" if path.suffix == ".ptx" else ""
        lines += [
            f"// {target}: {len(data)} bytes, hash {hashlib.sha256(data).hexdigest()[:16]}",
            f'asm(".section .rodata\\n.balign 64\\n.globl {symbol}\\n.hidden {symbol}\\n{symbol}:\\n'
            f'.incbin \\"{path.resolve()}\\"{nul}\\n.previous\\n");',
            f'extern "C" __attribute__((visibility("hidden"))) const unsigned char {symbol}[];',
        ]
        entries.append(f'    {{"{target}", {symbol}, {len(data)}}},')
    lines += [
        "",
        "namespace flashmla_perm {",
        "namespace cuda {",
        f'const char kKernelCompiler[] = "{compiler}";',
        "const KernelImage kKernelImages[] = {",
        *entries,
        "};",
        f"const int kNumKernelImages = {len(images)};",
        "}  // namespace cuda",
        "}  // namespace flashmla_perm",
        "",
    ]
    text = "\n".join(lines)
    path = out / "kernel_images.cpp"
    if not path.exists() or path.read_text() != text:  # an unchanged file keeps its time stamp
        path.write_text(text)


def build(out, torch=None):
    """Everything above; returns the one line. Raises Failed, in words."""
    if torch is None:
        import torch
    out = Path(out)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    nvrtc = Nvrtc(torch)
    archs, all_must = wanted_archs()
    supported = nvrtc.archs()
    missing = [a for a in archs if a not in supported]
    if missing and all_must or not set(archs) - set(missing):
        raise Failed(f"NVRTC {nvrtc.version} cannot build sm_{', sm_'.join(map(str, missing))}")
    targets = [f"sm_{a}" for a in archs if a in supported] + [PTX_TARGET]
    with ThreadPoolExecutor(max_workers=max(1, min(len(targets), os.cpu_count() or 1))) as pool:
        paths = list(pool.map(lambda t: made(nvrtc, out, t), targets))
    write_images(out, f"NVRTC {nvrtc.version}", list(zip(targets, paths)))
    skipped = f" (NVRTC {nvrtc.version} has no sm_{', sm_'.join(map(str, missing))})" if missing else ""
    return (
        f"flashmla_perm: kernels built at install by NVRTC {nvrtc.version} for {', '.join(targets[:-1])}"
        f" and PTX for {PTX_TARGET} (ISA {nvrtc.major - 4}.0){skipped} in {time.monotonic() - start:.0f} s"
    )


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)
    try:
        print(build(sys.argv[1]))
    except Failed as e:
        raise SystemExit(f"flashmla_perm: {e}")


if __name__ == "__main__":
    main()
