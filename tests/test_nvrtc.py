"""The CUDA kernels through NVRTC: build_info's compiler, every kernel compiled
for five architectures with ptxas's report gated (no GPU needed), the disk
cache (concurrent first use, a damaged entry, a changed source), a missing
NVRTC named; on a GPU, the kernels compiled at first use, graph capture and
a missing NVRTC before any byte moves. The whole CUDA suite under NVRTC's
kernels: FLASHMLA_PERM_CUDA=nvrtc (tests/test_cuda_runtime.py and the rest)."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import flashmla_perm
from flashmla_perm import _ops
from flashmla_perm import nvrtc as nvrtc_cli

INFO = flashmla_perm.build_info()
HAS_NVRTC_PATH = _ops._C is not None and hasattr(_ops._C, "nvrtc_compile")


def nvrtc_usable():
    if not HAS_NVRTC_PATH:
        return False
    try:
        _ops._C.nvrtc_info()
        return True
    except RuntimeError:
        return False


needs_nvrtc = pytest.mark.skipif(not nvrtc_usable(), reason="no CUDA kernels in the module, or no NVRTC")
needs_gpu = pytest.mark.skipif(not (nvrtc_usable() and torch.cuda.is_available()), reason="needs a GPU and NVRTC")
ARCHS = ["sm_80", "sm_90", "sm_100", "sm_103", "sm_120"]

# Four kernels of the names cuda_kernels.cu gives its own, compiled in
# milliseconds: the cache's tests need a compile, not those kernels.
SMALL_SOURCE = textwrap.dedent("""\
    namespace flashmla_perm {
    namespace {
    __global__ void flashmla_perm_rows(int* p) { p[0] = 1; }
    __global__ void flashmla_perm_save_heads(int* p) { p[0] = 2; }
    template <bool kStaged> __global__ void flashmla_perm_cols(int* p) { p[0] = kStaged ? 3 : 4; }
    }  // namespace
    }  // namespace flashmla_perm
    """)


def test_build_info_names_the_compiler():
    compiler = INFO["cuda_compiler"]
    if not INFO["cuda"]:
        assert compiler is None
        return
    assert compiler in ("nvcc", "nvrtc")
    if os.environ.get("FLASHMLA_PERM_CUDA") == "nvrtc":
        assert compiler == "nvrtc"
    if compiler == "nvrtc":
        assert INFO["cuda_off_reason"] is None


def run_python(code, env=None, timeout=600):
    full = dict(os.environ, **(env or {}))
    full.pop("FLASHMLA_PERM_FORCE_REFERENCE", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True, timeout=timeout
    )


# --------------------------------------------------------------------------- compile report


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """python -m flashmla_perm.nvrtc over the five architectures, once (about
    30 s of CPU each, side by side). CI runs that command itself (its table
    in the log) and hands its JSON and output here: FLASHMLA_PERM_NVRTC_REPORT
    (the JSON; its output beside it, .txt)."""
    given = os.environ.get("FLASHMLA_PERM_NVRTC_REPORT")
    if given:
        return json.loads(Path(given).read_text()), Path(given).with_suffix(".txt").read_text()
    out = tmp_path_factory.mktemp("nvrtc") / "report.json"
    args = [a for arch in ARCHS for a in ("--arch", arch)] + ["--json", str(out), "--gate"]
    done = subprocess.run(
        [sys.executable, "-m", "flashmla_perm.nvrtc", *args], capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text()), done.stdout


@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles_without_spills_or_stack(report, arch):
    records = [r for r in report[0] if r["arch"] == arch]
    assert sorted(r["kernel"] for r in records) == ["cols<false>", "cols<true>", "rows", "save_heads"], records
    for r in records:
        assert set(r) >= {"kernel", "arch", "registers", "spill_stores", "spill_loads", "stack", "static_smem"}, r
        assert 0 < r["registers"] <= 255, r
        assert r["spill_stores"] == r["spill_loads"] == r["stack"] == 0, r
    if arch in ("sm_100", "sm_103"):  # as lean as sm_90: as many CTAs per SM
        sm90 = {r["kernel"]: r["registers"] for r in report[0] if r["arch"] == "sm_90"}
        for r in records:
            assert r["registers"] <= 1.1 * sm90[r["kernel"]], (r, sm90)
    assert "NVRTC gate passed: 20 kernel builds" in report[1], report[1]


def test_the_report_parser_reads_ptxas():
    log = textwrap.dedent("""\
        ptxas info    : Compiling entry function '_ZN13flashmla_perm53_GLOBAL__N__x18flashmla_perm_rowsENS_4JobsINS_6RowJobEEE' for 'sm_90'
        ptxas info    : Function properties for _ZN13flashmla_perm...
        ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 92 registers, used 1 barriers, 16 bytes smem
        """)
    assert nvrtc_cli.parse(log) == [
        {
            "kernel": "rows",
            "arch": "sm_90",
            "stack": 8,
            "spill_stores": 4,
            "spill_loads": 12,
            "registers": 92,
            "static_smem": 16,
        }
    ]


# --------------------------------------------------------------------------- the cache


def cached_in(cache, extra=""):
    """The small source through the cache in `cache` (read from the
    environment at each call)."""
    old = os.environ.get("FLASHMLA_PERM_CACHE_DIR")
    os.environ["FLASHMLA_PERM_CACHE_DIR"] = str(cache)
    try:
        return _ops._C.nvrtc_cached("sm_90", extra, SMALL_SOURCE)
    finally:
        if old is None:
            del os.environ["FLASHMLA_PERM_CACHE_DIR"]
        else:
            os.environ["FLASHMLA_PERM_CACHE_DIR"] = old


def entries(cache):
    return sorted(p.name for p in (cache / "nvrtc").iterdir())


@needs_nvrtc
def test_a_cache_entry_is_written_then_read(tmp_path):
    first = cached_in(tmp_path)
    assert first["compiled"] and first["cubin_bytes"] > 0
    assert Path(first["path"]).parent == tmp_path / "nvrtc"
    again = cached_in(tmp_path)
    assert not again["compiled"] and again["path"] == first["path"] and again["cubin_bytes"] == first["cubin_bytes"]
    assert entries(tmp_path) == [Path(first["path"]).name]


@needs_nvrtc
def test_processes_compiling_at_once_all_succeed_and_leave_one_whole_entry(tmp_path):
    """Workers starting together (vLLM's, one a GPU) all miss the cache and
    compile: each writes a file of its own and renames it into place."""
    go = tmp_path / "go"
    code = f"""
        import json, os, time
        from flashmla_perm import _ops
        while not os.path.exists({str(go)!r}):
            time.sleep(0.001)
        print(json.dumps(_ops._C.nvrtc_cached("sm_90", "", {SMALL_SOURCE!r})))
        """
    env = dict(os.environ, FLASHMLA_PERM_CACHE_DIR=str(tmp_path / "cache"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["path"] for r in results}) == 1
    assert any(r["compiled"] for r in results)
    assert entries(tmp_path / "cache") == [Path(results[0]["path"]).name]  # no temporary file left
    assert not cached_in(tmp_path / "cache")["compiled"]  # and it is whole


@needs_nvrtc
@pytest.mark.parametrize("damage", ["truncated", "a byte changed", "empty", "another file"])
def test_a_damaged_entry_is_compiled_again(tmp_path, damage):
    path = Path(cached_in(tmp_path)["path"])
    good = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "a byte changed":
        path.write_bytes(good[:-10] + bytes([good[-10] ^ 0xFF]) + good[-9:])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(b"\x7fELF" + bytes(len(good) - 4))
    again = cached_in(tmp_path)
    assert again["compiled"] and again["path"] == str(path)
    # Rebuilt whole: read as it is next time. (Not byte for byte the old one:
    # the lowered names carry a hash NVRTC draws afresh each compile.)
    assert len(path.read_bytes()) == len(good)
    assert not cached_in(tmp_path)["compiled"]


@needs_nvrtc
def test_a_changed_source_has_a_new_key(tmp_path):
    old = cached_in(tmp_path)
    new = cached_in(tmp_path, extra="\n// a changed line\n")
    assert new["compiled"] and new["path"] != old["path"]
    assert entries(tmp_path) == sorted([Path(old["path"]).name, Path(new["path"]).name])
    assert not cached_in(tmp_path)["compiled"]  # the old entry is still good for the old source


@needs_nvrtc
def test_the_key_names_source_architecture_and_nvrtc(tmp_path):
    info = _ops._C.nvrtc_info()
    name = Path(cached_in(tmp_path)["path"]).name
    assert name.endswith(f"-sm_90-nvrtc{info['version']}.cubin"), name
    assert len(info["source_hash"]) == 16 and info["source_hash"] not in name  # SMALL_SOURCE's hash, not the kernels'


@needs_nvrtc
def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHMLA_PERM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _ops._C.nvrtc_info()["cache_dir"] == f"{tmp_path}/flashmla_perm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _ops._C.nvrtc_info()["cache_dir"] == f"{tmp_path}/home/.cache/flashmla_perm"
    assert Path(cached_in(tmp_path / "x")["path"]).parent == tmp_path / "x" / "nvrtc"


@pytest.mark.skipif(not HAS_NVRTC_PATH, reason="no CUDA kernels in the module")
def test_a_missing_nvrtc_is_named_with_its_package(tmp_path):
    code = """
        from flashmla_perm import _ops
        try:
            _ops._C.nvrtc_cached("sm_90")
        except RuntimeError as e:
            print(e)
        """
    out = run_python(
        code, dict(FLASHMLA_PERM_NVRTC_LIBRARY=str(tmp_path / "libnvrtc.so.13"), FLASHMLA_PERM_CACHE_DIR=str(tmp_path))
    )
    assert "no NVRTC library was found" in out.stdout, out.stdout + out.stderr
    assert "pip install nvidia-cuda-nvrtc" in out.stdout and "FLASHMLA_PERM_NVRTC_LIBRARY" in out.stdout
    assert not (tmp_path / "nvrtc").exists()


# --------------------------------------------------------------------------- on a GPU

GPU_PRELUDE = """
    import torch, flashmla_perm
    from flashmla_perm import _ops, reference
    ops = torch.ops.flashmla_perm
    assert flashmla_perm.build_info()["cuda_compiler"] == "nvrtc", flashmla_perm.build_info()
    g = torch.Generator().manual_seed(7)
    t = torch.randint(0, 256, (256, 64), dtype=torch.uint8, generator=g).cuda()
    perm = torch.randperm(256, generator=g)
    before = t.clone()
    """


@needs_gpu
def test_the_kernels_compile_at_first_use_and_permute(tmp_path):
    code = (
        GPU_PRELUDE
        + """
        ops.permute_(t, perm, 0)
        torch.cuda.synchronize()
        assert torch.equal(t, before.index_select(0, perm.cuda()))
        assert _ops._C.path_counts()["cuda"] >= 1
        print("ok")
        """
    )
    out = run_python(code, dict(FLASHMLA_PERM_CUDA="nvrtc", FLASHMLA_PERM_CACHE_DIR=str(tmp_path)))
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    assert len(list((tmp_path / "nvrtc").glob("*.cubin"))) == 1
    out = run_python(code, dict(FLASHMLA_PERM_CUDA="nvrtc", FLASHMLA_PERM_CACHE_DIR=str(tmp_path)))
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr  # from the cache


@needs_gpu
def test_a_first_use_under_capture_says_so_and_moves_nothing(tmp_path):
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
    out = run_python(code, dict(FLASHMLA_PERM_CUDA="nvrtc", FLASHMLA_PERM_CACHE_DIR=str(tmp_path)))
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@needs_gpu
def test_a_missing_nvrtc_on_a_gpu_raises_before_any_byte_moves(tmp_path):
    code = (
        GPU_PRELUDE
        + """
        try:
            ops.permute_(t, perm, 0)
            raise SystemExit("permuted without NVRTC")
        except RuntimeError as e:
            assert "nvidia-cuda-nvrtc" in str(e), e
        torch.cuda.synchronize()
        assert torch.equal(t, before)
        print("ok")
        """
    )
    out = run_python(
        code,
        dict(
            FLASHMLA_PERM_CUDA="nvrtc",
            FLASHMLA_PERM_CACHE_DIR=str(tmp_path),
            FLASHMLA_PERM_NVRTC_LIBRARY=str(tmp_path / "libnvrtc.so.13"),
        ),
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# --------------------------------------------------------------------------- the source NVRTC sees

CSRC = Path(__file__).resolve().parent.parent / "csrc"
SHIMS = {"cstdint", "cstring", "type_traits"}  # csrc/nvrtc_kernels.cpp's kShimNames


def test_nvrtc_sees_only_the_embedded_files_and_the_standard_headers_it_is_given():
    """What the kernels' file includes under NVRTC (__CUDACC_RTC__), and what
    those headers include, is embedded (build_config.txt's nvrtc_sources) or
    one of the standard headers nvrtc_kernels.cpp hands NVRTC: a new include
    in tile_bodies.h fails here, not at first use on a GPU."""
    if not CSRC.is_dir():
        pytest.skip("no csrc/ beside the tests")
    config = (CSRC / "build_config.txt").read_text()
    embedded = next(
        l.split("=", 1)[1].split() for l in config.splitlines() if l.split("=", 1)[0].strip() == "nvrtc_sources"
    )
    assert embedded[0] == "cuda_kernels.cu"
    include = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
    kernels = (CSRC / "cuda_kernels.cu").read_text()
    rtc = kernels[
        kernels.index("#ifdef __CUDACC_RTC__") : kernels.index("#else", kernels.index("#ifdef __CUDACC_RTC__"))
    ]
    seen = set(include.findall(rtc))
    for name in embedded[1:]:
        seen |= set(include.findall((CSRC / name).read_text()))
    assert seen <= set(embedded[1:]) | SHIMS, seen - set(embedded[1:]) - SHIMS
