"""The plain-torch implementation: gather into a temporary, copy back.

This is the oracle the tests compare against and the fallback where no native
code runs. 1-byte dtypes are moved through a uint8 view, so every result is
the exact bytes of the gather (NaN payloads included). Every permutation here
satisfies ``fused = standard[perm]``. No argument checks: the ops do those.
"""

import torch

HEAD_DIM = 512
Q_CHUNK = 16
O_CHUNK = 32
WV_GROUP_SIZE = 8


def q_fused_permutation(num_heads: int, head_dim: int = HEAD_DIM) -> torch.Tensor:
    """``fused[(d // 16) * (H * 16) + h * 16 + d % 16] = standard[h * D + d]``."""
    h = torch.arange(num_heads).view(-1, 1)
    d = torch.arange(head_dim).view(1, -1)
    fused_pos = (d // Q_CHUNK) * (num_heads * Q_CHUNK) + h * Q_CHUNK + d % Q_CHUNK
    perm = torch.empty(num_heads * head_dim, dtype=torch.long)
    perm[fused_pos.reshape(-1)] = (h * head_dim + d).reshape(-1)
    return perm


def o_fused_permutation(
    heads_per_group: int = WV_GROUP_SIZE, head_dim: int = HEAD_DIM
) -> torch.Tensor:
    """``fused[(c * G + h) * 32 + j] = standard[h * D + c * 32 + j]`` for one group."""
    h = torch.arange(heads_per_group).view(-1, 1, 1)
    c = torch.arange(head_dim // O_CHUNK).view(1, -1, 1)
    j = torch.arange(O_CHUNK).view(1, 1, -1)
    fused_pos = (c * heads_per_group + h) * O_CHUNK + j
    perm = torch.empty(heads_per_group * head_dim, dtype=torch.long)
    perm[fused_pos.reshape(-1)] = (h * head_dim + c * O_CHUNK + j).reshape(-1)
    return perm


def o_fused_chunk_permutation(
    heads_per_group: int = WV_GROUP_SIZE, head_dim: int = HEAD_DIM
) -> torch.Tensor:
    """The O permutation on 32-element chunks (for the per-32 scales)."""
    return o_fused_permutation(heads_per_group, head_dim)[::O_CHUNK] // O_CHUNK


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    """``inv`` with ``inv[perm] = arange``: ``x[perm][inv] == x``."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), dtype=perm.dtype, device=perm.device)
    return inv


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def permute_rows_(t: torch.Tensor, perm: torch.Tensor) -> None:
    b = _bits(t)
    b.copy_(b[perm.to(t.device)])


def permute_cols_(t: torch.Tensor, perm: torch.Tensor) -> None:
    b = _bits(t)
    b.copy_(b[..., perm.to(t.device)])


def permute_cols(t: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    return _bits(t)[..., perm.to(t.device)].contiguous().view(t.dtype)


def _q(q: torch.Tensor, inverse: bool) -> torch.Tensor:
    n, h, d = q.shape
    perm = q_fused_permutation(h, d)
    if inverse:
        perm = inverse_permutation(perm)
    return permute_cols(q.reshape(n, h * d), perm).view(n, h, d)


def permute_q_to_fused(q: torch.Tensor) -> torch.Tensor:
    """``[N, H, D]`` standard layout -> the same shape, fused layout (new tensor)."""
    return _q(q, inverse=False)


def permute_q_from_fused(q: torch.Tensor) -> torch.Tensor:
    """Undoes :func:`permute_q_to_fused`."""
    return _q(q, inverse=True)


def _wq_b_(weight, weight_scale, num_local_heads, inverse):
    perm = q_fused_permutation(num_local_heads, weight.shape[0] // num_local_heads)
    if inverse:
        perm = inverse_permutation(perm)
    for t in (weight, weight_scale):
        permute_rows_(t, perm)


def _wo_a_(weight, weight_scale, heads_per_group, inverse):
    head_dim = weight.shape[1] // heads_per_group
    perm = o_fused_permutation(heads_per_group, head_dim)
    chunk_perm = o_fused_chunk_permutation(heads_per_group, head_dim)
    if inverse:
        perm, chunk_perm = inverse_permutation(perm), inverse_permutation(chunk_perm)
    permute_cols_(weight, perm)
    permute_cols_(weight_scale, chunk_perm)


def permute_wq_b_(weight: torch.Tensor, weight_scale: torch.Tensor, num_local_heads: int) -> None:
    """Rows of an MXFP8 ``wq_b`` shard and its per-row scale, in place."""
    _wq_b_(weight, weight_scale, num_local_heads, inverse=False)


def unpermute_wq_b_(weight: torch.Tensor, weight_scale: torch.Tensor, num_local_heads: int) -> None:
    _wq_b_(weight, weight_scale, num_local_heads, inverse=True)


def permute_wo_a_(
    weight: torch.Tensor, weight_scale: torch.Tensor, heads_per_group: int = WV_GROUP_SIZE
) -> None:
    """Input columns of an MXFP8 ``wo_a`` shard and its per-32-column scale, in place."""
    _wo_a_(weight, weight_scale, heads_per_group, inverse=False)


def unpermute_wo_a_(
    weight: torch.Tensor, weight_scale: torch.Tensor, heads_per_group: int = WV_GROUP_SIZE
) -> None:
    _wo_a_(weight, weight_scale, heads_per_group, inverse=True)
