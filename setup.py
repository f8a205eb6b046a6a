"""Build flashmla_perm._C with torch.utils.cpp_extension (ninja).

Switches (environment):
  FLASHMLA_PERM_CUDA=0/1   force the CUDA kernels off / on. Default (auto): on when
                           the installed torch has CUDA and a toolkit of the same
                           major CUDA version is found; otherwise the CPU-only
                           module, with one line saying why. =1 stops the build
                           where CUDA cannot work (no CUDA torch, no toolkit, a
                           toolkit of another major version).
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
    pairs = (l.split("=", 1) for l in (ROOT / "csrc" / "build_config.txt").read_text().splitlines()
             if "=" in l and not l.lstrip().startswith("#"))
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
                capture_output=True, text=True, timeout=120,
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
    """(with_cuda, reason): reason says why CUDA is off ("" when it is on), in
    words that also go into build_info()["cuda_off_reason"]. Raises where
    FLASHMLA_PERM_CUDA=1 asks for CUDA that cannot work. CMakeLists.txt makes
    the same decision with the same words."""
    forced = os.environ.get("FLASHMLA_PERM_CUDA", "")
    if forced == "0":
        return False, "switched off (FLASHMLA_PERM_CUDA=0)"
    torch_cuda = torch.version.cuda
    toolkit = nvcc_release(cuda_home) if cuda_home else None
    if torch_cuda is None:
        reason = f"torch {torch.__version__} has no CUDA (a CPU-only build of torch)"
    elif cuda_home is None:
        reason = (f"no CUDA toolkit found (torch {torch.__version__} is built for CUDA {torch_cuda}):"
                  f" set CUDA_HOME to a CUDA {torch_cuda.split('.')[0]}.x toolkit for the CUDA kernels")
    elif toolkit is None:
        reason = f"the nvcc of CUDA_HOME={cuda_home} did not report its CUDA release"
    elif toolkit.split(".")[0] != torch_cuda.split(".")[0]:
        reason = mismatch_reason(torch.__version__, torch_cuda, toolkit, cuda_home)
    else:
        return True, ""
    if forced == "1":
        # A plain exit: the one line, not a traceback.
        raise SystemExit(f"flashmla_perm: FLASHMLA_PERM_CUDA=1, but the CUDA kernels cannot be built: {reason}")
    return False, reason


def mismatch_reason(torch_version, torch_cuda, toolkit, cuda_home):
    return (f"CUDA toolkit {toolkit} ({cuda_home}) does not match torch {torch_version},"
            f" which is built for CUDA {torch_cuda} (major versions differ) - for the CUDA kernels"
            f" use a CUDA {torch_cuda.split('.')[0]}.x toolkit (set CUDA_HOME) or a torch build"
            f" for CUDA {toolkit.split('.')[0]}")


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

    with_cuda, off_reason = cuda_decision(torch, cuda_home)
    torch_version = torch.__version__.split("+")[0]
    macros = [("FLASHMLA_PERM_TORCH_VERSION", f'"{torch_version}"'),
              ("FLASHMLA_PERM_TORCH_BUILD", f'"{c_string(torch.__version__)}"'),
              ("FLASHMLA_PERM_CUDA_OFF_REASON", f'"{c_string(off_reason)}"')]
    cxx = CONFIG["cxx_flags"].split()
    nvcc = CONFIG["nvcc_flags"].split()
    link = CONFIG["link_flags"].split()
    sanitize = os.environ.get("FLASHMLA_PERM_SANITIZE")
    if sanitize:
        flags = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all", "-g"]
        cxx += flags
        link += flags
    if with_cuda:
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            # torch's own detection needs a visible GPU.
            os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCHS
        archs = os.environ.get("TORCH_CUDA_ARCH_LIST") or ";".join(
            f"{major}.{minor}" for major, minor in
            {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        )
        macros += [("FLASHMLA_PERM_WITH_CUDA", None), ("FLASHMLA_PERM_CUDA_ARCHS", f'"{archs}"')]
        ext = cpp_extension.CUDAExtension
    else:
        ext = cpp_extension.CppExtension
    if set(sys.argv[1:]) & {"egg_info", "dist_info"}:
        pass  # pip asks for the metadata first: say it once, when building
    elif with_cuda:
        print(f"flashmla_perm: CUDA kernels on (torch {torch.__version__}, CUDA_HOME={cuda_home})")
    else:
        print(f"flashmla_perm: CUDA kernels off, building the CPU-only module: {off_reason}")
    extension = ext(
        "flashmla_perm._C",
        read_sources(with_cuda),
        define_macros=macros,
        extra_compile_args={"cxx": cxx, "nvcc": nvcc} if with_cuda else {"cxx": cxx},
        extra_link_args=link,
    )
    return [extension], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = build_extension()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
