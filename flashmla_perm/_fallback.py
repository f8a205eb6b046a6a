"""The ops implemented in Python on the reference path: registered when the
native module is absent or FLASHMLA_PERM_FORCE_REFERENCE=1. Same checks, same
errors, same bytes as the native ops."""

import torch

from . import _checks as checks
from ._schemas import SCHEMAS
from . import reference as ref


def permute_rows_(self, perm):
    checks.writable(self, "permute_rows_", "self")
    checks.permutable(self, "permute_rows_")
    p = checks.permutation(perm, self.shape[0], self.device, "permute_rows_")
    if self.numel():
        ref.permute_rows_(self, p)


def permute_cols_(self, perm):
    checks.writable(self, "permute_cols_", "self")
    checks.permutable(self, "permute_cols_")
    p = checks.permutation(perm, self.shape[-1], self.device, "permute_cols_")
    if self.numel():
        ref.permute_cols_(self, p)


def permute_cols(self, perm):
    checks.permutable(self, "permute_cols")
    p = checks.permutation(perm, self.shape[-1], self.device, "permute_cols")
    return ref.permute_cols(self, p)


def permute_wq_b_(weight, weight_scale, num_local_heads, inverse=False):
    checks.wq_b(weight, weight_scale, num_local_heads)
    if weight.numel() or weight_scale.numel():
        ref._wq_b_(weight, weight_scale, num_local_heads, inverse)


def permute_wo_a_(weight, weight_scale, heads_per_group=8, inverse=False):
    checks.wo_a(weight, weight_scale, heads_per_group)
    if weight.numel() or weight_scale.numel():
        ref._wo_a_(weight, weight_scale, heads_per_group, inverse)


def permute_q(q, inverse=False):
    checks.q(q)
    if q.numel() == 0:
        return torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return ref._q(q, inverse)


def permute_(self, perm, dim=0):
    d = checks.permute_(self, perm, dim)
    p = checks.permutation(perm, self.shape[d], self.device, "permute_")
    if self.numel():
        ref.permute_(self, p, d)


def permute_q_b_proj(weight_and_scale, h_q, d_q):
    checks.q_b_proj(weight_and_scale, h_q, d_q)
    return ref.permute_q_b_proj(weight_and_scale, h_q, d_q)


def permute_wv_proj(weight_and_scale, wv_group_size, d_o):
    checks.wv_proj(weight_and_scale, wv_group_size, d_o)
    return ref.permute_wv_proj(weight_and_scale, wv_group_size, d_o)


calls = {"reference": 0}  # path_counts()["reference"]


def _counted(impl):
    def served(*args, **kwargs):
        calls["reference"] += 1
        return impl(*args, **kwargs)

    served.__name__ = impl.__name__
    return served


IMPLS = {name: _counted(globals()[name]) for name in SCHEMAS}
