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

Its settings, read at each driver call: STUB_CUDA_LOG, STUB_CUDA_ARCH
(major*10+minor, default 90), STUB_CUDA_REFUSE (cubin|ptx|all).
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "stub_cuda" / "libcuda.c"
LIBRARY = "libcuda.so.1"


NVML = """
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
static const int cc[][2] = {CCS};
int nvmlDeviceGetCount_v2(unsigned *n) { *n = sizeof cc / sizeof cc[0]; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)(long)(i + 1); return 0; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
  long i = (long)h - 1; *major = cc[i][0]; *minor = cc[i][1]; return 0;
}
"""


def build_nvml(folder, archs):
    """`folder`, with a stand-in libnvidia-ml.so.1 in it whose GPUs are `archs`
    ("sm_100", ...), in that order: what the plugin reads instead of CUDA."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ccs = ", ".join(f"{{{a[3:-1]}, {a[-1]}}}" for a in archs)
    (folder / "nvml.c").write_text(NVML.replace("CCS", ccs))
    cmd = [os.environ.get("CC") or "cc", "-shared", "-fPIC", "-o", str(folder / "libnvidia-ml.so.1")]
    subprocess.run([*cmd, str(folder / "nvml.c")], check=True)
    return folder


def build(folder):
    """`folder`, with libcuda.so.1 built into it from libcuda.c (by $CC, else cc)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or "gcc"
    cmd = [compiler, "-std=c11", "-O1", "-Wall", "-Wextra", "-shared", "-fPIC", f"-Wl,-soname,{LIBRARY}"]
    cmd += ["-o", str(Path(folder) / LIBRARY), str(SOURCE)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the stand-in CUDA driver failed: {' '.join(cmd)}\n{done.stderr}")
    return Path(folder)


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
        out.pop(f"STUB_CUDA_{name.upper()}", None)
        if value is not None:
            out[f"STUB_CUDA_{name.upper()}"] = str(value)
    return out


_LINE = re.compile(r"^\[(\d+)\] (\w+)(.*) -> (-?\d+)$")


def read_log(path):
    """The calls logged to `path`, in order: (name, fields, result) each, the
    fields a dict of the line's key=value pairs (ints where a value is a
    decimal number) with "pid" the calling process; [] where there is no
    log (nothing called the driver)."""
    calls = []
    for line in Path(path).read_text().splitlines() if Path(path).exists() else []:
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"{path}: not a stand-in driver log line: {line!r}")
        pid, name, rest, result = m.groups()
        fields = dict(pair.partition("=")[::2] for pair in rest.split())
        fields = {k: int(v) if re.fullmatch(r"-?\d+", v) else v for k, v in fields.items()}
        calls.append((name, {"pid": int(pid), **fields}, int(result)))
    return calls
