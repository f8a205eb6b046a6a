"""Argument checks of the Python fallback ops, mirroring csrc/checks.cpp:
same exception types, messages that name the op and the argument, and all of
them before the first byte moves."""

import torch

from ._overlap import NO, UNKNOWN, YES, byte_overlap, byte_self_overlap

Q_CHUNK = 16
O_CHUNK = 32


def _layout(t: torch.Tensor, offset: int):
    es = t.element_size()
    return offset, es, [(int(m), int(st) * es) for m, st in zip(t.shape, t.stride())]


def _symbolic(t: torch.Tensor) -> bool:
    return not all(isinstance(v, int) for v in list(t.shape) + list(t.stride()))


def dense(t: torch.Tensor, op: str, name: str) -> None:
    """A tensor at all, and one of strides (a sparse one has no bytes to move)."""
    if t is None:
        raise ValueError(f"{op}: {name} is an undefined tensor")
    if t.layout != torch.strided:
        raise ValueError(f"{op}: {name} must be a dense (strided) tensor, got layout {t.layout}")


def writable(t: torch.Tensor, op: str, name: str) -> None:
    dense(t, op, name)
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{op}: {name} requires grad; permute weights under torch.no_grad() or on a detached tensor")
    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(
            f"{op}: {name} is an inference tensor (made under torch.inference_mode()), which "
            "cannot be written in place outside inference mode; permute it under "
            "torch.inference_mode(), or a clone"
        )
    no_shared_bytes(t, op, name)


def no_shared_bytes(t: torch.Tensor, op: str, name: str) -> None:
    """No element of ``t`` reachable twice through its strides."""
    # Pitches alone decide it (fake tensors too); symbolic ones are left to
    # the real kernel.
    if not _symbolic(t) and byte_self_overlap(_layout(t, 0)) != NO:
        raise ValueError(
            f"{op}: {name} has overlapping memory (several elements share bytes, e.g. from "
            "expand), or interleaved strides that cannot be proven apart; an in-place "
            "permutation would corrupt it (permute a .contiguous() copy)"
        )


def dim(t: torch.Tensor, n: int, op: str, name: str) -> None:
    if t.dim() != n:
        raise ValueError(f"{op}: {name} must be {n}-D, got shape {list(t.shape)}")


def permutable(t: torch.Tensor, op: str) -> None:
    dense(t, op, "self")
    if t.dim() < 1:
        raise ValueError(f"{op}: self must have at least 1 dimension, got a 0-D tensor")


def positive(value: int, op: str, name: str) -> None:
    if value <= 0:
        raise ValueError(f"{op}: {name} must be positive, got {value}")


def _without_data(t: torch.Tensor) -> bool:
    return t.device.type == "meta" or isinstance(t, torch._subclasses.FakeTensor)


def pair(a: torch.Tensor, b: torch.Tensor, op: str, name_a: str, name_b: str) -> None:
    if a.device != b.device:
        raise ValueError(f"{op}: {name_b} is on {b.device} but {name_a} is on {a.device}")
    if _without_data(a) or _without_data(b):
        return
    if a.numel() == 0 or b.numel() == 0 or _symbolic(a) or _symbolic(b):
        return
    # Addresses, as csrc/checks.cpp: tensors of separate allocations are far
    # apart, views of one buffer (or memory aliased from outside torch) meet.
    o = byte_overlap(_layout(a, a.data_ptr()), _layout(b, b.data_ptr()))
    if o == YES:
        raise ValueError(f"{op}: {name_a} and {name_b} share memory")
    if o == UNKNOWN:
        raise ValueError(
            f"{op}: {name_a} and {name_b} may share memory (their layouts could not be proven "
            "apart; permute .contiguous() copies)"
        )


def permutation_shape(perm: torch.Tensor, extent: int, device: torch.device, op: str) -> None:
    """Everything about ``perm`` but its values (all a fake kernel can see)."""
    dense(perm, op, "perm")
    if perm.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: perm must be int64 or int32, got {perm.dtype}")
    if perm.dim() != 1:
        raise ValueError(f"{op}: perm must be 1-D, got shape {list(perm.shape)}")
    if perm.numel() != extent:
        raise ValueError(f"{op}: perm has {perm.numel()} entries but the permuted dimension has {extent}")
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
            f"{op}: perm is not a permutation: index {int(p[i])} at position {i} is out of range [0, {extent})"
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
            f"{op}: head_dim = weight.size({dim_}) / {heads_name} = {head_dim} must be a multiple of {chunk}"
        )
    return head_dim


