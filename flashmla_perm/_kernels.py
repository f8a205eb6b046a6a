"""The CUDA kernels of this machine's GPUs, as a host program (the vLLM
plugin) sees them before any CUDA call: which architectures the GPUs are
(NVML, which starts no CUDA context, so a process may still fork), where
their kernels come from, and a compile started in the background for an
architecture the install did not build, so that the first call finds it done
(docs/design.md, "What a first load sees")."""

import ctypes
import functools
import os
import threading

from . import _ops

_warming = {}  # arch -> the thread compiling its kernels
_fork_hook = []  # registered once a process


@functools.lru_cache(maxsize=1)
def gpu_archs():
    """The GPUs' architectures ("sm_90"), by NVML, asked once a process; []
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


def _join_before_fork():
    # A child forked mid-compile would inherit its locks held, by a thread
    # it does not have: the fork waits for the compile instead.
    for thread in list(_warming.values()):
        thread.join()


def warm_in_background(archs):
    """Starts compiling, in a thread of this process, the kernels of each of
    `archs` that nothing built at install or cached serves; the archs it
    started. A first call on such a GPU waits for that compile (one per
    architecture in a process; one per machine through the cache's lock)."""
    started = []
    for arch in archs:
        if arch in _warming or _ops._C.kernel_origin(arch)["kind"] != "compiled":
            continue
        if not _fork_hook:
            os.register_at_fork(before=_join_before_fork)
            _fork_hook.append(True)
        thread = threading.Thread(target=_prepare, args=(arch,), name=f"flashmla_perm warm {arch}", daemon=True)
        _warming[arch] = thread
        thread.start()
        started.append(arch)
    return started


def warming():
    """The architectures whose kernels a background compile is making."""
    return [arch for arch, thread in _warming.items() if thread.is_alive()]


def _prepare(arch):
    try:
        _ops._C.prepare_kernels(arch)
    except Exception:  # noqa: BLE001 -- the first call will raise it, where someone sees it
        pass


def use_vllm_cache():
    """The kernel cache inside vLLM's, $VLLM_CACHE_ROOT/flashmla_perm, unless
    FLASHMLA_PERM_CACHE_DIR is set: a deployment that keeps vLLM's cache keeps
    ours. What went otherwise, in words for a log line, or ""."""
    if os.environ.get("FLASHMLA_PERM_CACHE_DIR"):
        return ""
    import vllm.envs

    root = vllm.envs.VLLM_CACHE_ROOT
    if not os.path.isabs(root):
        return f"; VLLM_CACHE_ROOT={root} is not an absolute path: kernel cache in {_ops._C.kernel_cache_dir()}"
    _ops._C.set_kernel_cache_root(os.path.join(root, "flashmla_perm"))
    return ""


def describe(archs, compiling=()):
    """Where the kernels of `archs` come from, a few words each:
    "sm_100 built at install by nvcc 13.0.88"."""
    words = []
    for arch in archs:
        origin = _ops._C.kernel_origin(arch)
        if arch in compiling:
            words.append(f"{arch} compiling in the background by NVRTC")
        elif origin["kind"] == "install":
            words.append(f"{arch} {origin['text']}")
        elif origin["kind"] == "cache":
            words.append(f"{arch} compiled by NVRTC, in the cache")
        else:
            words.append(f"{arch} compiled at first use by NVRTC")
    return ", ".join(words)
