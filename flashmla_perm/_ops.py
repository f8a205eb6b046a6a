"""Loads the native module, or registers the same ops from Python on the
reference path, and registers the fake (meta) kernels either way."""

import importlib.machinery
import os
import re

import torch

from ._schemas import SCHEMAS
from ._switches import switch

# Refused at import if it is not a switch word (flashmla_perm/_switches.py).
FORCE_REFERENCE = switch("FLASHMLA_PERM_FORCE_REFERENCE", False)
BUILD_COMMAND = "`pip install --no-build-isolation -e .` in the repository (or `bash scripts/test.sh`)"
_STAMP = re.compile(rb"flashmla_perm built for torch ([\x21-\x7e]+)\x00")


def built_for(path):
    """The torch release (``torch.__version__``) a native module file was built
    against, from the stamp build_info() keeps in it; None if it has none."""
    try:
        with open(path, "rb") as f:
            found = _STAMP.search(f.read())
    except OSError:
        return None
    return found.group(1).decode() if found else None


def explain_native_error(error, package_dir, torch_version):
    """``native_error`` in plain words: why the native module cannot be used
    here and the command that builds it. ``error`` is what the import raised."""
    names = sorted(n for n in os.listdir(package_dir) if n.startswith("_C.") and n.endswith((".so", ".pyd")))
    mine = [n for n in names if n[len("_C") :] in importlib.machinery.EXTENSION_SUFFIXES]
    if not names:
        return (
            f"not built: there is no native module (_C*.so) in {package_dir}."
            f" Build it against this torch ({torch_version}): {BUILD_COMMAND}"
        )
    if not mine:
        return (
            f"not built for this Python: {', '.join(names)} in {package_dir} is for another"
            f" interpreter. Build it with this one: {BUILD_COMMAND}"
        )
    built = built_for(os.path.join(package_dir, mine[0]))
    if built is None:  # an older module: scripts/env.sh's stamp starts with the torch release
        try:
            with open(os.path.join(package_dir, ".build_stamp")) as f:
                built = f.readline().strip() or None
        except OSError:
            pass
    said = f"({type(error).__name__}: {error})"
    other_torch = built is not None and built != torch_version
    versions = (
        f"it was built for torch {built}, and this is torch {torch_version}"
        if built
        else f"it was built for a torch it does not name, and this is torch {torch_version}"
    )
    missing = re.search(r"([\w.+-]+\.so[\w.]*): cannot open shared object file", str(error))
    if missing:
        if other_torch or built is None:
            return (
                f"the native module needs the shared library {missing.group(1)}, which is not"
                f" found: {versions}. Rebuild it against this torch: {BUILD_COMMAND} {said}"
            )
        return (
            f"the native module needs the shared library {missing.group(1)}, which is not found"
            f" (put it on LD_LIBRARY_PATH, or rebuild the CPU-only module:"
            f" `FLASHMLA_PERM_CUDA=0 pip install --no-build-isolation -e .`) {said}"
        )
    if other_torch:
        return f"built for another torch: {versions}. Rebuild it against this torch: {BUILD_COMMAND} {said}"
    if "undefined symbol" in str(error):
        return (
            f"the native module does not fit this torch {torch_version} (an undefined symbol;"
            f" {versions}). Rebuild it: {BUILD_COMMAND} {said}"
        )
    return f"the native module failed to load {said}. Rebuild it: {BUILD_COMMAND}"


_C = None
native_error = None
if FORCE_REFERENCE:
    native_error = f"FLASHMLA_PERM_FORCE_REFERENCE={os.environ['FLASHMLA_PERM_FORCE_REFERENCE'].strip()}"
else:
    try:
        from . import _C  # registers torch.ops.flashmla_perm.*
    except ImportError as e:
        native_error = explain_native_error(e, os.path.dirname(os.path.abspath(__file__)), torch.__version__)

if _C is None:
    from ._fallback import IMPLS

    _lib = torch.library.Library("flashmla_perm", "DEF")
    for _name, _schema in SCHEMAS.items():
        _lib.define(_schema)
        _lib.impl(_name, IMPLS[_name], "CompositeExplicitAutograd")


from ._fake import FAKES  # noqa: E402  (after the ops are defined)

for _name in SCHEMAS:
    torch.library.register_fake(f"flashmla_perm::{_name}")(FAKES[_name])


def path_counts() -> dict:
    """Calls served by each path: ``cpu`` and ``cuda`` (the native kernels),
    ``aten`` (the native module's torch gather, for devices it has no kernels
    for), ``reference`` (the Python fallback ops, where the native module is
    not loaded)."""
    native = _C.path_counts() if _C is not None else {"cpu": 0, "cuda": 0, "aten": 0}
    from ._fallback import calls

    return {**native, "reference": calls["reference"]}
