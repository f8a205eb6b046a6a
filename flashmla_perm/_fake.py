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


FAKES = {name: globals()[name] for name in SCHEMAS}
