"""Prepared permutations: validated once, applied in place to any number of
tensors, on any device and layout the package serves."""

import torch

from . import _checks as checks
from .reference import inverse_permutation

_ops_ns = torch.ops.flashmla_perm


def checked_dim(t: torch.Tensor, dim: int, op: str, name: str) -> int:
    """``dim`` of ``t``, made non-negative; ValueError naming ``name`` if out of range."""
    n = t.dim()
    if isinstance(dim, bool) or not isinstance(dim, int) or not -n <= dim < n:
        raise ValueError(
            f"{op}: dim ({dim!r}) is out of range for a {n}-D {name} (expected an int from {-n} to {n - 1})"
        )
    return dim % n


class Permutation:
    """``fused = standard.index_select(dim, perm)``, prepared once.

    ``perm`` (a 1-D int64 or int32 tensor on any device, or a sequence of
    ints) is checked to be a permutation here, once, and kept as a private CPU
    copy. :meth:`apply_` permutes a tensor in place, natively. The native
    module finds the plan of a CPU permutation by its values, so after the
    first use on a device (which builds the plan and uploads its index arrays)
    an application does no host-to-device copy and no host synchronisation,
    and can be captured in a CUDA graph. Permutations with the same values
    share one plan (the 43 layers of a model, for instance).
    """

    __slots__ = ("_perm",)

    def __init__(self, perm, *, _op: str = "Permutation"):
        if isinstance(perm, Permutation):
            self._perm = perm._perm
            return
        t = perm if isinstance(perm, torch.Tensor) else torch.as_tensor(perm)
        if t.numel() == 0 and not isinstance(perm, torch.Tensor):
            t = t.long()  # [] reads as float32: no value says it is not ints
        if t.dim() != 1:
            raise ValueError(f"{_op}: perm must be 1-D, got shape {list(t.shape)}")
        # A copy of its own: nobody can change the values once checked.
        self._perm = checks.permutation(t, t.numel(), t.device, _op).clone()

    def __len__(self) -> int:
        return self._perm.numel()

    def __repr__(self) -> str:
        return f"Permutation({self._perm.tolist() if len(self) <= 16 else f'<{len(self)} indices>'})"

    @property
    def indices(self) -> torch.Tensor:
        """The permutation as a new CPU int64 tensor."""
        return self._perm.clone()

    def apply_(self, t: torch.Tensor, dim: int = 0) -> None:
        """``t.copy_(t.index_select(dim, perm))`` in place, bits exact."""
        _ops_ns.permute_(t, self._perm, dim)

    def inverse(self) -> "Permutation":
        """The permutation that undoes this one."""
        return Permutation(inverse_permutation(self._perm))
