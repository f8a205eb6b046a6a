"""Argument checks of the Python fallback ops, mirroring csrc/checks.cpp:
same exception types, messages that name the op and the argument, and all of
them before the first byte moves."""

import torch

Q_CHUNK = 16
O_CHUNK = 32


def writable(t: torch.Tensor, op: str, name: str) -> None:
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            f"{op}: {name} requires grad; permute weights under torch.no_grad() "
            "or on a detached tensor"
        )
    if torch._debug_has_internal_overlap(t) == 1:
        raise ValueError(
            f"{op}: {name} has overlapping memory (several elements share bytes, e.g. from "
            "expand); an in-place permutation would corrupt it"
        )


def dim(t: torch.Tensor, n: int, op: str, name: str) -> None:
    if t.dim() != n:
        raise ValueError(f"{op}: {name} must be {n}-D, got shape {list(t.shape)}")


def permutable(t: torch.Tensor, op: str) -> None:
    if t.dim() < 1:
        raise ValueError(f"{op}: self must have at least 1 dimension, got a 0-D tensor")


def positive(value: int, op: str, name: str) -> None:
    if value <= 0:
        raise ValueError(f"{op}: {name} must be positive, got {value}")


def _byte_span(t: torch.Tensor):
    if t.numel() == 0:
        return None
    start = t.storage_offset() * t.element_size()
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) * t.element_size()
    return start, start + last + t.element_size()


def _without_data(t: torch.Tensor) -> bool:
    return t.device.type == "meta" or isinstance(t, torch._subclasses.FakeTensor)


def pair(a: torch.Tensor, b: torch.Tensor, op: str, name_a: str, name_b: str) -> None:
    if a.device != b.device:
        raise ValueError(f"{op}: {name_b} is on {b.device} but {name_a} is on {a.device}")
    if _without_data(a) or _without_data(b):
        return
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return
    sa, sb = _byte_span(a), _byte_span(b)
    if sa and sb and sa[0] < sb[1] and sb[0] < sa[1]:
        raise ValueError(f"{op}: {name_a} and {name_b} share memory")


def permutation_shape(perm: torch.Tensor, extent: int, device: torch.device, op: str) -> None:
    """Everything about ``perm`` but its values (all a fake kernel can see)."""
    if perm.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: perm must be int64 or int32, got {perm.dtype}")
    if perm.dim() != 1:
        raise ValueError(f"{op}: perm must be 1-D, got shape {list(perm.shape)}")
    if perm.numel() != extent:
        raise ValueError(
            f"{op}: perm has {perm.numel()} entries but the permuted dimension has {extent}"
        )
    if perm.device.type != "cpu" and perm.device != device:
        raise ValueError(f"{op}: perm is on {perm.device} but self is on {device}")


def permutation(perm: torch.Tensor, extent: int, device: torch.device, op: str) -> torch.Tensor:
    """``perm`` as a CPU int64 tensor, after checking that it permutes [0, extent)."""
    permutation_shape(perm, extent, device, op)
    p = perm.to("cpu", torch.long)
    if extent == 0:
        return p
    bad = (p < 0) | (p >= extent)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"{op}: perm is not a permutation: index {int(p[i])} at position {i} is out of "
            f"range [0, {extent})"
        )
    counts = torch.bincount(p, minlength=extent)
    if (counts > 1).any():
        v = int((counts > 1).nonzero()[0])
        raise ValueError(f"{op}: perm is not a permutation: index {v} appears more than once")
    return p


def weight_and_scale(weight, weight_scale, heads, heads_name, op) -> None:
    """What both model ops ask of their arguments before their own shape rules."""
    writable(weight, op, "weight")
    writable(weight_scale, op, "weight_scale")
    dim(weight, 2, op, "weight")
    dim(weight_scale, 2, op, "weight_scale")
    positive(heads, op, heads_name)
    pair(weight, weight_scale, op, "weight", "weight_scale")


def head_dim_of(weight, dim_, heads, heads_name, chunk, op) -> int:
    """weight.size(dim_) cut into `heads` heads; their head_dim, a multiple of `chunk`."""
    n = weight.shape[dim_]
    if n % heads:
        raise ValueError(f"{op}: {heads_name} ({heads}) must divide weight.size({dim_}) ({n})")
    head_dim = n // heads
    if head_dim % chunk:
        raise ValueError(
            f"{op}: head_dim = weight.size({dim_}) / {heads_name} = {head_dim} must be a "
            f"multiple of {chunk}"
        )
    return head_dim


def wq_b(weight, weight_scale, num_local_heads, op="permute_wq_b_") -> None:
    weight_and_scale(weight, weight_scale, num_local_heads, "num_local_heads", op)
    rows = weight.shape[0]
    head_dim_of(weight, 0, num_local_heads, "num_local_heads", Q_CHUNK, op)
    if weight_scale.shape[0] != rows:
        raise ValueError(f"{op}: weight_scale has {weight_scale.shape[0]} rows but weight has {rows}")


def wo_a(weight, weight_scale, heads_per_group, op="permute_wo_a_") -> None:
    weight_and_scale(weight, weight_scale, heads_per_group, "heads_per_group", op)
    cols = weight.shape[1]
    head_dim_of(weight, 1, heads_per_group, "heads_per_group", O_CHUNK, op)
    if list(weight_scale.shape) != [weight.shape[0], cols // O_CHUNK]:
        raise ValueError(
            f"{op}: weight_scale must have shape [{weight.shape[0]}, {cols // O_CHUNK}] (one "
            f"scale per 32 columns of weight), got {list(weight_scale.shape)}"
        )


def q(q: torch.Tensor, op="permute_q") -> None:
    dim(q, 3, op, "q")
    if q.shape[2] % Q_CHUNK:
        raise ValueError(
            f"{op}: head_dim = q.size(2) = {q.shape[2]} must be a multiple of {Q_CHUNK}"
        )
