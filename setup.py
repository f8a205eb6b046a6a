"""Build flashmla_perm._C with torch.utils.cpp_extension (ninja).

Switches (environment):
  FLASHMLA_PERM_CUDA=0/1/nvrtc  the CUDA kernels off / nvcc's / NVRTC's. Default
                           (auto): with a CUDA torch, built by nvcc where a toolkit of
                           torch's major CUDA version is found; else compiled at run
                           time by NVRTC (the module built by the host compiler alone,
                           with the CUDA runtime headers of torch's nvidia packages);
                           a CPU torch gets the CPU-only module. The build says which
                           in one line. =1 stops the build where nvcc cannot build
                           the kernels (no CUDA torch, no toolkit, a toolkit of
                           another major version); =nvrtc builds NVRTC's path even
                           with a toolkit (and, at run time, makes a module built by
                           nvcc launch NVRTC's kernels: tests).
  TORCH_CUDA_ARCH_LIST     architectures; default csrc/build_config.txt's when no GPU is visible
  CUDA_HOME                toolkit root; default: asked of the nvcc on PATH
  FLASHMLA_PERM_SANITIZE   e.g. address,undefined: instrument the host code
                           (scripts/sanitize.sh builds and tests this way)
"""

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def build_config():
    """csrc/build_config.txt: flags shared with CMakeLists.txt."""
    pairs = (
        l.split("=", 1)
        for l in (ROOT / "csrc" / "build_config.txt").read_text().splitlines()
        if "=" in l and not l.lstrip().startswith("#")
    )
    return {k.strip(): v.strip() for k, v in pairs}


CONFIG = build_config()
DEFAULT_ARCHS = CONFIG["default_cuda_archs"]


def find_cuda_home():
    """The toolkit root. The nvcc on PATH may be a wrapper script elsewhere,
    so its own path proves nothing: ask the driver for its TOP directory."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            out = subprocess.run(
                [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                capture_output=True,
                text=True,
                timeout=120,
            )
            top = re.search(r"^#\$ TOP=(.+)$", out.stdout + out.stderr, re.M)
            if top and Path(top.group(1).strip(), "bin", "nvcc").exists():
                return str(Path(top.group(1).strip()).resolve())
        except (OSError, subprocess.SubprocessError):
            pass
    for candidate in ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]:
        if Path(candidate, "bin", "nvcc").exists():
            return candidate
    return None


def nvcc_release(cuda_home):
    """The toolkit's CUDA release ("13.0") as its nvcc reports it, or None."""
    nvcc = Path(cuda_home, "bin", "nvcc")
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+)\.(\d+)", out.stdout)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def cuda_decision(torch, cuda_home):
    """(compiler, reason): compiler "nvcc", "nvrtc" or None (the CPU-only
    module); reason says why CUDA is off, or (NVRTC) why not nvcc, in words
    that also go into build_info()["cuda_off_reason"]. Raises where
    FLASHMLA_PERM_CUDA=1 asks for nvcc's build and it cannot work.
    CMakeLists.txt makes the same decision with the same words, except that
    where setup.py goes to NVRTC it builds the CPU-only module."""
    forced = os.environ.get("FLASHMLA_PERM_CUDA", "")
    if forced == "0":
        return None, "switched off (FLASHMLA_PERM_CUDA=0)"
    if forced not in ("", "1", "nvrtc"):
        raise SystemExit(f"flashmla_perm: FLASHMLA_PERM_CUDA must be 0, 1 or nvrtc, got {forced!r}")
    torch_cuda = torch.version.cuda
    if torch_cuda is None:
        reason = f"torch {torch.__version__} has no CUDA (a CPU-only build of torch)"
        if forced:
            raise SystemExit(
                f"flashmla_perm: FLASHMLA_PERM_CUDA={forced}, but the CUDA kernels cannot be built: {reason}"
            )
        return None, reason
    if forced == "nvrtc":
        return "nvrtc", "FLASHMLA_PERM_CUDA=nvrtc"
    toolkit = nvcc_release(cuda_home) if cuda_home else None
    if cuda_home is None:
        reason = (
            f"no CUDA toolkit found (torch {torch.__version__} is built for CUDA {torch_cuda}):"
            f" set CUDA_HOME to a CUDA {torch_cuda.split('.')[0]}.x toolkit for the CUDA kernels"
        )
    elif toolkit is None:
        reason = f"the nvcc of CUDA_HOME={cuda_home} did not report its CUDA release"
    elif toolkit.split(".")[0] != torch_cuda.split(".")[0]:
        reason = mismatch_reason(torch.__version__, torch_cuda, toolkit, cuda_home)
    else:
        return "nvcc", ""
    if forced == "1":
        # A plain exit: the one line, not a traceback.
        raise SystemExit(f"flashmla_perm: FLASHMLA_PERM_CUDA=1, but the CUDA kernels cannot be built: {reason}")
    return "nvrtc", reason