def wq_b(weight, weight_scale, num_local_heads, op="permute_wq_b_") -> None:
    weight_and_scale(weight, weight_scale, num_local_heads, "num_local_heads", op)
    rows = weight.shape[0]
    head_dim_of(weight, 0, num_local_heads, "num_local_heads", Q_CHUNK, op)
    if weight_scale.shape[0] != rows:
        raise ValueError(f"{op}: weight_scale has {weight_scale.shape[0]} rows but weight has {rows}")


def wo_a(weight, weight_scale, heads_per_group, op="permute_wo_a_") -> None:
    """weight ``[rows, G * D]`` or ``[n_groups, out, G * D]``; weight_scale the same
    leading dims and one scale per 32 columns, or (int32) four packed per word."""
    writable(weight, op, "weight")
    writable(weight_scale, op, "weight_scale")
    if weight.dim() not in (2, 3):
        raise ValueError(f"{op}: weight must be 2-D or 3-D, got shape {list(weight.shape)}")
    if weight_scale.dim() != weight.dim():
        raise ValueError(
            f"{op}: weight_scale must be {weight.dim()}-D like weight, got shape {list(weight_scale.shape)}"
        )
    positive(heads_per_group, op, "heads_per_group")
    pair(weight, weight_scale, op, "weight", "weight_scale")
    cols = weight.shape[-1]
    head_dim_of(weight, weight.dim() - 1, heads_per_group, "heads_per_group", O_CHUNK, op)
    if wo_a_scale_form(weight, weight_scale) is None:
        lead = list(weight.shape[:-1])
        raise ValueError(
            f"{op}: weight_scale must have shape {lead + [cols // O_CHUNK]} (one scale per 32 "
            f"columns of weight) or, int32, {lead + [cols // PACKED_COLUMNS]} (four packed "
            f"scales per word), got {list(weight_scale.shape)}"
        )


PACKED_COLUMNS = 4 * O_CHUNK  # weight columns one packed int32 scale word covers


