"""In-place load-time permutations of DeepSeek-V4.1 ``wq_b`` / ``wo_a`` weights
for FlashMLA's mega-attention kernel.

Same names, signatures and results as the reference functions
(:mod:`flashmla_perm.reference`), plus the inverses. Everything also runs as
``torch.ops.flashmla_perm.*``.
"""

import torch

from . import _ops
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
    """What runs here, calling nothing of CUDA: ``native`` (the native module
    loaded), ``cuda`` (its CUDA side), ``cuda_compiler`` (``"NVRTC 13.0"``,
    torch's, which built the kernels at install), ``cuda_archs`` (the cubins:
    each also runs on the later minors of its family), ``cuda_ptx`` (the PTX
    image any later GPU loads), ``devices`` (each CUDA device this process
    used: what loaded on it, or why torch's gather serves it), ``torch`` (the
    version built against), ``version``; ``native_error`` says why the native
    module is not used, if it is not, and ``cuda_off_reason`` why the CUDA
    side is off (None when it is on)."""
    info = {
        "native": _ops._C is not None,
        "cuda": False,
        "cuda_compiler": None,
        "cuda_archs": [],
        "cuda_ptx": None,
        "devices": {},
        "torch": None,
        "version": __version__,
        "native_error": _ops.native_error,
        "cuda_off_reason": "the native module is not loaded (see native_error)",
    }
    if _ops._C is not None:
        built = _ops._C.build_info()
        info["cuda"] = bool(built["cuda"])
        info["cuda_compiler"] = built["cuda_compiler"] or None
        info["cuda_archs"] = [i for i in built["images"] if i.startswith("sm_")]
        info["cuda_ptx"] = next((i for i in built["images"] if i.startswith("compute_")), None)
        info["torch"] = built["torch"]
        info["cuda_off_reason"] = None if info["cuda"] else built["cuda_off_reason"]
        if info["cuda"]:
            info["devices"] = _ops._C.device_kernels()
    return info