def cuda_runtime_dirs(torch, cuda_home):
    """(includes, lib) for the NVRTC build's host code: torch's CUDA headers
    need cuda_runtime.h and its crt/ headers, and the module links torch's
    libcudart. The runtime headers and library of torch's major version come
    from torch's nvidia pip packages (nvidia-cuda-runtime, which torch brings)
    or a toolkit of that version. The crt/ headers (host-compiler macros)
    beside them, else from nvidia-cuda-crt (CUDA 13) or nvidia-cuda-nvcc-cu12
    (CUDA 12), else from any toolkit found (a toolkit of another major
    version is no use to nvcc here, but its crt/ headers are). None where the
    runtime or crt/ is missing."""
    major = torch.version.cuda.split(".")[0]
    packages = [Path(p, "nvidia") for p in sys.path if p and Path(p, "nvidia").is_dir()]
    roots = [pkg / sub for pkg in packages for sub in (f"cu{major}", "cuda_runtime")]
    if cuda_home and (nvcc_release(cuda_home) or "").split(".")[0] == major:
        roots.append(Path(cuda_home))
    runtime = next(
        (
            (root / "include", root / lib)
            for root in roots
            for lib in ("lib", "lib64")
            if (root / "include" / "cuda_runtime_api.h").exists() and (root / lib / f"libcudart.so.{major}").exists()
        ),
        None,
    )
    if runtime is None:
        return None
    crt_roots = [runtime[0], *(pkg / sub / "include" for pkg in packages for sub in (f"cu{major}", "cuda_nvcc"))]
    crt_roots += [
        Path(d, "include") for d in [cuda_home, "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))] if d
    ]
    crt = next((r for r in crt_roots if (r / "crt" / "host_defines.h").exists()), None)
    if crt is None:
        return None
    includes = [str(runtime[0])]
    if crt != runtime[0]:
        # crt/ alone (a folder holding a link to it): the rest of that
        # include folder may be another CUDA version's.
        alone = ROOT / "build" / "generated" / "crt_only"
        alone.mkdir(parents=True, exist_ok=True)
        link = alone / "crt"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(crt / "crt")
        includes.append(str(alone))
    return includes, str(runtime[1])


def mismatch_reason(torch_version, torch_cuda, toolkit, cuda_home):
    return (
        f"CUDA toolkit {toolkit} ({cuda_home}) does not match torch {torch_version},"
        f" which is built for CUDA {torch_cuda} (major versions differ) - for the CUDA kernels"
        f" use a CUDA {torch_cuda.split('.')[0]}.x toolkit (set CUDA_HOME) or a torch build"
        f" for CUDA {toolkit.split('.')[0]}"
    )


def c_string(text):
    """Text safe inside a C string literal passed as -D (and through ninja's shell)."""
    return re.sub(r'["\\$`]', "'", text)


def read_sources(with_cuda):
    lines = (ROOT / "csrc" / "sources.txt").read_text().splitlines()
    names = [l.strip() for l in lines if l.strip() and not l.startswith("#")]
    return [f"csrc/{n}" for n in names if with_cuda or not n.endswith(".cu")]


def build_extension():
    cuda_home = find_cuda_home()
    if cuda_home:
        os.environ["CUDA_HOME"] = cuda_home  # before cpp_extension reads it at import
    import torch
    from torch.utils import cpp_extension

    compiler, reason = cuda_decision(torch, cuda_home)
    runtime = None
    if compiler == "nvrtc":
        runtime = cuda_runtime_dirs(torch, cuda_home)
        if runtime is None:
            compiler, reason = (
                None,
                (
                    f"{reason}; and no CUDA {torch.version.cuda.split('.')[0]} runtime headers for NVRTC's build"
                    f" (cuda_runtime_api.h beside torch's libcudart, and crt/host_defines.h: pip install"
                    f" {'nvidia-cuda-nvcc-cu12' if torch.version.cuda.startswith('12') else 'nvidia-cuda-crt'})"
                ),
            )
            if os.environ.get("FLASHMLA_PERM_CUDA") == "nvrtc":  # asked for: stop, as =1 does
                raise SystemExit(
                    f"flashmla_perm: FLASHMLA_PERM_CUDA=nvrtc, but the CUDA kernels cannot be built: {reason}"
                )
    with_cuda = compiler is not None
    off_reason = "" if with_cuda else reason
    torch_version = torch.__version__.split("+")[0]
    macros = [
        ("FLASHMLA_PERM_TORCH_VERSION", f'"{torch_version}"'),
        ("FLASHMLA_PERM_TORCH_BUILD", f'"{c_string(torch.__version__)}"'),
        ("FLASHMLA_PERM_CUDA_OFF_REASON", f'"{c_string(off_reason)}"'),
    ]
    cxx = CONFIG["cxx_flags"].split()
    nvcc = CONFIG["nvcc_flags"].split()
    link = CONFIG["link_flags"].split()
    sanitize = os.environ.get("FLASHMLA_PERM_SANITIZE")
    if sanitize:
        flags = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all", "-g"]
        cxx += flags
        link += flags
    gen = ROOT / "build" / "generated"
    if with_cuda:
        # The kernels' source, embedded for NVRTC (both CUDA builds have it).
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "embed_kernel_sources.py"), str(gen / "nvrtc_sources.h")],
            check=True,
        )
    include_dirs, library_dirs = [str(gen)], []
    if compiler == "nvrtc":
        major = torch.version.cuda.split(".")[0]
        include_dirs += runtime[0]
        library_dirs.append(runtime[1])
        link += [f"-l:libcudart.so.{major}", "-lc10_cuda", f"-Wl,-rpath,{runtime[1]}"]
        macros += [
            ("FLASHMLA_PERM_WITH_CUDA", None),
            ("FLASHMLA_PERM_CUDA_ARCHS", '""'),
        ]  # each device's own, at first use
        ext = cpp_extension.CppExtension
    elif with_cuda:
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            # torch's own detection needs a visible GPU.
            os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCHS
        archs = os.environ.get("TORCH_CUDA_ARCH_LIST") or ";".join(
            f"{major}.{minor}"
            for major, minor in {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        )
        macros += [
            ("FLASHMLA_PERM_WITH_CUDA", None),
            ("FLASHMLA_PERM_NVCC_KERNELS", None),
            ("FLASHMLA_PERM_CUDA_ARCHS", f'"{archs}"'),
        ]
        ext = cpp_extension.CUDAExtension
    else:
        ext = cpp_extension.CppExtension
    if set(sys.argv[1:]) & {"egg_info", "dist_info"}:
        pass  # pip asks for the metadata first: say it once, when building
    elif compiler == "nvrtc":
        print(
            f"flashmla_perm: CUDA kernels on, compiled at first use by NVRTC (torch {torch.__version__},"
            f" CUDA headers {' '.join(runtime[0])}): no nvcc build: {reason}"
        )
    elif with_cuda:
        print(f"flashmla_perm: CUDA kernels on, built by nvcc (torch {torch.__version__}, CUDA_HOME={cuda_home})")
    else:
        print(f"flashmla_perm: CUDA kernels off, building the CPU-only module: {off_reason}")
    extension = ext(
        "flashmla_perm._C",
        read_sources(compiler == "nvcc"),
        define_macros=macros,
        include_dirs=include_dirs,
        library_dirs=library_dirs,
        extra_compile_args={"cxx": cxx, "nvcc": nvcc} if compiler == "nvcc" else {"cxx": cxx},
        extra_link_args=link,
    )
    return [extension], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = build_extension()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
