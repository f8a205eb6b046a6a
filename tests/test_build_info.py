"""build_info(): why CUDA is off, and native_error in plain words (not built;
built for another torch; a missing shared library), each with the command
that builds the module."""

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flashmla_perm
from flashmla_perm import _ops

PACKAGE = Path(flashmla_perm.__file__).resolve().parent
COMMAND = "pip install --no-build-isolation -e ."
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def stamp(version):
    return b"\x7fELF...\x00flashmla_perm built for torch " + version.encode() + b"\x00..."


def package_copy(tmp_path):
    """The package's Python sources, without any native module."""
    dest = tmp_path / "flashmla_perm"
    dest.mkdir()
    for source in PACKAGE.glob("*.py"):
        shutil.copy(source, dest)
    return dest


def build_info_of(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FLASHMLA_PERM_FORCE_REFERENCE"}
    env.pop("PYTHONPATH", None)
    # An editable install's finder would hand out the repository's _C: drop it.
    code = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path"
        " if '__editable__' not in getattr(f, '__module__', '')];"
        "import json, flashmla_perm; info = flashmla_perm.build_info();"
        " info['file'] = flashmla_perm.__file__; print(json.dumps(info))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(info["file"]).resolve().parent == (tmp_path / "flashmla_perm").resolve()
    return info


def test_cuda_off_reason_is_its_own_field():
    info = flashmla_perm.build_info()
    if info["cuda"]:
        assert info["cuda_off_reason"] is None
    else:
        assert isinstance(info["cuda_off_reason"], str) and info["cuda_off_reason"]
    if info["native"] and not info["cuda"]:
        reason = info["cuda_off_reason"]
        assert "not loaded" not in reason and "unknown" not in reason, reason
        if torch.version.cuda is None:
            assert "has no CUDA" in reason or "switched off" in reason, reason


@pytest.mark.skipif(_ops._C is None, reason="native module not loaded")
def test_the_module_names_the_torch_it_was_built_for():
    assert _ops.built_for(_ops._C.__file__) == torch.__version__


def test_not_built(tmp_path):
    package_copy(tmp_path)
    info = build_info_of(tmp_path)
    assert not info["native"]
    error = info["native_error"]
    assert error.startswith("not built"), error
    assert COMMAND in error and "circular" not in error, error
    assert "not loaded" in info["cuda_off_reason"]


def test_built_for_another_torch(tmp_path):
    (tmp_path / f"_C{SUFFIX}").write_bytes(stamp("2.9.1+cu128"))
    error = _ops.explain_native_error(
        ImportError(f"{tmp_path}/_C{SUFFIX}: undefined symbol: _ZN3c104impl3fooEv"), str(tmp_path), "2.13.0+cpu"
    )
    assert error.startswith("built for another torch"), error
    assert "built for torch 2.9.1+cu128" in error and "this is torch 2.13.0+cpu" in error, error
    assert COMMAND in error and "undefined symbol" in error, error


def test_undefined_symbol_without_a_stamp(tmp_path):
    (tmp_path / f"_C{SUFFIX}").write_bytes(b"\x7fELF no stamp")
    error = _ops.explain_native_error(ImportError("undefined symbol: _ZN3c10"), str(tmp_path), "2.13.0+cpu")
    assert "does not fit this torch 2.13.0+cpu" in error and COMMAND in error, error


@pytest.mark.parametrize("library", ["libc10_cuda.so", "libcudart.so.13"])
def test_missing_shared_library(tmp_path, library):
    (tmp_path / f"_C{SUFFIX}").write_bytes(stamp("2.14.1+cu130"))
    said = ImportError(f"{library}: cannot open shared object file: No such file or directory")
    error = _ops.explain_native_error(said, str(tmp_path), "2.13.0+cpu")
    assert f"needs the shared library {library}, which is not found" in error, error
    assert "built for torch 2.14.1+cu130" in error and "this is torch 2.13.0+cpu" in error, error
    assert COMMAND in error, error
    # Built for this very torch: the library is what is missing, not a rebuild.
    error = _ops.explain_native_error(said, str(tmp_path), "2.14.1+cu130")
    assert library in error and "LD_LIBRARY_PATH" in error and "FLASHMLA_PERM_CUDA=0" in error, error


def test_built_for_another_python(tmp_path):
    (tmp_path / "_C.cpython-39-x86_64-linux-gnu.so").write_bytes(stamp("2.13.0+cpu"))
    error = _ops.explain_native_error(ImportError("cannot import name '_C'"), str(tmp_path), "2.13.0+cpu")
    assert error.startswith("not built for this Python") and COMMAND in error, error


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_a_real_module_built_for_another_torch(tmp_path):
    """A shared object with an undefined symbol and another torch's stamp, as
    the dynamic loader reports it."""
    package = package_copy(tmp_path)
    source = tmp_path / "fake.c"
    source.write_text(
        'const char stamp[] = "flashmla_perm built for torch 0.0.1+other";\n'
        "extern void c10_symbol_of_another_torch(void);\n"
        "void *PyInit__C(void) { c10_symbol_of_another_torch(); return (void *)stamp; }\n"
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(package / f"_C{SUFFIX}"), str(source)], check=True)
    info = build_info_of(tmp_path)
    assert not info["native"]
    error = info["native_error"]
    assert "built for torch 0.0.1+other" in error and f"this is torch {torch.__version__}" in error, error
    assert "c10_symbol_of_another_torch" in error and COMMAND in error, error
