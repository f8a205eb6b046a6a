"""The benchmark's copy and baselines (bench/bench_load_time.py): the copy
writes each layer into buffers of its own; the baselines (BASELINES) stream
every byte and change none, in place, into each layer's buffers, or into one
set of buffers every layer reuses. Its `load` kind imports vLLM without the
lines about vLLM's GPU stack, and a real failure there still shows."""

import importlib.metadata
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import bench_load_time as bench  # noqa: E402


@pytest.mark.parametrize(
    "nbytes,dtype", [(4096, torch.int64), (4092, torch.int32), (4094, torch.int16), (4095, torch.uint8)]
)
def test_words_tile_the_storage(nbytes, dtype):
    t = torch.empty(nbytes, dtype=torch.uint8).random_(0, 256)
    w = bench.words(t)
    assert w.dtype == dtype and w.numel() * w.element_size() == nbytes and w.data_ptr() == t.data_ptr()


def test_baselines_stream_the_bytes_and_change_none():
    model = bench.parse_args(["--tp", "8"])
    layer = bench.make_layer(model, "wo_a", 8, "cpu")
    before = [bench.as_bytes(t).clone() for t in layer]
    buffers = [torch.full((bench.tensors_bytes([t]),), 0xA5, dtype=torch.uint8) for t in layer]  # poisoned
    bench.stream_in_place(layer)
    bench.stream_into(lambda _: buffers)(layer)
    for b, t, buf in zip(before, layer, buffers):
        assert torch.equal(bench.as_bytes(t), b) and torch.equal(buf, b)
    names = ["inplace", "outofplace", "copy_1buf"]
    assert bench.available_backends(bench.parse_args(["--backends", ",".join(names)])) == names


@pytest.mark.parametrize("kind", ["wq_b", "wv_packed"])
def test_copy_writes_each_layer_into_buffers_of_its_own(kind, monkeypatch):
    """The copy a load is measured against: each layer's bytes land in
    buffers that no other layer's copy writes (on a GPU, rewrites of one
    buffer would stay in its L2); outofplace the same; copy_1buf into one
    set that every layer reuses."""
    made = []  # every set of per-layer buffers the case makes
    real = bench.layer_buffers
    monkeypatch.setattr(bench, "layer_buffers", lambda layers, device: made.append(real(layers, device)) or made[-1])
    args = bench.parse_args(["--tp", "8"])
    case = bench.make_case(args, kind, 8, "cpu", ["copy_1buf", "outofplace"], 3)
    own, shared = made[0], made[1][id(case.items[0])]
    assert len(made) == 2 and len(own) == 3
    for name in ("copy", "outofplace", "copy_1buf"):
        for bufs in [*own.values(), shared]:  # poisoned again: a byte not written shows
            for b in bufs:
                b.fill_(0xA5)
        for layer in case.items:
            case.fns[name](layer)
            dests = shared if name == "copy_1buf" else own[id(layer)]
            assert all(torch.equal(d, bench.as_bytes(t)) for d, t in zip(dests, layer)), (name, "bytes")
        if name != "copy_1buf":  # every layer's bytes are still there after the pass
            for layer in case.items:
                assert all(torch.equal(d, bench.as_bytes(t)) for d, t in zip(own[id(layer)], layer)), name
    ptrs = [b.data_ptr() for bufs in [*own.values(), shared] for b in bufs]
    assert len(set(ptrs)) == len(ptrs) == 8


def test_the_device_check_asks_for_the_benchmarks_baselines():
    # Two files name them (the device check runs without torch, so it cannot
    # import the benchmark): a baseline added to one alone would be timed
    # and never read, or asked for and never timed.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "device"))
    import check

    assert check.BENCH_BASELINES == bench.BASELINES


BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "bench_load_time.py")


def vllm_033():
    try:
        return importlib.metadata.version("vllm") == "0.33.0"
    except importlib.metadata.PackageNotFoundError:
        return False


needs_vllm = pytest.mark.skipif(not vllm_033(), reason="vLLM 0.33.0 is not installed (FLASHMLA_PERM_WITH_VLLM=0?)")


def run_load_kind(pythonpath=None):
    """The benchmark's load kind, 2 layers, 1 pass, in a fresh process: its
    whole output (stdout and stderr, as a user sees them) and exit status."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}  # a user's level shows everything
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, BENCH, "--kinds", "load", "--layers", "2", "--reps", "1", "--no-memory"]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return out.stdout, out.returncode


def alarms(output):
    """Lines a new user reads as a broken install."""
    return [line for line in output.splitlines() if line.startswith("ERROR") or "Failed to import" in line]


@needs_vllm
def test_load_kind_prints_no_false_alarms():
    """Importing vLLM on a CPU-only machine logs that its compiled ops and
    Triton are missing; loading uses neither, so none of it may show."""
    output, status = run_load_kind()
    assert status == 0, output
    assert alarms(output) == [], output
    assert "Triton not available" not in output, output  # torch's warning, as vLLM imports
    assert "load: vllm = permute_on_load of vllm 0.33.0" in output, output
    backends = ["copy", "vllm"] + (["native"] if bench.flashmla_perm.build_info()["native"] else [])
    for backend in backends:  # the results, as before
        assert any(line.split()[1:4] == ["load", "1", backend] for line in output.splitlines()), (backend, output)


# Breaks vLLM's import of the module the load kind times, as a broken
# install would: vLLM logs an error, then the import raises.
BROKEN_FUSED_LAYOUT = """
import logging, sys

class BrokenFusedLayout:
    def find_spec(self, name, path=None, target=None):
        if name == "vllm.models.deepseek_v41.common.ops.fused_layout":
            logging.getLogger("vllm.models").error("fused_layout: a real error, logged")
            raise {exc}("fused_layout deliberately broken")

sys.meta_path.insert(0, BrokenFusedLayout())
"""


@needs_vllm
@pytest.mark.parametrize("exc", ["ImportError", "RuntimeError"])
def test_load_kind_still_prints_a_real_failure(exc, tmp_path):
    """An ImportError: the load kind falls back to its own equivalent and says
    why. Any other exception stops the benchmark with its traceback. Either
    way, what vLLM logged shows, and the GPU stack's lines still do not."""
    (tmp_path / "sitecustomize.py").write_text(BROKEN_FUSED_LAYOUT.format(exc=exc))
    output, status = run_load_kind(str(tmp_path))
    assert "fused_layout: a real error, logged" in output, output
    if exc == "ImportError":
        assert status == 0, output
        assert "(no vLLM: fused_layout deliberately broken)" in output, output
    else:
        assert status != 0, output
        assert "RuntimeError: fused_layout deliberately broken" in output, output
    assert [line for line in alarms(output) if "Failed to import" in line] == [], output
