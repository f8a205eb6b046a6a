"""The host side of a GPU call, on a machine without one: the module's real
driver code opens the stand-in libcuda.so.1 (tests/stub_cuda) by name, which
checks and records every call. Shown through it: which image each GPU loads
(its family's cubin, else the PTX, else torch's gather, with nothing left
loaded), every launch's parameter block against its kernel's own records,
shared memory within what each kernel allows, the caller's context put
back, and that registering the vLLM plugin calls nothing at all."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import stub_cuda
from conftest import LAUNCH_CASES

import flashmla_perm
from flashmla_perm import _kernels
from test_kernels import child_env

INFO = flashmla_perm.build_info()
pytestmark = [
    pytest.mark.skipif(not INFO["cuda"], reason="the module has no CUDA side (a CPU torch)"),
    pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler for the stand-in driver"),
]


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    return stub_cuda.build(tmp_path_factory.mktemp("stub_cuda"))


def run(stub, tmp_path, code, **settings):
    """`code` in a child process on the stand-in driver; (its stdout's last
    line as JSON, the driver calls it made)."""
    log = tmp_path / "driver.log"
    log.unlink(missing_ok=True)
    env = stub_cuda.env(stub, log, base=child_env(), **settings)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), stub_cuda.read_log(log)


LOAD = """
    import json
    from flashmla_perm import _ops
    print(json.dumps(_ops._C.load_kernels(0)))
    """


def loads(calls):
    """The images cuModuleLoadData was given, and whether each loaded."""
    return [
        (f.get("arch") or f"{f['kind']} {f.get('target')}", result == 0)
        for name, f, result in calls
        if name == "cuModuleLoadData"
    ]


GPUS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]


@pytest.mark.parametrize("gpu", GPUS)
def test_each_gpu_loads_its_familys_cubin_else_the_ptx(stub, tmp_path, gpu):
    image = _kernels.image_for(gpu, INFO["cuda_archs"], INFO["cuda_ptx"])
    origin, calls = run(stub, tmp_path, LOAD, arch=gpu[3:])
    assert origin == f"{image} built at install by {INFO['cuda_compiler']}", origin
    # What the driver was given, by its own reading of the image: one load.
    want = image.split()[0] if image.endswith("cubin") else "ptx sm_80"
    assert loads(calls) == [(want, True)], calls
    got = {f["name"]: f for name, f, result in calls if name == "cuModuleGetFunction" and result == 0}
    assert sorted(got) == sorted(f"flashmla_perm_{k}" for k in ("rows", "save_heads", "cols_staged", "cols_direct"))


def test_a_refused_cubin_falls_back_to_the_ptx(stub, tmp_path):
    origin, calls = run(stub, tmp_path, LOAD, arch=90, refuse="cubin")
    assert origin.startswith("compute_80 PTX built at install"), origin
    assert loads(calls) == [("sm_90", False), ("ptx sm_80", True)], calls


def test_a_gpu_that_takes_no_image_gets_torchs_gather_with_nothing_loaded(stub, tmp_path):
    code = """
        import json
        from flashmla_perm import _ops
        said = _ops._C.load_kernels(0)
        try:
            _ops._C.cuda_driver_launches("wo_a", [1024, 4096, 8], 0)
            said = "launched"
        except RuntimeError as e:
            said += " | " + str(e)
        print(json.dumps([said, _ops._C.device_kernels()]))
        """
    (said, devices), calls = run(stub, tmp_path, code, arch=90, refuse="all")
    assert said.startswith("torch's gather: no kernels load on this sm_90 GPU (sm_90 cubin: the driver refused"), said
    assert "compute_80 PTX: the driver refused" in said and said.endswith(said.split(" | ")[0]), said
    assert devices == {"0": said.split(" | ")[0]}, devices  # (JSON: the index as text)
    assert [ok for _, ok in loads(calls)] == [False, False], calls
    assert not [c for c in calls if c[0] in ("cuModuleGetFunction", "cuLaunchKernel")], calls


LAUNCH = """
    import ctypes, json
    from flashmla_perm import _ops
    cases = json.loads(%r)
    launches = [l for op, dims in cases for l in _ops._C.cuda_driver_launches(op, dims, 0)]
    driver = ctypes.CDLL("libcuda.so.1")
    current = ctypes.c_void_p(1)
    driver.cuCtxGetCurrent(ctypes.byref(current))
    print(json.dumps([len(launches), current.value]))
    """


@pytest.mark.parametrize("gpu", ["sm_90", "sm_100", "sm_110", "sm_120"])
def test_every_launch_passes_the_block_its_kernel_declares_within_its_shared_memory(stub, tmp_path, gpu):
    """Every model op's launches, planned with the stand-in GPU's figures and
    the loaded kernels' registers: each block of the size the image's own
    parameter records give (the driver refuses another), each within the
    kernel's dynamic shared memory, and no context left current that the
    caller did not have."""
    (count, current), calls = run(stub, tmp_path, LAUNCH % json.dumps(LAUNCH_CASES), arch=gpu[3:])
    launched = [(f, r) for name, f, r in calls if name == "cuLaunchKernel"]
    assert count == len(launched) >= len(LAUNCH_CASES), (count, len(launched))
    functions = {f["name"]: f for name, f, r in calls if name == "cuModuleGetFunction" and r == 0}
    for f, result in launched:
        kernel = functions[f["fn"]]
        assert result == 0 and f["via"] == "extra" and f["size"] == kernel["size"], (f, kernel)
        assert f["smem"] + kernel["smem"] <= 48 * 1024, (f, kernel)
    assert current is None  # the caller had none, and has none after
    switched = [f for name, f, r in calls if name == "cuCtxSetCurrent"]
    assert switched and switched[-1]["ctx"] == "none", switched


REGISTER = """
    import json, logging, torch
    import flashmla_perm
    from flashmla_perm import vllm_plugin
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    vllm_plugin.logger.addHandler(handler)
    vllm_plugin.logger.setLevel(logging.INFO)
    vllm_plugin.register()
    flashmla_perm.build_info()
    print(json.dumps([said, vllm_plugin._kernels_text(flashmla_perm.build_info()), torch.cuda.is_initialized()]))
    """


@pytest.mark.parametrize("gpu", ["sm_100", "sm_110"])
def test_registering_the_plugin_calls_nothing_of_cuda(stub, tmp_path, gpu):
    """vLLM forks its workers after registering plugins, and a child forked
    after cuInit cannot use CUDA: importing the package and registering call
    no driver function, whatever the GPU (NVML names it, for the line)."""
    both = f"{stub_cuda.build_nvml(tmp_path / 'nvml', [gpu])}:{stub}"
    (said, words, initialized), calls = run(both, tmp_path, REGISTER, arch=gpu[3:])
    assert calls == [], calls
    assert not initialized and len(said) == 1, said
    image = _kernels.image_for(gpu, INFO["cuda_archs"], INFO["cuda_ptx"])
    assert words.endswith(f"; {gpu}: {image}"), words
    # The control: the same driver in the same setting records a first call.
    origin, calls = run(both, tmp_path, LOAD, arch=gpu[3:])
    assert origin.startswith(image) and calls[0][0] == "cuInit", calls[:1]
