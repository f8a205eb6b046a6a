"""Build flashmla_perm._C with torch.utils.cpp_extension (ninja).

Switches (environment):
  FLASHMLA_PERM_CUDA=0/1   force the CUDA kernels off / on (default: on when the
                           installed torch has CUDA and nvcc is found)
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


def want_cuda(torch, cuda_home):
    forced = os.environ.get("FLASHMLA_PERM_CUDA")
    possible = torch.version.cuda is not None and cuda_home is not None
    if forced == "0":
        return False
    if forced == "1":
        if not possible:
            raise RuntimeError(
                f"FLASHMLA_PERM_CUDA=1 but torch.version.cuda={torch.version.cuda!r}, "
                f"CUDA toolkit={cuda_home!r}"
            )
        return True
    return possible


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

    with_cuda = want_cuda(torch, cuda_home)
    torch_version = torch.__version__.split("+")[0]
    macros = [("FLASHMLA_PERM_TORCH_VERSION", f'"{torch_version}"')]
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
    print(f"flashmla_perm: CUDA kernels {'on' if with_cuda else 'off'}"
          f" (torch {torch.__version__}, CUDA_HOME={cuda_home})")
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
