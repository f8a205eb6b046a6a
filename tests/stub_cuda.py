"""The stand-in CUDA driver (tests/stub_cuda/libcuda.c) for tests: building it
and reading what it logged. No test functions here.

The stand-in is a libcuda.so.1 that checks every driver call the module's
host code makes, runs nothing, and appends one line per call to the file
STUB_CUDA_LOG names. A test runs the module in a process whose
LD_LIBRARY_PATH starts with build()'s folder (the module opens
"libcuda.so.1" by name), then reads the log with read_log():

    folder = stub_cuda.build(tmp_path_factory.mktemp("stub_cuda"))
    subprocess.run([...], env=stub_cuda.env(folder, log, arch=100), check=True)
    calls = stub_cuda.read_log(log)  # [("cuInit", {"pid": 123, "flags": 0, "arch": 100}, 0), ...]

Its settings (environment variables, read at the first driver call and at
each cuInit; the header of libcuda.c has the list): STUB_CUDA_LOG,
STUB_CUDA_ARCH (major*10+minor, default 90), STUB_CUDA_REFUSE
(ptx|cubin|all), STUB_CUDA_REFUSE_ERROR, STUB_CUDA_PTX_VERSION,
STUB_CUDA_CAPTURING (1|invalidated|implicit).
"""

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "stub_cuda" / "libcuda.c"
LIBRARY = "libcuda.so.1"

_built = {}  # the source's hash -> the folder it was built into, this session


def build(tmp_dir):
    """The folder holding libcuda.so.1 built from libcuda.c (with cc, or $CC):
    built into tmp_dir the first time in a session, the same folder after
    for the same source."""
    key = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    folder = _built.get(key)
    if folder is not None and (folder / LIBRARY).exists():
        return folder
    folder = Path(tmp_dir) / f"stub_cuda_{key}"
    folder.mkdir(parents=True, exist_ok=True)
    compiler = os.environ.get("CC") or shutil.which("cc") or "gcc"
    partial = folder / (LIBRARY + ".partial")
    cmd = [compiler, "-std=c11", "-O1", "-Wall", "-Wextra", "-shared", "-fPIC", f"-Wl,-soname,{LIBRARY}"]
    cmd += ["-o", str(partial), str(SOURCE), "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the stand-in CUDA driver failed: {' '.join(cmd)}\n{done.stderr}")
    partial.replace(folder / LIBRARY)  # whole or absent, for another process looking
    _built[key] = folder
    return folder


def env(folder, log=None, base=None, **settings):
    """A process environment that opens the stand-in: base (os.environ by
    default) with `folder` first on LD_LIBRARY_PATH, STUB_CUDA_LOG=log, and
    each setting as STUB_CUDA_<NAME> (arch=100 -> STUB_CUDA_ARCH=100; None
    removes one)."""
    out = dict(os.environ if base is None else base)
    out["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(folder), out.get("LD_LIBRARY_PATH")) if p)
    if log is not None:
        out["STUB_CUDA_LOG"] = str(log)
    for name, value in settings.items():
        key = "STUB_CUDA_" + name.upper()
        if value is None:
            out.pop(key, None)
        else:
            out[key] = str(value)
    return out


_LINE = re.compile(r"^\[(\d+)\] (\w+)(.*) -> (-?\d+)$")


def read_log(path):
    """The calls logged to `path`, in order: (name, fields, result) each, the
    fields a dict of the line's key=value pairs (ints where a value is a
    decimal number) with "pid" the calling process; [] where there is no
    log (nothing called the driver)."""
    path = Path(path)
    if not path.exists():
        return []
    calls = []
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"{path}: not a stand-in driver log line: {line!r}")
        pid, name, rest, result = m.groups()
        fields = {"pid": int(pid)}
        for pair in rest.split():
            key, _, value = pair.partition("=")
            fields[key] = int(value) if re.fullmatch(r"-?\d+", value) else value
        calls.append((name, fields, int(result)))
    return calls
