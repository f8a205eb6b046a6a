"""Drop-ins for FlashMLA's own weight permutations (``permute_q_b_proj`` and
``permute_wv_proj``): same arguments, same ``[weight, scale]`` results, on every
device, with the scales in DeepGEMM's packed layout (four ue8m0 bytes per
int32 word along K, MN-major, rows padded to a multiple of 4 in storage; see
docs/design.md, "FlashMLA's own layouts"). Out of place: the inputs are untouched.
The reference versions are :func:`flashmla_perm.reference.permute_q_b_proj`
and :func:`flashmla_perm.reference.permute_wv_proj`."""

from typing import List, Sequence

import torch

from . import _ops  # noqa: F401  (registers torch.ops.flashmla_perm.*)

__all__ = ["permute_q_b_proj", "permute_wv_proj"]


def permute_q_b_proj(weight_and_scale: Sequence[torch.Tensor], h_q: int, d_q: int) -> List[torch.Tensor]:
    """``(weight, scale)`` of ``q_b_proj`` -> ``[weight, scale]`` in the fused Q
    layout: fp8 ``[h_q * d_q, K]`` (new, contiguous) and its packed int32 scale
    ``[h_q * d_q, K / (4 * gran)]`` (new, MN-major: strides ``(1, align4(rows))``),
    rows permuted by the Q permutation of ``h_q`` heads of ``d_q``."""
    return torch.ops.flashmla_perm.permute_q_b_proj(list(weight_and_scale), h_q, d_q)


def permute_wv_proj(weight_and_scale: Sequence[torch.Tensor], wv_group_size: int, d_o: int) -> List[torch.Tensor]:
    """``(weight, scale)`` of ``wv_proj`` (``wo_a``) -> ``[weight, scale]`` in the
    fused O layout: fp8 ``[n_groups, out, G * d_o]`` (new, contiguous), columns
    permuted by the O permutation; packed int32 scale ``[n_groups, out, G * d_o / 128]``
    (new, stride(1) == 1), its bytes permuted by the O chunk permutation."""
    return torch.ops.flashmla_perm.permute_wv_proj(list(weight_and_scale), wv_group_size, d_o)
