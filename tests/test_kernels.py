"""The CUDA kernels built at install (no GPU needed): what build_info says,
which image each architecture loads, the module's RUNPATH, the driver's
constants against cuda.h, the source NVRTC sees; on a GPU, a first use that
loads an install image (its cubin, and the PTX with FLASHMLA_PERM_PTX=1)
and a first use under capture. The driver path without a GPU:
tests/test_stub_driver.py."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import stub_cuda
import torch

import flashmla_perm
from flashmla_perm import _kernels, _ops

INFO = flashmla_perm.build_info()
CUDA_SIDE = _ops._C is not None and INFO["cuda"]
ROOT = Path(__file__).resolve().parent.parent

needs_cuda_side = pytest.mark.skipif(not CUDA_SIDE, reason="the module has no CUDA side (a CPU torch)")
needs_gpu = pytest.mark.skipif(not (CUDA_SIDE and torch.cuda.is_available()), reason="needs a GPU")


def child_env(env=None):
    """This environment for a child process that imports the package this
    process imported (not, say, an editable install's), with `env` set."""
    full = dict(os.environ)
    full.pop("FLASHMLA_PERM_FORCE_REFERENCE", None)
    here = str(Path(flashmla_perm.__file__).resolve().parent.parent)
    full["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [full.get("PYTHONPATH")])])
    full.update(env or {})
    return full


def run_python(code, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --------------------------------------------------------------------------- built at install


@needs_cuda_side
def test_build_info_names_what_was_built_at_install():
    assert re.fullmatch(r"NVRTC \d+\.\d+", INFO["cuda_compiler"]), INFO
    assert INFO["cuda_compiler"].split()[1].split(".")[0] == torch.version.cuda.split(".")[0]  # torch's own
    assert INFO["cuda_archs"] and all(re.fullmatch(r"sm_\d+", a) for a in INFO["cuda_archs"]), INFO
    assert INFO["cuda_ptx"] == "compute_80", INFO
    assert INFO["devices"] == {} or torch.cuda.is_initialized(), INFO  # nothing loaded before a GPU call


@needs_cuda_side
def test_the_default_build_covers_the_gpus_users_run():
    """sm_80, sm_90, sm_100 and sm_120 (sm_103 where NVRTC has it); a build
    told other architectures (FLASHMLA_PERM_CUDA_ARCHS) has those."""
    if os.environ.get("FLASHMLA_PERM_CUDA_ARCHS"):
        pytest.skip("a build of chosen architectures")
    assert {"sm_80", "sm_90", "sm_100", "sm_120"} <= set(INFO["cuda_archs"]), INFO


def test_each_architecture_takes_its_familys_cubin_else_the_ptx():
    """As the plugin words it (csrc/cuda/kernels.cpp picks the same way:
    tests/test_stub_driver.py holds it to that)."""
    cubins = ["sm_80", "sm_90", "sm_100", "sm_120"]
    for arch, image in [("sm_80", "sm_80 cubin"), ("sm_86", "sm_80 cubin"), ("sm_89", "sm_80 cubin"),
                        ("sm_90", "sm_90 cubin"), ("sm_100", "sm_100 cubin"), ("sm_103", "sm_100 cubin"),
                        ("sm_120", "sm_120 cubin"), ("sm_121", "sm_120 cubin"), ("sm_110", "compute_80 PTX"),
                        ("sm_130", "compute_80 PTX")]:  # fmt: skip
        assert _kernels.image_for(arch, cubins, "compute_80") == image, arch
    assert _kernels.image_for("sm_110", cubins, None) == "none (torch's gather)"


# --------------------------------------------------------------------------- the module itself


@needs_cuda_side
@pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf")
def test_the_module_carries_no_absolute_runpath():
    """A wheel built elsewhere must not point at the build machine's folders."""
    out = subprocess.run(["readelf", "-d", _ops._C.__file__], capture_output=True, text=True, check=True).stdout
    paths = [
        p for line in out.splitlines() if "RUNPATH" in line or "RPATH" in line for p in re.findall(r"\[(.*)\]", line)
    ]
    for entry in ":".join(paths).split(":"):
        assert not entry or entry.startswith("$ORIGIN"), paths
    assert "libcudart" not in out and "libcuda.so" not in out and "libnvrtc" not in out, out  # opened at run time


def cuda_header():
    dirs = [
        Path(torch.__file__).resolve().parent.parent
        / "nvidia"
        / f"cu{(torch.version.cuda or '0').split('.')[0]}"
        / "include"
    ]
    dirs += [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include"), Path("/usr/local/cuda/include")]
    return next((d for d in dirs if (d / "cuda.h").is_file()), None)


@pytest.mark.skipif(shutil.which("c++") is None or not (ROOT / "csrc").is_dir(), reason="no C++ compiler or csrc/")
def test_the_drivers_constants_are_cuda_hs(tmp_path):
    include = cuda_header()
    if include is None:
        pytest.skip("no cuda.h here")
    names = {
        "kMultiprocessorCount": "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
        "kMaxThreadsPerMultiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR",
        "kComputeCapabilityMajor": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
        "kComputeCapabilityMinor": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
        "kMaxSharedMemoryPerMultiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
        "kMaxRegistersPerMultiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR",
        "kMaxBlocksPerMultiprocessor": "CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR",
        "kReservedSharedMemoryPerBlock": "CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK",
        "kNumRegs": "CU_FUNC_ATTRIBUTE_NUM_REGS",
        "kMaxDynamicSharedSizeBytes": "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES",
        "kPreferredSharedMemoryCarveout": "CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT",
        "kCarveoutMaxShared": "CU_SHAREDMEM_CARVEOUT_MAX_SHARED",
        "kCaptureStatusNone": "CU_STREAM_CAPTURE_STATUS_NONE",
        "kLaunchParamEnd": "CU_LAUNCH_PARAM_END_AS_INT",
        "kLaunchParamBufferPointer": "CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT",
        "kLaunchParamBufferSize": "CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT",
        "kCaptureModeRelaxed": "CU_STREAM_CAPTURE_MODE_RELAXED",
        "kErrorCaptureImplicit": "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        "kImageErrors[0]": "CUDA_ERROR_INVALID_IMAGE",
        "kImageErrors[1]": "CUDA_ERROR_NO_BINARY_FOR_GPU",
        "kImageErrors[2]": "CUDA_ERROR_INVALID_PTX",
        "kImageErrors[3]": "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    }
    checks = "\n".join(f'static_assert(flashmla_perm::cuda::{a} == {b}, "{a}");' for a, b in names.items())
    checks += '\nstatic_assert(sizeof(flashmla_perm::cuda::CUdevice) == sizeof(CUdevice), "CUdevice");'
    source = tmp_path / "constants.cpp"
    source.write_text(f'#include <cuda.h>\n#include "cuda/driver.h"\n{checks}\nint main() {{ return 0; }}\n')
    out = subprocess.run(
        ["c++", "-std=c++17", "-fsyntax-only", f"-I{include}", f"-I{ROOT / 'csrc'}", str(source)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr


# --------------------------------------------------------------------------- the source NVRTC sees

CSRC = ROOT / "csrc"


def test_nvrtc_sees_only_the_kernel_sources_and_the_standard_headers_it_is_given():
    """What the kernels' file includes, and what those headers include, is
    one of build_config.txt's kernel_sources or a standard header
    csrc/cuda/build_kernels.py hands NVRTC: a new include in tile_bodies.h
    fails here, not in a CUDA build."""
    if not (CSRC / "cuda" / "build_kernels.py").is_file():
        pytest.skip("no csrc/ beside the tests")
    sys.path.insert(0, str(CSRC / "cuda"))
    try:
        import build_kernels
    finally:
        sys.path.pop(0)
    embedded = build_kernels.SOURCES
    SHIMS = set(build_kernels.SHIMS)
    assert embedded[0] == "cuda/kernels.cu"
    include = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
    seen = set()
    for name in embedded:
        seen |= set(include.findall((CSRC / name).read_text()))
    headers = {Path(n).name for n in embedded[1:]}
    assert seen <= headers | SHIMS, seen - headers - SHIMS


# --------------------------------------------------------------------------- on a GPU

GPU_PRELUDE = """
    import time, torch, flashmla_perm
    from flashmla_perm import _ops
    ops = torch.ops.flashmla_perm
    g = torch.Generator().manual_seed(7)
    t = torch.randint(0, 256, (256, 64), dtype=torch.uint8, generator=g).cuda()
    perm = torch.randperm(256, generator=g)
    before = t.clone()
    torch.cuda.synchronize()
    """


@needs_gpu
@pytest.mark.parametrize("image", ["cubin", "PTX"])
def test_a_first_use_loads_an_install_image_and_permutes(image):
    code = (
        GPU_PRELUDE
        + """
        start = time.perf_counter()
        ops.permute_(t, perm, 0)
        torch.cuda.synchronize()
        print("first call ms", (time.perf_counter() - start) * 1e3)
        assert torch.equal(t, before.index_select(0, perm.cuda()))
        assert _ops._C.path_counts()["cuda"] == 1, _ops._C.path_counts()
        print(flashmla_perm.build_info()["devices"][0])
        """
    )
    out = run_python(code, dict(FLASHMLA_PERM_PTX="1" if image == "PTX" else "0"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f" {image} built at install by NVRTC" in out.stdout, out.stdout


@needs_gpu
def test_a_first_use_under_capture_says_so_and_moves_nothing():
    code = (
        GPU_PRELUDE
        + """
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                ops.permute_(t, perm, 0)
            raise SystemExit("captured without a warm-up")
        except RuntimeError as e:
            assert "capturing a CUDA graph" in str(e) and "warm-up" in str(e), e
        torch.cuda.synchronize()
        assert torch.equal(t, before)
        ops.permute_(t, perm, 0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ops.permute_(t, perm, 0)
        t.copy_(before)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(t, before.index_select(0, perm.cuda()))
        print("ok")
        """
    )
    out = run_python(code)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# --------------------------------------------------------------------------- the GPUs, as the plugin sees them


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_gpus_architectures_come_from_nvml_without_cuda(tmp_path):
    stub_cuda.build_nvml(tmp_path, ["sm_100", "sm_90", "sm_100"])
    code = """
        import torch
        from flashmla_perm import _kernels
        print(_kernels.gpu_archs(), torch.cuda.is_initialized())
        """
    out = run_python(code, dict(LD_LIBRARY_PATH=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "('sm_100', 'sm_90') False", out.stdout  # no CUDA context made
    out = run_python(code)  # no NVML here: nothing, and no error
    assert out.stdout.split("\n")[-2] in ("() False", f"{_kernels.gpu_archs()} False")
