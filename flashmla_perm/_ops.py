"""Loads the native module, or registers the same ops from Python on the
reference path, and registers the fake (meta) kernels either way."""

import os

import torch

from ._schemas import SCHEMAS

FORCE_REFERENCE = os.environ.get("FLASHMLA_PERM_FORCE_REFERENCE", "") == "1"

_C = None
native_error = "FLASHMLA_PERM_FORCE_REFERENCE=1" if FORCE_REFERENCE else None
if not FORCE_REFERENCE:
    try:
        from . import _C  # registers torch.ops.flashmla_perm.*
    except ImportError as e:
        native_error = f"{type(e).__name__}: {e}"

if _C is None:
    from ._fallback import IMPLS

    _lib = torch.library.Library("flashmla_perm", "DEF")
    for _name, _schema in SCHEMAS.items():
        _lib.define(_schema)
        _lib.impl(_name, IMPLS[_name], "CompositeExplicitAutograd")


from ._fake import FAKES

for _name in SCHEMAS:
    torch.library.register_fake(f"flashmla_perm::{_name}")(FAKES[_name])


def path_counts() -> dict:
    """Calls served by each native path: ``cpu``, ``cuda``, ``aten`` (layouts
    the kernels do not take). All zero without the native module."""
    return _C.path_counts() if _C is not None else {"cpu": 0, "cuda": 0, "aten": 0}
