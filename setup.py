"""Build flashmla_perm._C with torch.utils.cpp_extension (ninja), by the host
compiler alone: the CUDA side includes no CUDA header (it reaches the device
through the driver API, opened at run time), so a CUDA torch needs nothing
beside it. With a CUDA torch the kernels are compiled by torch's own NVRTC
(csrc/cuda/build_kernels.py: a cubin per architecture and a PTX image) and
embedded in the module; the build says what it built in one line. The
package (a wheel too) then requires the torch release it was built against.

Switches (environment):
  FLASHMLA_PERM_CUDA     unset: the CUDA side where torch has CUDA and its
                         NVRTC is found; 0 (off, false, no): the CPU-only
                         module; 1 (on, true, yes): the CUDA side, or the
                         build stops saying why not.
  FLASHMLA_PERM_CUDA_ARCHS
                         the cubins built ("9.0;10.0"); default
                         csrc/build_config.txt's
  FLASHMLA_PERM_SANITIZE e.g. address,undefined: instrument the host code
                         (scripts/sanitize.sh builds and tests this way)
"""

import importlib.util
import os
import re
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
GENERATED = ROOT / "build" / "generated"


def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KERNELS = load(ROOT / "csrc" / "cuda" / "build_kernels.py")
SWITCHES = load(ROOT / "flashmla_perm" / "_switches.py")


def cuda_kernels(torch):
    """(NVRTC or None, why off); stops the build where the switch asks for
    what cannot be."""
    raw = os.environ.get("FLASHMLA_PERM_CUDA", "")
    try:
        on = SWITCHES.parse("FLASHMLA_PERM_CUDA", raw, None)
    except ValueError as e:
        raise SystemExit(f"flashmla_perm: {e}")
    if on is False:
        return None, "switched off (FLASHMLA_PERM_CUDA=0)"
    try:
        if torch.version.cuda is None:
            raise KERNELS.Failed(f"torch {torch.__version__} has no CUDA (a CPU-only build of torch)")
        return KERNELS.Nvrtc(torch), ""
    except KERNELS.Failed as e:
        if on:
            raise SystemExit(f"flashmla_perm: FLASHMLA_PERM_CUDA={raw}, but the CUDA side cannot be built: {e}")
        return None, str(e)


def without_rpath():
    """Python's own link line may carry -Wl,-rpath,<its lib> (pyenv's does):
    a module built with it, then copied elsewhere in a wheel, would point
    there. The module needs no RUNPATH: torch's libraries are loaded by the
    time it is, and the CUDA side opens what it needs at run time."""
    ldshared = sysconfig.get_config_var("LDSHARED")
    if ldshared and "LDSHARED" not in os.environ:
        os.environ["LDSHARED"] = re.sub(r"\s-Wl,-rpath,\S+", "", ldshared)


def c_string(text):
    """Text safe inside a C string literal passed as -D (and through ninja's shell)."""
    return re.sub(r'["\\$`]', "'", text)


def read_sources(with_cuda):
    lines = (ROOT / "csrc" / "sources.txt").read_text().splitlines()
    names = [l.strip() for l in lines if l.strip() and not l.startswith("#")]
    return [f"csrc/{n}" for n in names if with_cuda or not n.startswith("cuda/")]


def build_extension():
    import torch
    from torch.utils import cpp_extension

    without_rpath()
    nvrtc, off_reason = cuda_kernels(torch)
    with_cuda = nvrtc is not None
    config = KERNELS.config()
    macros = [
        ("FLASHMLA_PERM_TORCH_VERSION", f'"{torch.__version__.split("+")[0]}"'),
        ("FLASHMLA_PERM_TORCH_BUILD", f'"{c_string(torch.__version__)}"'),
        ("FLASHMLA_PERM_CUDA_OFF_REASON", f'"{c_string(off_reason)}"'),
    ]
    cxx = config["cxx_flags"].split()
    link = config["link_flags"].split()
    sanitize = os.environ.get("FLASHMLA_PERM_SANITIZE")
    if sanitize:
        flags = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all", "-g"]
        cxx += flags
        link += flags
    sources = read_sources(with_cuda)
    libraries = []
    if with_cuda:
        macros.append(("FLASHMLA_PERM_WITH_CUDA", None))
        sources.append(str((GENERATED / "kernel_images.cpp").relative_to(ROOT)))
        libraries.append("torch_cuda")  # torch's current CUDA stream, through its C shim
    if set(sys.argv[1:]) & {"egg_info", "dist_info"}:
        pass  # pip asks for the metadata first: say it once, when building
    elif not with_cuda:
        print(f"flashmla_perm: CUDA off, building the CPU-only module: {off_reason}")
    extension = cpp_extension.CppExtension(
        "flashmla_perm._C",
        sources,
        define_macros=macros,
        include_dirs=[str(ROOT / "csrc"), str(GENERATED)],
        libraries=libraries,
        extra_compile_args={"cxx": cxx},
        extra_link_args=link,
    )

    class BuildExt(cpp_extension.BuildExtension.with_options(use_ninja=True)):
        def run(self):
            if with_cuda:  # the kernels first: the module embeds them
                try:
                    print(KERNELS.build(GENERATED, torch), flush=True)
                except KERNELS.Failed as e:
                    raise SystemExit(f"flashmla_perm: {e}")
            super().run()

    # The module runs only beside the torch it was built against (others load
    # the reference path): say so to pip, which then refuses a mismatch.
    return [extension], {"build_ext": BuildExt}, [f"torch=={torch.__version__.split('+')[0]}"]


ext_modules, cmdclass, requires = build_extension()
setup(ext_modules=ext_modules, cmdclass=cmdclass, install_requires=requires)
