"""In-place load-time permutations of DeepSeek-V4.1 ``wq_b`` / ``wo_a`` weights
for FlashMLA's mega-attention kernel.

Same names, signatures and results as the reference functions
(:mod:`flashmla_perm.reference`), plus the inverses. Everything also runs as
``torch.ops.flashmla_perm.*``.
"""

import os

import torch


from . import _ops, _switches
from . import flashmla  # noqa: F401  (fp.flashmla.permute_q_b_proj)
from ._ops import path_counts
from ._version import __version__
from .on_load import permute_on_load
from .permutation import Permutation
from .reference import (
    HEAD_DIM,
    O_CHUNK,
    Q_CHUNK,
    WV_GROUP_SIZE,
    inverse_permutation,
    o_fused_chunk_permutation,
    o_fused_permutation,
    q_fused_permutation,
)

# What the native module reads of the environment, refused at import where
# wrong (it checks again where it reads them).
_switches.switch("FLASHMLA_PERM_JIT", False)
if os.environ.get("FLASHMLA_PERM_CACHE_DIR", "") and not os.path.isabs(os.environ["FLASHMLA_PERM_CACHE_DIR"]):
    raise ValueError(
        "flashmla_perm: FLASHMLA_PERM_CACHE_DIR must be an absolute path, "
        f"got {os.environ['FLASHMLA_PERM_CACHE_DIR']!r}"
    )

__all__ = [
    "HEAD_DIM",
    "Q_CHUNK",
    "O_CHUNK",
    "WV_GROUP_SIZE",
    "q_fused_permutation",
    "o_fused_permutation",
    "o_fused_chunk_permutation",
    "inverse_permutation",
    "permute_q_to_fused",
    "permute_q_from_fused",
    "permute_wq_b_",
    "unpermute_wq_b_",
    "permute_wo_a_",
    "unpermute_wo_a_",
    "permute_",
    "Permutation",
    "permute_on_load",
    "build_info",
    "path_counts",
]

_ops_ns = torch.ops.flashmla_perm


def permute_q_to_fused(q: torch.Tensor) -> torch.Tensor:
    """``[N, H, D]`` standard layout -> the same shape, fused layout (new tensor)."""
    return _ops_ns.permute_q(q)


def permute_q_from_fused(q: torch.Tensor) -> torch.Tensor:
    """Undoes :func:`permute_q_to_fused`."""
    return _ops_ns.permute_q(q, True)


def permute_(t: torch.Tensor, perm: torch.Tensor, dim: int = 0) -> None:
    """``t.copy_(t.index_select(dim, perm))`` in place, bits exact: any dim
    (negative too), any rank >= 1, any dtype, any strides whose elements do
    not overlap (transposed, stepped slices, storage offsets). Bytes of the
    storage outside the view never move."""
    _ops_ns.permute_(t, perm, dim)


def permute_wq_b_(weight: torch.Tensor, weight_scale: torch.Tensor, num_local_heads: int) -> None:
    """Permute the rows of a ``wq_b`` shard and its per-row scale in place (any
    strides and dtypes: DeepGEMM's packed MN-major int32 scale too)."""
    _ops_ns.permute_wq_b_(weight, weight_scale, num_local_heads)


def unpermute_wq_b_(weight: torch.Tensor, weight_scale: torch.Tensor, num_local_heads: int) -> None:
    """Undoes :func:`permute_wq_b_`."""
    _ops_ns.permute_wq_b_(weight, weight_scale, num_local_heads, True)


def permute_wo_a_(weight: torch.Tensor, weight_scale: torch.Tensor, heads_per_group: int = WV_GROUP_SIZE) -> None:
    """Permute the input columns of a ``wo_a`` shard (``[rows, G * D]`` or
    ``[n_groups, out, G * D]``) and its scale in place: one scale element per 32
    columns, or int32 with four packed ue8m0 bytes per word (bytes cross words)."""
    _ops_ns.permute_wo_a_(weight, weight_scale, heads_per_group)


def unpermute_wo_a_(weight: torch.Tensor, weight_scale: torch.Tensor, heads_per_group: int = WV_GROUP_SIZE) -> None:
    """Undoes :func:`permute_wo_a_`."""
    _ops_ns.permute_wo_a_(weight, weight_scale, heads_per_group, True)


def build_info() -> dict:
    """What runs here: ``native`` (the native module loaded), ``cuda`` (its
    CUDA side), ``kernels`` (per architecture, where its kernels come from:
    ``"built at install by nvcc 13.0.88"`` or ``"... by NVRTC 13.0"``; each
    also runs on the later minors of its family; any other architecture's
    are compiled at first use by NVRTC and cached in ``kernel_cache``, and
    listed here once this process has them),
    ``cuda_archs`` (those built at install), ``cuda_compiler`` (``"nvcc"``
    where nvcc built them, else ``"nvrtc"``; None without CUDA), ``torch``
    (the version built against), ``version``; ``native_error`` says why the
    native module is not used, if it is not, and ``cuda_off_reason`` why the
    CUDA side is off (None when it is on)."""
    info = {
        "native": _ops._C is not None,
        "cuda": False,
        "cuda_compiler": None,
        "cuda_archs": [],
        "kernels": {},
        "kernel_cache": None,
        "torch": None,
        "version": __version__,
        "native_error": _ops.native_error,
        "cuda_off_reason": "the native module is not loaded (see native_error)",
    }
    if _ops._C is not None:
        built = _ops._C.build_info()
        info["cuda"] = bool(built["cuda"])
        info["cuda_compiler"] = built.get("cuda_compiler") or None
        info["kernels"] = {arch: f"built at install by {by}" for arch, by in built.get("kernels", [])}
        info["cuda_archs"] = list(info["kernels"])
        info["torch"] = built["torch"]
        info["cuda_off_reason"] = (
            None
            if info["cuda"]
            else (built.get("cuda_off_reason") or "unknown (a module built before it recorded why)")
        )
        if info["cuda"]:
            info["kernels"].update(_ops._C.compiled_kernels())  # this process's first uses
            info["kernel_cache"] = _ops._C.kernel_cache_dir()
    return info
