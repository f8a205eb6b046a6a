"""The CUDA kernels: built at install and chosen per architecture (no GPU
needed), `python -m flashmla_perm.nvrtc --warm`, NVRTC at first use through
the disk cache (its lock, its keys, whose folders and files it trusts), the
paths it looks in, the module's RUNPATH, the driver's constants against
cuda.h; on a GPU, a first use that compiles nothing, NVRTC's kernels
(FLASHMLA_PERM_JIT=1), graph capture and a missing NVRTC."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import flashmla_perm
from flashmla_perm import _ops
from flashmla_perm import nvrtc as nvrtc_cli

INFO = flashmla_perm.build_info()
CUDA_SIDE = _ops._C is not None and INFO["cuda"]
ROOT = Path(__file__).resolve().parent.parent
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def nvrtc_usable():
    if not CUDA_SIDE:
        return False
    try:
        _ops._C.nvrtc_info()
        return True
    except RuntimeError:
        return False


needs_cuda_side = pytest.mark.skipif(not CUDA_SIDE, reason="the module has no CUDA side (a CPU torch)")
needs_nvrtc = pytest.mark.skipif(not nvrtc_usable(), reason="no CUDA side, or no NVRTC")
needs_gpu = pytest.mark.skipif(not (CUDA_SIDE and torch.cuda.is_available()), reason="needs a GPU")
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs another user's files: runs as root (CI is root)")

# Four kernels of the names csrc/cuda/kernels.cu gives its own, compiled in
# milliseconds: the cache's tests need a compile, not those kernels.
SMALL_SOURCE = textwrap.dedent("""\
    extern "C" __global__ void flashmla_perm_rows(int* p) { p[0] = 1; }
    extern "C" __global__ void flashmla_perm_save_heads(int* p) { p[0] = 2; }
    extern "C" __global__ void flashmla_perm_cols_staged(int* p) { p[0] = 3; }
    extern "C" __global__ void flashmla_perm_cols_direct(int* p) { p[0] = 4; }
    """)


def child_env(env=None, unset=()):
    """This environment for a child process that imports the package this
    process imported (not, say, an editable install's), with `env` set and
    `unset` removed."""
    full = dict(os.environ)
    for name in ("FLASHMLA_PERM_FORCE_REFERENCE", *unset):
        full.pop(name, None)
    here = str(Path(flashmla_perm.__file__).resolve().parent.parent)
    full["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [full.get("PYTHONPATH")])])
    full.update(env or {})
    return full


def run_python(code, env=None, unset=(), timeout=600, cwd=None):
    full = child_env(env, unset)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


# --------------------------------------------------------------------------- built at install


@needs_cuda_side
def test_build_info_names_what_was_built_at_install():
    assert INFO["cuda_compiler"] in ("nvcc", "nvrtc")
    assert INFO["cuda_archs"] == list(INFO["kernels"])
    for arch, origin in INFO["kernels"].items():
        assert re.fullmatch(r"sm_\d+", arch) and origin.startswith("built at install by "), (arch, origin)
        assert ("nvcc" in origin) == (INFO["cuda_compiler"] == "nvcc"), INFO
    assert INFO["kernel_cache"] == _ops._C.kernel_cache_dir()


@needs_cuda_side
def test_the_default_build_covers_the_gpus_users_run():
    """sm_80, sm_90, sm_100 and sm_120 (sm_103 where the compiler has it);
    a build told other architectures (FLASHMLA_PERM_CUDA_ARCHS) has those."""
    if os.environ.get("FLASHMLA_PERM_CUDA_ARCHS") or not INFO["kernels"]:
        pytest.skip("a build of chosen architectures, or of none")
    assert {"sm_80", "sm_90", "sm_100", "sm_120"} <= set(INFO["kernels"]), INFO["kernels"]


@needs_cuda_side
def test_each_architecture_takes_its_familys_kernels_built_at_install():
    built = set(INFO["kernels"])
    if not {"sm_80", "sm_90", "sm_120"} <= built:
        pytest.skip(f"built at install: {sorted(built)}")
    for arch, serves in [("sm_80", "sm_80"), ("sm_86", "sm_80"), ("sm_89", "sm_80"), ("sm_90", "sm_90"),
                         ("sm_120", "sm_120"), ("sm_121", "sm_120")]:  # fmt: skip
        origin = _ops._C.kernel_origin(arch)
        assert origin["kind"] == "install", (arch, origin)
        assert origin["text"].endswith("" if arch == serves else f"({serves}'s kernels)"), (arch, origin)
    # Another major is never served by these: sm_110 compiles at first use.
    assert _ops._C.kernel_origin("sm_110")["kind"] != "install"
    assert _ops._C.kernel_origin("sm_75")["kind"] != "install"


@needs_cuda_side
def test_kernel_origin_refuses_what_is_not_an_architecture():
    for bad in ["90", "sm_", "sm_9x", "compute_90"]:
        with pytest.raises(ValueError, match="arch must be like 'sm_90'"):
            _ops._C.kernel_origin(bad)


@needs_cuda_side
def test_warm_says_what_the_install_built_and_compiles_nothing(tmp_path):
    arch = next(iter(INFO["kernels"]), None)
    if arch is None:
        pytest.skip("no kernels built at install")
    out = subprocess.run(
        [sys.executable, "-m", "flashmla_perm.nvrtc", "--warm", "--arch", arch],
        env=child_env(dict(FLASHMLA_PERM_CACHE_DIR=str(tmp_path))),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{arch}: {INFO['kernels'][arch]}", out.stdout
    assert not (tmp_path / "nvrtc").exists() or not list((tmp_path / "nvrtc").iterdir())


@needs_nvrtc
def test_warm_compiles_an_architecture_the_install_did_not_build_then_finds_it(tmp_path):
    """FLASHMLA_PERM_JIT=1: as for an architecture no install built (the
    real kernels, NVRTC's whole compile)."""
    env = child_env(dict(FLASHMLA_PERM_CACHE_DIR=str(tmp_path), FLASHMLA_PERM_JIT="1"))
    cmd = [sys.executable, "-m", "flashmla_perm.nvrtc", "--warm", "--arch", "sm_90"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert re.fullmatch(r"sm_90: compiled by NVRTC [\d.]+ in [\d.]+ s, cached in .*\.cubin\n", first.stdout), first
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert re.fullmatch(r"sm_90: found in the cache \(.*\), compiled by NVRTC [\d.]+\n", again.stdout), again


def test_the_report_parser_reads_ptxas():
    log = textwrap.dedent("""\
        ptxas info    : Compiling entry function 'flashmla_perm_rows' for 'sm_90'
        ptxas info    : Function properties for flashmla_perm_rows
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


def cached(cache, extra="", arch="sm_90"):
    """The small source through the cache in `cache` (read from the
    environment at each call)."""
    old = os.environ.get("FLASHMLA_PERM_CACHE_DIR")
    os.environ["FLASHMLA_PERM_CACHE_DIR"] = str(cache)
    try:
        return _ops._C.nvrtc_cached(arch, extra, SMALL_SOURCE)
    finally:
        if old is None:
            del os.environ["FLASHMLA_PERM_CACHE_DIR"]
        else:
            os.environ["FLASHMLA_PERM_CACHE_DIR"] = old


def entries(cache):
    return sorted(p.name for p in (cache / "nvrtc").iterdir())


CACHED_IN_A_PROCESS = f"""
    import json, sys
    from flashmla_perm import _ops
    print(json.dumps(_ops._C.nvrtc_cached("sm_90", sys.argv[1] if len(sys.argv) > 1 else "", {SMALL_SOURCE!r})))
    """


def cached_in_a_process(cache, extra="", env=None):
    """As cached(), in a process of its own: what it returned, and what it said."""
    code = CACHED_IN_A_PROCESS.replace('sys.argv[1] if len(sys.argv) > 1 else ""', repr(extra))
    out = run_python(code, dict(env or {}, FLASHMLA_PERM_CACHE_DIR=str(cache)))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@needs_nvrtc
def test_a_cache_entry_is_written_then_read(tmp_path):
    first = cached(tmp_path)
    assert first["compiled"] and first["cubin_bytes"] > 0
    assert Path(first["path"]).parent == tmp_path / "nvrtc"
    again = cached(tmp_path)
    assert not again["compiled"] and again["path"] == first["path"] and again["cubin_bytes"] == first["cubin_bytes"]
    assert [n for n in entries(tmp_path) if not n.endswith(".lock")] == [Path(first["path"]).name]
    assert oct((tmp_path / "nvrtc").stat().st_mode & 0o777) == "0o700"
    assert oct(Path(first["path"]).stat().st_mode & 0o777) == "0o600"


@needs_nvrtc
def test_eight_processes_asking_at_once_compile_once(tmp_path):
    """A cold cache, eight workers starting together (a TP8 vLLM start): one
    compiles under the entry's lock, the others wait, then read its entry."""
    go = tmp_path / "go"
    code = f"""
        import json, os, sys, time
        from flashmla_perm import _ops
        open(os.path.join({str(tmp_path)!r}, "ready-" + sys.argv[1]), "w").close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.001)
        print(json.dumps(_ops._C.nvrtc_cached("sm_90", "// eight", {SMALL_SOURCE!r})))
        """
    env = child_env(dict(FLASHMLA_PERM_CACHE_DIR=str(tmp_path / "cache")))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    while len(list(tmp_path.glob("ready-*"))) < 8 and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["path"] for r in results}) == 1
    assert sum(r["compiled"] for r in results) == 1, results
    names = entries(tmp_path / "cache")
    assert [n for n in names if not n.endswith(".lock")] == [Path(results[0]["path"]).name]  # no temporary left


@needs_nvrtc
@pytest.mark.parametrize("damage", ["truncated", "a byte changed", "empty", "another file"])
def test_a_damaged_entry_is_compiled_again(tmp_path, damage):
    path = Path(cached(tmp_path)["path"])
    good = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "a byte changed":
        path.write_bytes(good[:-10] + bytes([good[-10] ^ 0xFF]) + good[-9:])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(b"\x7fELF" + bytes(len(good) - 4))
    again = cached(tmp_path)
    assert again["compiled"] and again["path"] == str(path)
    assert len(path.read_bytes()) == len(good)
    assert not cached(tmp_path)["compiled"]


@needs_nvrtc
def test_a_changed_source_has_a_new_key(tmp_path):
    old = cached(tmp_path)
    new = cached(tmp_path, extra="\n// a changed line\n")
    assert new["compiled"] and new["path"] != old["path"]
    assert not cached(tmp_path)["compiled"]  # the old entry is still good for the old source


@needs_nvrtc
@pytest.mark.parametrize("other", ["another source", "another architecture"])
def test_an_entry_moved_under_another_key_is_compiled_again(tmp_path, other):
    """The header carries the whole key: an entry renamed over another's
    name (mv -f B A) is not taken for A."""
    a = Path(cached(tmp_path)["path"])
    b = Path(
        cached(tmp_path, extra="\n// B\n")["path"]
        if other == "another source"
        else cached(tmp_path, arch="sm_80")["path"]
    )
    a_bytes = a.read_bytes()
    b.replace(a)
    again = cached(tmp_path)
    assert again["compiled"], "an entry of another key was read"
    assert a.read_bytes() != b"" and len(a.read_bytes()) == len(a_bytes)


@needs_nvrtc
def test_the_key_names_source_architecture_and_nvrtc(tmp_path):
    info = _ops._C.nvrtc_info()
    path = Path(cached(tmp_path)["path"])
    assert path.name.startswith("kernels-sm_90-") and path.suffix == ".cubin", path.name
    key = path.read_bytes().split(b"\n")[1].decode()
    assert f" for sm_90 by NVRTC {info['version']} ({info['identity']})" in key, key
    size = Path(info["path"]).stat().st_size
    assert info["identity"].startswith(f"{size} bytes, modified "), info
    assert len(info["source_hash"]) == 16 and info["source_hash"] not in key  # SMALL_SOURCE's


@needs_nvrtc
def test_a_stale_temporary_file_blocks_nothing(tmp_path):
    """A process killed mid-write leaves name.tmp.<...>; a new process of the
    same pid (containers reuse them) must still write its entry."""
    first = Path(cached(tmp_path)["path"])
    first.unlink()
    for stale in [f"{first.name}.tmp.{os.getpid()}.0", f"{first.name}.tmp.0000000000000000"]:
        (first.parent / stale).write_bytes(b"half an entry")
    again = cached(tmp_path)
    assert again["compiled"] and Path(again["path"]).exists()
    assert not cached(tmp_path)["compiled"]


@needs_nvrtc
def test_a_link_at_an_entry_is_not_followed(tmp_path):
    path = Path(cached(tmp_path)["path"])
    target = tmp_path / "elsewhere"
    target.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(target)
    again = cached(tmp_path)
    assert again["compiled"] and not path.is_symlink()


@needs_nvrtc
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_folder_others_may_write_is_refused_and_said_once(tmp_path, mode):
    cache = tmp_path / "shared"
    (cache / "nvrtc").mkdir(parents=True)
    os.chmod(cache, mode)
    result, said = cached_in_a_process(cache, "// shared folder")
    assert result["compiled"] and result["path"] == ""
    assert said.count("flashmla_perm: the kernel cache is off:") == 1, said
    assert f"{cache} may be written by other users (mode {mode:04o})" in said, said
    assert list((cache / "nvrtc").iterdir()) == []


@needs_nvrtc
def test_entries_folder_others_may_write_is_refused(tmp_path):
    (tmp_path / "nvrtc").mkdir(mode=0o700)
    os.chmod(tmp_path / "nvrtc", 0o777)
    result, said = cached_in_a_process(tmp_path)
    assert result["path"] == "" and f"{tmp_path}/nvrtc may be written by other users" in said, said


@needs_nvrtc
def test_an_entry_others_may_write_is_compiled_again(tmp_path):
    path = Path(cached(tmp_path)["path"])
    os.chmod(path, 0o666)
    assert cached(tmp_path)["compiled"]


@needs_nvrtc
def test_a_cache_that_cannot_be_written_says_so_once(tmp_path):
    (tmp_path / "nvrtc").mkdir(mode=0o700)
    os.chmod(tmp_path / "nvrtc", 0o500)
    try:
        if os.access(tmp_path / "nvrtc", os.W_OK) and not IS_ROOT:
            pytest.skip("the folder stays writable here")
        code = CACHED_IN_A_PROCESS.replace('sys.argv[1] if len(sys.argv) > 1 else ""', '"// read-only"') + (
            f"\n    print(json.dumps(_ops._C.nvrtc_cached('sm_80', '// read-only', {SMALL_SOURCE!r})))\n"
        )
        if IS_ROOT:  # root writes anywhere: a file in the folder's place instead
            os.chmod(tmp_path / "nvrtc", 0o700)
            shutil.rmtree(tmp_path / "nvrtc")
            (tmp_path / "nvrtc").write_text("a file, not a folder")
        out = run_python(code, dict(FLASHMLA_PERM_CACHE_DIR=str(tmp_path)))
        assert out.returncode == 0, out.stderr
        lines = [l for l in out.stderr.splitlines() if l.startswith("flashmla_perm: the kernel cache")]
        assert len(lines) == 1, out.stderr  # two compiles, one line
    finally:
        if (tmp_path / "nvrtc").is_dir():
            os.chmod(tmp_path / "nvrtc", 0o700)


@needs_root
@needs_nvrtc
def test_another_users_folder_and_entries_are_refused(tmp_path):
    """The finding: user nobody made the fallback folder (HOME unset: once
    /tmp/flashmla_perm-0) with mode 0777 and fed it entries. Its folder,
    its entries and its lock are all refused, whatever they hold."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    cache = tmp_path / "squatted"
    good = Path(cached(cache)["path"])  # a well-formed entry of this key
    for p in [cache, cache / "nvrtc", good]:
        os.chown(p, nobody.pw_uid, nobody.pw_gid)
    result, said = cached_in_a_process(cache)
    assert result["compiled"] and result["path"] == "", said
    assert f"belongs to uid {nobody.pw_uid}, not to this user" in said, said
    # Only the entry another user's: not read.
    os.chown(cache, 0, 0)
    os.chown(cache / "nvrtc", 0, 0)
    assert cached(cache)["compiled"]
    # Only the lock another user's: refused like an entry, said once.
    entry = Path(cached(cache, "// lock")["path"])
    entry.unlink()
    lock = entry.with_name(entry.name + ".lock")
    os.chown(lock, nobody.pw_uid, nobody.pw_gid)
    result, said = cached_in_a_process(cache, "// lock")
    assert result["compiled"] and "cannot be shared between processes" in said, said


def as_nobody(code):
    """`code` run by user nobody (a service user: no HOME, no usable home in
    the password database), with a copy of this package (this one may lie in
    a folder only root reads) and this environment's torch. Where nobody
    cannot run this interpreter (a venv of a Python under /root), the
    system's Python of the same version, given this environment's
    site-packages. Skips, saying why, where nobody can import neither."""
    import sysconfig
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME", "FLASHMLA_PERM_CACHE_DIR")}
    copy = Path(tempfile.mkdtemp(prefix="flashmla_perm-nobody-", dir="/tmp"))
    os.chmod(copy, 0o755)
    shutil.copytree(Path(flashmla_perm.__file__).resolve().parent, copy / "flashmla_perm")
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    why = "no Python it can run"
    try:
        for python, path in [(sys.executable, str(copy)), (system, f"{copy}:{sysconfig.get_paths()['purelib']}")]:
            run = dict(env=dict(env, PYTHONPATH=path), user="nobody", capture_output=True, text=True, cwd="/")
            try:
                probe = subprocess.run([python, "-c", "import flashmla_perm"], timeout=300, **run)
            except (PermissionError, FileNotFoundError) as e:
                why = f"{python}: {e}"
                continue
            if probe.returncode != 0:
                why = f"{python}: {(probe.stderr.strip().splitlines() or ['?'])[-1]}"
                continue
            return subprocess.run([python, "-c", textwrap.dedent(code)], timeout=300, **run)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    pytest.skip(f"user nobody cannot import this environment ({why})")


@needs_root
@needs_nvrtc
def test_the_tmp_fallback_is_a_private_folder_and_a_squatted_one_is_refused():
    """No FLASHMLA_PERM_CACHE_DIR, XDG_CACHE_HOME, HOME or usable home:
    /tmp/flashmla_perm-<uid>, made with mode 0700. The finding, the other way
    round: another user (here root) made that folder first, mode 0777, and
    put a well-formed entry in it: refused, said once, compiled in memory."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    folder = Path(f"/tmp/flashmla_perm-{nobody.pw_uid}")
    code = f"""
        import json
        from flashmla_perm import _ops
        print(_ops._C.kernel_cache_dir())
        print(json.dumps(_ops._C.nvrtc_cached("sm_90", "// nobody", {SMALL_SOURCE!r})))
        """
    shutil.rmtree(folder, ignore_errors=True)
    try:
        out = as_nobody(code)
        assert out.returncode == 0, out.stderr
        where, result = out.stdout.splitlines()[-2], json.loads(out.stdout.splitlines()[-1])
        assert where == str(folder) and result["compiled"] and result["path"].startswith(f"{folder}/nvrtc/"), out
        st = folder.stat()
        assert st.st_uid == nobody.pw_uid and oct(st.st_mode & 0o777) == "0o700", oct(st.st_mode)
        entry = Path(result["path"])
        shutil.rmtree(folder)
        # Squatted: root's folder, open to all, a well-formed entry of that key in it.
        (folder / "nvrtc").mkdir(parents=True)
        os.chmod(folder, 0o777)
        os.chmod(folder / "nvrtc", 0o777)
        out = as_nobody(code)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout.splitlines()[-1])
        assert result["compiled"] and result["path"] == "", out
        assert out.stderr.count("flashmla_perm: the kernel cache is off:") == 1, out.stderr
        assert f"{folder} belongs to uid 0, not to this user" in out.stderr, out.stderr
        assert not entry.exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_cuda_side
def test_the_cache_folder_follows_the_environment(tmp_path):
    code = "from flashmla_perm import _ops; print(_ops._C.kernel_cache_dir())"
    unset = ("FLASHMLA_PERM_CACHE_DIR", "XDG_CACHE_HOME")
    out = run_python(code, dict(XDG_CACHE_HOME=str(tmp_path)), unset=unset)
    assert out.stdout.strip() == f"{tmp_path}/flashmla_perm", out
    (tmp_path / "home").mkdir()
    out = run_python(code, dict(XDG_CACHE_HOME="rel/cache", HOME=str(tmp_path / "home")), unset=unset)
    assert out.stdout.strip() == f"{tmp_path}/home/.cache/flashmla_perm", out  # a relative XDG_CACHE_HOME is ignored
    out = run_python(code, dict(FLASHMLA_PERM_CACHE_DIR=str(tmp_path / "x"), XDG_CACHE_HOME=str(tmp_path)))
    assert out.stdout.strip() == str(tmp_path / "x"), out
    code = (
        "from flashmla_perm import _ops; _ops._C.set_kernel_cache_root('/srv/vllm/flashmla_perm'); "
        + code.split("; ")[1]
    )
    out = run_python(code, dict(XDG_CACHE_HOME=str(tmp_path)), unset=unset)
    assert out.stdout.strip() == "/srv/vllm/flashmla_perm", out  # a host's root (the vLLM plugin's) before XDG's


@needs_cuda_side
def test_a_relative_cache_folder_is_refused_at_import(tmp_path):
    out = run_python("import flashmla_perm", dict(FLASHMLA_PERM_CACHE_DIR="rel/cache"), cwd=tmp_path)
    assert out.returncode != 0
    assert "FLASHMLA_PERM_CACHE_DIR must be an absolute path, got 'rel/cache'" in out.stderr, out.stderr
    assert not (tmp_path / "rel").exists()


@needs_cuda_side
@pytest.mark.parametrize("value", ["garbage", "2", "nvrtc"])
def test_a_wrong_jit_switch_is_refused_at_import(value):
    out = run_python("import flashmla_perm", dict(FLASHMLA_PERM_JIT=value))
    assert out.returncode != 0 and f"FLASHMLA_PERM_JIT={value!r} is not a switch value" in out.stderr, out.stderr


# --------------------------------------------------------------------------- where NVRTC is looked for


@needs_cuda_side
def test_nvrtc_is_looked_for_at_absolute_paths_only(tmp_path):
    code = "from flashmla_perm import _ops; import json; print(json.dumps(_ops._C.nvrtc_candidates()))"
    out = run_python(code, dict(CUDA_HOME="relcuda", CUDA_PATH=str(tmp_path)), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    candidates, skipped = json.loads(out.stdout.strip().splitlines()[-1])
    assert candidates and all(c.startswith("/") for c in candidates), candidates
    assert "CUDA_HOME=relcuda (not an absolute path: skipped)" in skipped
    assert f"{tmp_path}/lib64/libnvrtc.so.{torch.version.cuda.split('.')[0]}" in candidates
    site = Path(torch.__file__).resolve().parent.parent
    assert any(c.startswith(f"{site}/nvidia/") for c in candidates[:2]), candidates  # torch's own first


@pytest.mark.skipif(not CUDA_SIDE, reason="the module has no CUDA side")
def test_a_relative_nvrtc_library_is_refused(tmp_path):
    code = """
        from flashmla_perm import _ops
        try:
            _ops._C.nvrtc_info()
        except RuntimeError as e:
            print(e)
        """
    out = run_python(code, dict(FLASHMLA_PERM_NVRTC_LIBRARY="libnvrtc.so.13"), cwd=tmp_path)
    assert "FLASHMLA_PERM_NVRTC_LIBRARY must be an absolute path, got 'libnvrtc.so.13'" in out.stdout, out


@pytest.mark.skipif(not CUDA_SIDE, reason="the module has no CUDA side")
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
    assert not (tmp_path / "nvrtc").exists() or not any((tmp_path / "nvrtc").glob("*.cubin"))


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
        "kPreferredSharedMemoryCarveout": "CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT",
        "kCarveoutMaxShared": "CU_SHAREDMEM_CARVEOUT_MAX_SHARED",
        "kCaptureStatusNone": "CU_STREAM_CAPTURE_STATUS_NONE",
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
SHIMS = {"cstdint", "cstring", "type_traits"}  # csrc/cuda/nvrtc.cpp's kShimNames


def test_nvrtc_sees_only_the_embedded_files_and_the_standard_headers_it_is_given():
    """What the kernels' file includes, and what those headers include, is
    embedded (build_config.txt's nvrtc_sources) or one of the standard
    headers csrc/cuda/nvrtc.cpp hands NVRTC: a new include in tile_bodies.h
    fails here, not at first use on a GPU."""
    if not CSRC.is_dir():
        pytest.skip("no csrc/ beside the tests")
    config = (CSRC / "build_config.txt").read_text()
    embedded = next(
        l.split("=", 1)[1].split() for l in config.splitlines() if l.split("=", 1)[0].strip() == "nvrtc_sources"
    )
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
def test_a_first_use_loads_the_kernels_built_at_install_and_compiles_nothing(tmp_path):
    code = (
        GPU_PRELUDE
        + """
        start = time.perf_counter()
        ops.permute_(t, perm, 0)
        torch.cuda.synchronize()
        print("first call ms", (time.perf_counter() - start) * 1e3)
        assert torch.equal(t, before.index_select(0, perm.cuda()))
        assert _ops._C.device_kernels(0).startswith("built at install"), _ops._C.device_kernels(0)
        print("ok")
        """
    )
    arch = "sm_%d%d" % torch.cuda.get_device_capability(0)
    if _ops._C.kernel_origin(arch)["kind"] != "install":
        pytest.skip(f"nothing built at install runs on {arch}")
    out = run_python(code, dict(FLASHMLA_PERM_CACHE_DIR=str(tmp_path)))
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    assert not (tmp_path / "nvrtc").exists() or not list((tmp_path / "nvrtc").glob("*.cubin"))


@needs_gpu
@needs_nvrtc
def test_nvrtcs_kernels_compile_at_first_use_and_permute(tmp_path):
    code = (
        GPU_PRELUDE
        + """
        ops.permute_(t, perm, 0)
        torch.cuda.synchronize()
        assert torch.equal(t, before.index_select(0, perm.cuda()))
        assert _ops._C.path_counts()["cuda"] >= 1
        print(_ops._C.device_kernels(0))
        """
    )
    env = dict(FLASHMLA_PERM_JIT="1", FLASHMLA_PERM_CACHE_DIR=str(tmp_path))
    out = run_python(code, env)
    assert out.returncode == 0 and out.stdout.strip().startswith("compiled by NVRTC"), out.stdout + out.stderr
    assert len(list((tmp_path / "nvrtc").glob("*.cubin"))) == 1
    out = run_python(code, env)
    assert out.returncode == 0 and out.stdout.strip().startswith("found in the cache"), out.stdout + out.stderr


@needs_gpu
@needs_nvrtc
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
    out = run_python(code, dict(FLASHMLA_PERM_JIT="1", FLASHMLA_PERM_CACHE_DIR=str(tmp_path)))
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
    env = dict(
        FLASHMLA_PERM_JIT="1",
        FLASHMLA_PERM_CACHE_DIR=str(tmp_path),
        FLASHMLA_PERM_NVRTC_LIBRARY=str(tmp_path / "libnvrtc.so.13"),
    )
    out = run_python(code, env)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# --------------------------------------------------------------------------- the GPUs, as the plugin sees them

FAKE_NVML = """
#include <string.h>
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 3; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)(long)(i + 1); return 0; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
  static const int cc[3][2] = {{10, 0}, {9, 0}, {10, 0}};
  long i = (long)h - 1; *major = cc[i][0]; *minor = cc[i][1]; return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_gpus_architectures_come_from_nvml_without_cuda(tmp_path):
    (tmp_path / "nvml.c").write_text(FAKE_NVML)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"), str(tmp_path / "nvml.c")], check=True
    )
    code = """
        import torch
        from flashmla_perm import _kernels
        print(_kernels.gpu_archs(), torch.cuda.is_initialized())
        """
    out = run_python(code, dict(LD_LIBRARY_PATH=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "('sm_100', 'sm_90') False", out.stdout  # no CUDA context made
    out = run_python(code)  # no NVML here: nothing, and no error
    assert out.stdout.split("\n")[-2] in ("() False", f"{tuple(sorted(_nvml_archs()))} False")


def _nvml_archs():
    from flashmla_perm import _kernels

    return _kernels.gpu_archs()


@needs_cuda_side
def test_the_plugins_words_for_a_gpu_name_where_its_kernels_come_from():
    from flashmla_perm import _kernels

    built = next(iter(INFO["kernels"]), None)
    if built is None:
        pytest.skip("no kernels built at install")
    assert _kernels.describe([built]) == f"{built} {INFO['kernels'][built]}"
    words = _kernels.describe(["sm_110"], compiling=["sm_110"])
    assert words == "sm_110 compiling in the background by NVRTC"