def wo_a_scale_form(weight, weight_scale):
    """ "elements" (one scale element per 32 columns), "packed" (int32, four ue8m0
    bytes per word), or None when weight_scale fits neither."""
    lead, cols = list(weight.shape[:-1]), weight.shape[-1]
    shape = list(weight_scale.shape)
    if shape == lead + [cols // O_CHUNK]:
        return "elements"
    if weight_scale.dtype == torch.int32 and cols % PACKED_COLUMNS == 0 and shape == lead + [cols // PACKED_COLUMNS]:
        return "packed"
    return None


def align4(n: int) -> int:
    return (n + 3) // 4 * 4


def _two_tensors(weight_and_scale, op):
    if len(weight_and_scale) != 2:
        raise ValueError(f"{op}: weight_and_scale must be (weight, scale), got {len(weight_and_scale)} tensors")
    dense(weight_and_scale[0], op, "weight")
    dense(weight_and_scale[1], op, "scale")
    return weight_and_scale


def _fp8_weight(weight, op):
    if weight.dtype != torch.float8_e4m3fn:
        raise TypeError(f"{op}: weight must be float8_e4m3fn, got {weight.dtype}")


def _packed_scale_dtype(scale, op):
    if scale.dtype != torch.int32:
        raise TypeError(f"{op}: scale must be int32 (packed ue8m0), got {scale.dtype}")


def _same_device(weight, scale, op):
    """The drop-ins only read their inputs: they may share memory, not devices."""
    if weight.device != scale.device:
        raise ValueError(f"{op}: scale is on {scale.device} but weight is on {weight.device}")


def _drop_in_inputs(weight_and_scale, rank, heads, heads_name, head_dim, head_dim_name, chunk, op):
    """The drop-ins' common checks (csrc/ops.cpp, drop_in_inputs): (weight, scale),
    an fp8 weight of `rank` dims, `heads` heads of `head_dim`, a multiple of `chunk`."""
    weight, scale = _two_tensors(weight_and_scale, op)
    dim(weight, rank, op, "weight")
    _fp8_weight(weight, op)
    if weight.shape[-1] != 1 and weight.stride(-1) != 1:
        raise ValueError(
            f"{op}: weight must have a contiguous last dimension (stride(-1) == 1), got strides {list(weight.stride())}"
        )
    positive(heads, op, heads_name)
    positive(head_dim, op, head_dim_name)
    if head_dim % chunk:
        raise ValueError(f"{op}: {head_dim_name} ({head_dim}) must be a multiple of {chunk}")
    return weight, scale


def q_b_proj(weight_and_scale, h_q, d_q, op="permute_q_b_proj") -> None:
    """FlashMLA's permute_q_b_proj: fp8 ``[h_q * d_q, K]`` and a DeepGEMM packed
    MN-major int32 scale ``[h_q * d_q, K / (4 * gran)]``, gran 32 or 128."""
    weight, scale = _drop_in_inputs(weight_and_scale, 2, h_q, "h_q", d_q, "d_q", Q_CHUNK, op)
    rows, k = weight.shape
    if rows != h_q * d_q:
        raise ValueError(f"{op}: weight has {rows} rows but h_q * d_q = {h_q * d_q}")
    _packed_scale_dtype(scale, op)
    dim(scale, 2, op, "scale")
    if scale.shape[0] != rows:
        raise ValueError(f"{op}: scale has {scale.shape[0]} rows but weight has {rows}")
    words = scale.shape[1]
    if words <= 0 or k % (4 * words):
        raise ValueError(f"{op}: scale has {words} words per row, so gran = K / (4 * W) must be 32 or 128 (K = {k})")
    gran = k // (4 * words)
    if gran not in (32, 128):
        raise ValueError(
            f"{op}: scale has {words} words per row, so gran = K / (4 * W) = {gran} must be 32 or 128 (K = {k})"
        )
    # FlashMLA checks stride(0) alone: any padding of the rows is valid input.
    if scale.stride(0) != 1:
        raise ValueError(f"{op}: scale must be MN-major (stride(0) == 1), got strides {list(scale.stride())}")
    _same_device(weight, scale, op)


def wv_proj(weight_and_scale, wv_group_size, d_o, op="permute_wv_proj") -> None:
    """FlashMLA's permute_wv_proj: fp8 ``[n_groups, out, G * d_o]`` and a packed
    int32 scale ``[n_groups, out, G * d_o / 128]`` with stride(1) == 1."""
    weight, scale = _drop_in_inputs(weight_and_scale, 3, wv_group_size, "wv_group_size", d_o, "d_o", O_CHUNK, op)
    cols = wv_group_size * d_o
    if weight.shape[2] != cols:
        raise ValueError(f"{op}: weight.size(2) ({weight.shape[2]}) must be wv_group_size * d_o = {cols}")
    if cols % PACKED_COLUMNS:
        raise ValueError(f"{op}: wv_group_size * d_o ({cols}) must be a multiple of {PACKED_COLUMNS}")
    _packed_scale_dtype(scale, op)
    dim(scale, 3, op, "scale")
    expected = [weight.shape[0], weight.shape[1], cols // PACKED_COLUMNS]
    if list(scale.shape) != expected:
        raise ValueError(f"{op}: scale must have shape {expected}, got {list(scale.shape)}")
    if scale.stride(1) != 1:
        raise ValueError(f"{op}: scale must be MN-major (stride(1) == 1), got strides {list(scale.stride())}")
    _same_device(weight, scale, op)


def permute_(self, perm, dim_, op="permute_") -> int:
    """Everything but perm's values; returns dim_ made non-negative."""
    writable(self, op, "self")
    permutable(self, op)
    n = self.dim()
    if not -n <= dim_ < n:
        raise ValueError(f"{op}: dim ({dim_}) is out of range for a {n}-D self (expected {-n} to {n - 1})")
    return dim_ % n


def q(q: torch.Tensor, op="permute_q") -> None:
    dense(q, op, "q")
    dim(q, 3, op, "q")
    if q.shape[2] % Q_CHUNK:
        raise ValueError(f"{op}: head_dim = q.size(2) = {q.shape[2]} must be a multiple of {Q_CHUNK}")
