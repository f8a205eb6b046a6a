import contextlib

import pytest
import torch

import flashmla_perm
from flashmla_perm import _ops
from flashmla_perm._switches import switch

INFO = flashmla_perm.build_info()
NATIVE = INFO["native"]

DTYPES = [
    torch.uint8,
    torch.int8,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e8m0fnu,
    torch.bfloat16,
    torch.float16,
    torch.float32,
]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_report_header(config):
    return f"flashmla_perm: {INFO}; devices: {DEVICES}"


def pytest_sessionstart(session):
    # CI sets these so that a build that silently fell back fails loudly.
    try:
        expect = {k: switch(f"FLASHMLA_PERM_EXPECT_{k}", False) for k in ("NATIVE", "CUDA", "VLLM")}
    except ValueError as e:  # a typo must not read as "expect nothing"
        pytest.exit(str(e), 4)
    if expect["NATIVE"] and not NATIVE:
        pytest.exit(f"native module expected but not loaded: {INFO['native_error']}", 3)
    if expect["CUDA"] and not INFO["cuda"]:
        pytest.exit(f"CUDA kernels expected but not compiled in: {INFO}", 3)
    if expect["VLLM"] and vllm_version() != "0.33.0":
        pytest.exit(f"vLLM 0.33.0 expected (tests/test_vllm.py must not skip), found {vllm_version()}", 3)


def vllm_version():
    import importlib.metadata

    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


# Under pytest-xdist (the device check's tests step) each worker hands its
# counts to the controller, which adds them up before the check below.
WORKER_COUNTS = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    WORKER_COUNTS.append(getattr(node, "workeroutput", {}).get("path_counts", {}))


def pytest_sessionfinish(session, exitstatus):
    """With the native module loaded, every layout runs native: a single call
    that fell back to the ATen gather fails the session."""
    if not NATIVE or _ops.FORCE_REFERENCE:
        return
    counts = _ops.path_counts()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["path_counts"] = counts
        return
    for worker in WORKER_COUNTS:
        counts = {k: n + worker.get(k, 0) for k, n in counts.items()}
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    say(f"flashmla_perm path_counts: {counts}" + (f" ({len(WORKER_COUNTS)} workers)" if WORKER_COUNTS else ""))
    if counts["aten"] > 0:
        say(f"FAILED: the ATen gather ran {counts['aten']} times; every layout should be native")
        session.exitstatus = 1


# gpu_launches(op, dims) for every model op at TP 1, 2, 4 and 8 (DeepSeek-V4.1's
# shapes, wq_b's K reduced), and a few odd shapes.
LAUNCH_CASES = (
    [("wq_b", [64 // tp * 512, 1280, 64 // tp]) for tp in (1, 2, 4, 8)]
    + [("wo_a", [8 // tp * 1024, 4096, 8]) for tp in (1, 2, 4, 8)]
    + [("wq_b_packed", [64 // tp * 512, 1280, 64 // tp, 32]) for tp in (1, 2, 4, 8)]
    + [("wv_packed", [max(8 // tp, 1), 1024, 4096, 8]) for tp in (1, 2, 4, 8)]
    + [
        ("wq_b_packed", [3 * 48, 1024, 3, 128]),
        ("wv_packed", [3, 33, 1024, 8]),
        ("permute_q", [4096, 64, 512, 2]),
        ("permute_q", [4096, 128, 512, 2]),
        ("permute_q", [3, 5, 48, 2]),
    ]
)


def random_tensor(shape, dtype=torch.uint8, device="cpu", gen=None):
    """Random bytes (never zeros) viewed as `dtype`; NaN/inf payloads included."""
    shape = list(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    raw_shape = shape[:-1] + [shape[-1] * esize] if shape else [esize]
    raw = torch.randint(0, 256, raw_shape, dtype=torch.uint8, generator=gen)
    t = raw.view(dtype) if shape else raw.view(dtype).reshape(())
    return t.to(device)


def as_bytes(t):
    """Bytes of t's elements (any layout), for exact comparison."""
    c = t.detach().contiguous()
    return c.view(torch.uint8) if c.element_size() == 1 else c.view(-1).view(torch.uint8)


def assert_same_bytes(actual, expected):
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype
    a, e = as_bytes(actual).cpu(), as_bytes(expected).cpu()
    if not torch.equal(a, e):
        bad = (a != e).nonzero()
        pytest.fail(f"{len(bad)} bytes differ, first at {bad[0].tolist()}")


def poison(device, nbytes):
    """Fill memory the allocator is about to hand out, so an output byte the
    kernel forgets to write shows up as 0xA5 rather than a lucky match."""
    torch.full((max(nbytes, 1),), 0xA5, dtype=torch.uint8, device=device)


@contextlib.contextmanager
def expect_path(device, native=True):
    """Asserts that the calls inside ran the native executor for `device`
    (native=True) or the ATen gather, when the native module is loaded."""
    before = _ops.path_counts()
    yield
    if not NATIVE:
        return
    after = _ops.path_counts()
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    grew = {k: after[k] - before[k] for k in after}
    if native:
        assert grew[kind] > 0 and grew["aten"] == 0, f"expected the native {kind} path, got {grew}"
    else:
        assert grew["aten"] > 0, f"expected the ATen path, got {grew}"


def expect_native_if_moves(device, perm):
    """expect_path(device) when `perm` moves anything; nothing is asserted for
    the identity, which no path needs to run."""
    if torch.equal(perm.long().cpu(), torch.arange(perm.numel())):
        return contextlib.nullcontext()
    return expect_path(device)


@pytest.fixture
def gen():
    g = torch.Generator()
    g.manual_seed(1234)
    return g
