"""``permute_on_load``: vLLM 0.33.0's function of that name (in
``vllm/models/deepseek_v41/common/ops/fused_layout.py``), same signature and
same bytes, permuting in place instead of through a gathered temporary."""

import torch

from . import _checks as checks
from .permutation import Permutation, checked_dim

OP = "permute_on_load"


def _copy_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """What vLLM's ``default_weight_loader`` does, for a param with no loader."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.copy_(loaded_weight.view(param.shape))
        return
    if param.size() != loaded_weight.size():
        raise ValueError(f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})")
    param.data.copy_(loaded_weight)


def permute_on_load(param: torch.Tensor, perm, dim: int) -> None:
    """Make ``param``'s weight loader permute what it loads along ``dim``.

    After the original loader (``param.weight_loader``, or a plain copy if
    there is none) returns, the param it was called with is permuted in
    place: ``fused = standard.index_select(dim, perm)`` on its bytes. That is
    the param vLLM passes, which on an in-place reload is a freshly
    materialised tensor, not the one wrapped here. ``perm`` is checked here,
    once: bad input raises (ValueError, or TypeError for a float or bool
    ``perm``) before ``param.weight_loader`` changes.
    """
    prepared = Permutation(perm, _op=OP)
    d = checked_dim(param, dim, OP, "param")
    if param.size(d) != len(prepared):
        raise ValueError(f"{OP}: perm has {len(prepared)} entries but param.size({dim}) is {param.size(d)}")
    if param.device.type != "meta":
        # Elements that share bytes; the rest of what a write needs (grad,
        # inference mode) is the mode the load runs in, checked then.
        checks.no_shared_bytes(param, OP, "param")
    original = getattr(param, "weight_loader", None) or _copy_loader

    # vLLM's layerwise reload binds a loader's arguments by name
    # (inspect.signature): the first two must be `param` and `loaded_weight`.
    def weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor, *args, **kwargs):
        result = original(param, loaded_weight, *args, **kwargs)
        # The reload counts loaded elements by a run on meta tensors: no bytes to move.
        if param.device.type != "meta":
            prepared.apply_(param.data, d)
        return result

    weight_loader.__doc__ = f"{getattr(original, '__name__', 'loader')}, then an in-place permutation of dim {d}"
    param.weight_loader = weight_loader
