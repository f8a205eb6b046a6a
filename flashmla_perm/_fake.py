"""Fake (meta) kernels: output shapes, and every check that needs no data, so
that bad arguments fail the same way under torch.compile and on meta tensors
(a meta tensor among the arguments dispatches here, not to the real kernel)."""

import torch

from . import _checks as checks
from ._schemas import SCHEMAS


def permute_rows_(self, perm):
    checks.writable(self, "permute_rows_", "self")
    checks.permutable(self, "permute_rows_")
    checks.permutation_shape(perm, self.shape[0], self.device, "permute_rows_")


def permute_cols_(self, perm):
    checks.writable(self, "permute_cols_", "self")
    checks.permutable(self, "permute_cols_")
    checks.permutation_shape(perm, self.shape[-1], self.device, "permute_cols_")


def permute_cols(self, perm):
    checks.permutable(self, "permute_cols")
    checks.permutation_shape(perm, self.shape[-1], self.device, "permute_cols")
    return torch.empty(self.shape, dtype=self.dtype, device=self.device)


def permute_wq_b_(weight, weight_scale, num_local_heads, inverse=False):
    checks.wq_b(weight, weight_scale, num_local_heads)


def permute_wo_a_(weight, weight_scale, heads_per_group=8, inverse=False):
    checks.wo_a(weight, weight_scale, heads_per_group)


def permute_q(q, inverse=False):
    checks.q(q)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def permute_(self, perm, dim=0):
    d = checks.permute_(self, perm, dim)
    checks.permutation_shape(perm, self.shape[d], self.device, "permute_")


def _mn_major_scale(scale):
    """Like reference.mn_major: ``[..., rows, W]`` with stride(-2) == 1 and
    stride(-1) == align4(rows), storage ``[..., W, align4(rows)]``."""
    *lead, rows, words = scale.shape
    pad = checks.align4(rows)
    strides = [words * pad] if lead else []
    return torch.empty_strided((*lead, rows, words), (*strides, 1, pad), dtype=scale.dtype, device=scale.device)


def permute_q_b_proj(weight_and_scale, h_q, d_q):
    checks.q_b_proj(weight_and_scale, h_q, d_q)
    weight, scale = weight_and_scale
    return [torch.empty(weight.shape, dtype=weight.dtype, device=weight.device), _mn_major_scale(scale)]


def permute_wv_proj(weight_and_scale, wv_group_size, d_o):
    checks.wv_proj(weight_and_scale, wv_group_size, d_o)
    weight, scale = weight_and_scale
    return [torch.empty(weight.shape, dtype=weight.dtype, device=weight.device), _mn_major_scale(scale)]


FAKES = {name: globals()[name] for name in SCHEMAS}
