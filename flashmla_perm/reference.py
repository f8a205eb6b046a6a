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


def o_fused_permutation(heads_per_group: int = WV_GROUP_SIZE, head_dim: int = HEAD_DIM) -> torch.Tensor:
    """``fused[(c * G + h) * 32 + j] = standard[h * D + c * 32 + j]`` for one group."""
    h = torch.arange(heads_per_group).view(-1, 1, 1)
    c = torch.arange(head_dim // O_CHUNK).view(1, -1, 1)
    j = torch.arange(O_CHUNK).view(1, 1, -1)
    fused_pos = (c * heads_per_group + h) * O_CHUNK + j
    perm = torch.empty(heads_per_group * head_dim, dtype=torch.long)
    perm[fused_pos.reshape(-1)] = (h * head_dim + c * O_CHUNK + j).reshape(-1)
    return perm


def o_fused_chunk_permutation(heads_per_group: int = WV_GROUP_SIZE, head_dim: int = HEAD_DIM) -> torch.Tensor:
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


def permute_(t: torch.Tensor, perm: torch.Tensor, dim: int = 0) -> None:
    """``t.copy_(t.index_select(dim, perm))`` on the bits, in place; any strides.
    Only the view's elements are written (storage around it never is)."""
    b = _bits(t)
    b.copy_(b.index_select(dim, perm.to(t.device, torch.long)))


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
    head_dim = weight.shape[-1] // heads_per_group
    perm = o_fused_permutation(heads_per_group, head_dim)
    chunk_perm = o_fused_chunk_permutation(heads_per_group, head_dim)
    if inverse:
        perm, chunk_perm = inverse_permutation(perm), inverse_permutation(chunk_perm)
    permute_cols_(weight, perm)
    if weight_scale.shape[-1] == weight.shape[-1] // O_CHUNK:
        permute_cols_(weight_scale, chunk_perm)  # one scale element per 32 columns
    else:  # int32, four packed ue8m0 bytes per word: the bytes move, across words
        permute_packed_ue8m0_(weight_scale, chunk_perm)


def permute_wq_b_(weight: torch.Tensor, weight_scale: torch.Tensor, num_local_heads: int) -> None:
    """Rows of an MXFP8 ``wq_b`` shard and its per-row scale, in place. Any
    strides and dtypes (DeepGEMM's packed MN-major int32 scale too: each row's
    words move with the row)."""
    _wq_b_(weight, weight_scale, num_local_heads, inverse=False)


def unpermute_wq_b_(weight: torch.Tensor, weight_scale: torch.Tensor, num_local_heads: int) -> None:
    _wq_b_(weight, weight_scale, num_local_heads, inverse=True)


def permute_wo_a_(weight: torch.Tensor, weight_scale: torch.Tensor, heads_per_group: int = WV_GROUP_SIZE) -> None:
    """Input columns of an MXFP8 ``wo_a`` shard (``[rows, G * D]`` or
    ``[n_groups, out, G * D]``, any strides) and its scale, in place: one scale
    element per 32 columns, or int32 with four packed ue8m0 bytes per word."""
    _wo_a_(weight, weight_scale, heads_per_group, inverse=False)


def unpermute_wo_a_(weight: torch.Tensor, weight_scale: torch.Tensor, heads_per_group: int = WV_GROUP_SIZE) -> None:
    _wo_a_(weight, weight_scale, heads_per_group, inverse=True)


# --------------------------------------------------------------------------- DeepGEMM's packed scales
#
# Four ue8m0 bytes per int32 word along K, little-endian: byte j of word w is
# the scale of K-block 4w + j. Written from that definition (shifts and masks),
# not from the machine's byte order.


def unpack_ue8m0(words: torch.Tensor) -> torch.Tensor:
    """``[..., W]`` int32 (any strides) -> ``[..., 4W]`` uint8, the scales in K order."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = 8 * torch.arange(4, dtype=torch.int64, device=words.device)
    b = (w.unsqueeze(-1) >> shifts) & 0xFF  # [..., W, 4]
    return b.reshape(*words.shape[:-1], 4 * words.shape[-1]).to(torch.uint8)


def pack_ue8m0(bytes_u8: torch.Tensor) -> torch.Tensor:
    """``[..., 4W]`` uint8 -> ``[..., W]`` int32 (contiguous): the inverse of unpack_ue8m0."""
    b = bytes_u8.to(torch.int64).reshape(*bytes_u8.shape[:-1], bytes_u8.shape[-1] // 4, 4)
    shifts = 8 * torch.arange(4, dtype=torch.int64, device=bytes_u8.device)
    w = (b << shifts).sum(-1)  # [0, 2^32)
    w = torch.where(w >= 2**31, w - 2**32, w)  # two's complement wrap
    return w.to(torch.int32).contiguous()


def mn_major(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``[rows, W]`` (or ``[n, rows, W]``) in MN-major padded storage:
    fresh zero-filled ``[W, align4(rows)]`` (``[n, W, align4(rows)]``) seen
    through its transpose, sliced to ``rows``. stride(-2) == 1,
    stride(-1) == align4(rows); the padding rows stay zero."""
    rows, w = t.shape[-2], t.shape[-1]
    storage = torch.zeros((*t.shape[:-2], w, _align4(rows)), dtype=t.dtype, device=t.device)
    view = storage.transpose(-1, -2)[..., :rows, :]
    view.copy_(t)
    return view


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4


def permute_packed_ue8m0_(scale: torch.Tensor, chunk_perm: torch.Tensor) -> None:
    """The bytes of a packed int32 scale gathered by ``chunk_perm`` along K
    (bytes cross words), written back into the view: any strides, storage
    padding untouched."""
    b = unpack_ue8m0(scale)
    scale.copy_(pack_ue8m0(b[..., chunk_perm.to(scale.device)]))


# --------------------------------------------------------------------------- FlashMLA's ops, out of place


def permute_q_b_proj(weight_and_scale, h_q: int, d_q: int):
    """FlashMLA's ``permute_q_b_proj``: ``[weight, scale]``, new tensors. Rows of
    the fp8 weight ``[h_q * d_q, K]`` and of its packed MN-major int32 scale
    ``[h_q * d_q, K / (4 * gran)]`` permuted by the Q permutation; the weight
    contiguous, the scale in fresh MN-major padded storage (mn_major)."""
    weight, scale = weight_and_scale
    perm = q_fused_permutation(h_q, d_q).to(weight.device)
    out_weight = _bits(weight)[perm].contiguous().view(weight.dtype)
    return [out_weight, mn_major(scale[perm.to(scale.device)])]


def permute_wv_proj(weight_and_scale, wv_group_size: int, d_o: int):
    """FlashMLA's ``permute_wv_proj``: ``[weight, scale]``, new tensors. In every
    row of the fp8 weight ``[n_groups, out, G * d_o]`` the O permutation of the
    columns; the bytes of the packed int32 scale ``[n_groups, out, G * d_o / 128]``
    by the O chunk permutation, returned in fresh MN-major padded storage."""
    weight, scale = weight_and_scale
    perm = o_fused_permutation(wv_group_size, d_o).to(weight.device)
    chunk_perm = o_fused_chunk_permutation(wv_group_size, d_o).to(scale.device)
    out_weight = _bits(weight)[..., perm].contiguous().view(weight.dtype)
    out_scale = mn_major(pack_ue8m0(unpack_ue8m0(scale)[..., chunk_perm]))
    return [out_weight, out_scale]
