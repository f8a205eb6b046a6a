"""Which kernel image this machine's GPUs will load, as a host program (the
vLLM plugin) sees them before any CUDA call: the GPUs' architectures come
from NVML, which starts no CUDA context, so that a process may still fork."""

import ctypes
import functools


@functools.lru_cache(maxsize=1)
def gpu_archs():
    """The GPUs' architectures ("sm_90"), by NVML, asked once a process; ()
    where there is none. Every GPU of the machine, CUDA_VISIBLE_DEVICES aside."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return ()
    if nvml.nvmlInit_v2() != 0:
        return ()
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return ()
        archs = set()
        for i in range(count.value):
            handle, major, minor = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) == 0 and (
                nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) == 0
            ):
                archs.add(f"sm_{major.value}{minor.value}")
        return tuple(sorted(archs))
    finally:
        nvml.nvmlShutdown()


def image_for(arch, cubins, ptx):
    """The image a GPU of `arch` loads, as csrc/cuda/kernels.cpp picks it: the
    newest cubin of its major at or below its minor, else the PTX."""

    def numbers(a):
        return int(a[3:-1]), int(a[-1])

    major, minor = numbers(arch)
    family = [c for c in cubins if numbers(c)[0] == major and numbers(c)[1] <= minor]
    if family:
        return f"{max(family, key=numbers)} cubin"
    return f"{ptx} PTX" if ptx else "none (torch's gather)"
