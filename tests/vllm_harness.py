"""vLLM-side scaffolding for tests/test_vllm.py.

Imported only after ``pytest.importorskip("vllm")`` has passed. Everything
here builds what vLLM 0.33.0 builds (its parameters, its loaders, its layers,
its permutations) so that the tests can load the same checkpoint bytes
through vLLM's ``permute_on_load`` and through this package's and compare the
results byte for byte.

vLLM's own ``permute_on_load`` is kept here under another name
(``VLLM_PERMUTE_ON_LOAD``): the plugin replaces every module global *named*
``permute_on_load`` that holds vLLM's function, which must not include the
reference the tests compare against.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.models.deepseek_v41.common.ops import fused_layout

FUSED_LAYOUT = "vllm.models.deepseek_v41.common.ops.fused_layout"
MEGA_ATTN = "vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Fixed by the model (docs/design.md, "The layouts").
HEAD_DIM = fused_layout.HEAD_DIM  # 512
GROUP = fused_layout.WV_GROUP_SIZE  # 8 heads per wo_a group
SCALE_BLOCK = 32  # one ue8m0 scale per 32 columns (and, on disk, per 32 rows)

# DeepSeek-V4.1's head and group counts; the LoRA ranks are shrunk to keep
# the test fast (the layouts do not depend on them, only the row counts do).
TOTAL_HEADS = 64
TOTAL_GROUPS = 8
Q_LORA_RANK = 128  # wq_b K: 4 scale columns
O_LORA_RANK = 64  # wo_a rows per group


def _vllm_permute_on_load():
    fn = fused_layout.permute_on_load
    if getattr(fn, "__module__", None) == FUSED_LAYOUT:
        return fn
    # The plugin ran in this process before the harness was imported.
    from flashmla_perm import vllm_plugin

    return vllm_plugin._originals["permute_on_load"]


VLLM_PERMUTE_ON_LOAD = _vllm_permute_on_load()


# ---- bytes ------------------------------------------------------------------


def random_bytes(shape, dtype, gen):
    """Random bytes 1..255 viewed as the 1-byte `dtype`: no zero byte, so a
    byte the loader forgets to write (or writes as zero) cannot match."""
    return torch.randint(1, 256, tuple(shape), dtype=torch.uint8, generator=gen).view(dtype)


def u8(t):
    """The bytes of a 1-byte-element tensor (fp8, ue8m0, uint8)."""
    t = t.detach()
    assert t.element_size() == 1, t.dtype
    return t.view(torch.uint8)


def assert_same_bytes(actual, expected, what=""):
    assert tuple(actual.shape) == tuple(expected.shape), (what, actual.shape, expected.shape)
    a, e = u8(actual).cpu(), u8(expected).cpu()
    if not torch.equal(a, e):
        bad = (a != e).nonzero()
        pytest.fail(f"{what}: {len(bad)} of {a.numel()} bytes differ, first at {bad[0].tolist()}")


def gathered(t, perm, dim):
    """``fused = standard.index_select(dim, perm)`` on the bytes (the spec)."""
    return u8(t).index_select(dim, perm.to(t.device))


# ---- bare parameters ----------------------------------------------------------


def bare_param(shape, dtype, gen, loader=default_weight_loader, device="cpu"):
    """A ``torch.nn.Parameter`` as vLLM makes one outside a linear layer, with
    random (not yet loaded) contents and ``loader`` as its weight loader."""
    p = torch.nn.Parameter(random_bytes(shape, dtype, gen).to(device), requires_grad=False)
    if loader is not None:
        p.weight_loader = loader
    return p


# ---- the mega-attention layer's wrapping --------------------------------------


def mega_attn_wrap(permute_on_load, wq_b, wo_a, n_local_heads, head_dim=HEAD_DIM):
    """The four ``permute_on_load`` calls of vLLM's
    ``DeepseekV4MegaAttnAttention.__init__`` (flash_mla_mega_attn.py), with
    vLLM's permutation functions; ``permute_on_load`` is vLLM's or ours."""
    q_perm = fused_layout.q_fused_permutation(n_local_heads, head_dim)
    permute_on_load(wq_b.weight, q_perm, dim=0)
    permute_on_load(wq_b.weight_scale, q_perm, dim=0)
    o_perm = fused_layout.o_fused_permutation(GROUP, head_dim)
    permute_on_load(wo_a.weight, o_perm, dim=1)
    o_chunk_perm = fused_layout.o_fused_chunk_permutation(GROUP, head_dim)
    permute_on_load(wo_a.weight_scale, o_chunk_perm, dim=1)


# The lines mega_attn_wrap copies; test_vllm checks vLLM still has them.
MEGA_ATTN_WRAP_LINES = (
    "q_perm = q_fused_permutation(self.n_local_heads, self.head_dim)",
    "permute_on_load(self.wq_b.weight, q_perm, dim=0)",
    "permute_on_load(self.wq_b.weight_scale, q_perm, dim=0)",
    "o_perm = o_fused_permutation(WV_GROUP_SIZE, self.head_dim)",
    "permute_on_load(self.wo_a.weight, o_perm, dim=1)",
    "o_chunk_perm = o_fused_chunk_permutation(WV_GROUP_SIZE, self.head_dim)",
    "permute_on_load(self.wo_a.weight_scale, o_chunk_perm, dim=1)",
)


# ---- vLLM's tensor-parallel linear layers --------------------------------------


class StandInKernel:
    """In place of the MXFP8 GEMM kernel vLLM picks in create_weights
    (``modelopt.select_linear_kernel``) and again after loading a bmm layer
    (``modelopt.init_mxfp8_linear_kernel``): both raise on a CPU ("Failed to
    find a kernel that can implement the MXFP8 linear layer"). Loading never
    runs the kernel; the stand-in only answers what the layer asks of it."""

    supports_pre_processed_weights = False

    def input_quant_key(self):
        return None

    def process_weights_after_loading(self, layer):
        pass

    def apply_weights(self, *args, **kwargs):
        raise AssertionError("the stand-in kernel cannot run a GEMM")


def patch_kernel_choice(mp):
    from vllm.model_executor.layers.quantization import modelopt

    mp.setattr(modelopt, "select_linear_kernel", lambda *a, **k: StandInKernel())
    mp.setattr(modelopt, "init_mxfp8_linear_kernel", lambda *a, **k: StandInKernel())


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def single_process_tp_group():
    """vLLM's distributed state for one process (gloo on 127.0.0.1, world size
    1): vLLM's parameters ask for the global TP rank when they are created.
    The layers get their shard's rank and size from their own ``tp_rank`` /
    ``tp_size`` arguments. Yields the VllmConfig the layers are built under."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():  # someone else's group: use it as is
        with set_current_vllm_config(VllmConfig()) as cfg:
            yield cfg
        return
    config = VllmConfig()
    with set_current_vllm_config(config):
        ps.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend="gloo",
        )
        ps.initialize_model_parallel(1, 1)
        try:
            yield config
        finally:
            ps.destroy_model_parallel()
            ps.destroy_distributed_environment()


def deepseek_v4_fp8_config():
    """The DeepSeek-V4.1 checkpoint's quantization config: FP8 with [32, 32]
    blocks and ue8m0 scales, which vLLM serves with ModelOptLinearMethod
    (MXFP8 weight, per-32-row-block scales expanded to per-row at load)."""
    from vllm.models.deepseek_v41.quant_config import DeepseekV4FP8Config

    qc = DeepseekV4FP8Config.from_config(
        {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "weight_block_size": [32, 32],
        }
    )
    assert qc.weight_block_size == [32, 32] and qc.is_scale_e8m0
    return qc


def build_attention_linears(quant_config, tp_rank, tp_size, prefix="model.layers.0.attn"):
    """``wq_b`` and ``wo_a`` exactly as DeepseekV4 attention builds them
    (vllm/models/deepseek_v41/attention.py), for the shard of (tp_rank, tp_size)."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    wq_b = ColumnParallelLinear(
        Q_LORA_RANK,
        TOTAL_HEADS * HEAD_DIM,
        bias=False,
        quant_config=quant_config,
        return_bias=False,
        prefix=f"{prefix}.wq_b",
        tp_rank=tp_rank,
        tp_size=tp_size,
    )
    wo_a = ColumnParallelLinear(
        TOTAL_HEADS * HEAD_DIM // TOTAL_GROUPS,
        TOTAL_GROUPS * O_LORA_RANK,
        bias=False,
        quant_config=quant_config,
        return_bias=False,
        prefix=f"{prefix}.wo_a",
        tp_rank=tp_rank,
        tp_size=tp_size,
    )
    wo_a.is_bmm = True
    wo_a.bmm_batch_size = TOTAL_GROUPS // tp_size
    return wq_b, wo_a


# The four tensors the mega-attention layer permutes: (layer, param, dim).
TENSORS = {
    "wq_b.weight": ("wq_b", "weight", 0),
    "wq_b.weight_scale": ("wq_b", "weight_scale", 0),
    "wo_a.weight": ("wo_a", "weight", 1),
    "wo_a.weight_scale": ("wo_a", "weight_scale", 1),
}


def full_checkpoint(gen, scale_dtype=torch.uint8):
    """Unsharded checkpoint tensors as they are on disk: fp8 weights
    ``[out, in]`` and one ue8m0 scale per 32 x 32 block."""
    q_out, o_out, o_in = TOTAL_HEADS * HEAD_DIM, TOTAL_GROUPS * O_LORA_RANK, GROUP * HEAD_DIM
    return {
        "wq_b.weight": random_bytes((q_out, Q_LORA_RANK), torch.float8_e4m3fn, gen),
        "wq_b.weight_scale": random_bytes((q_out // SCALE_BLOCK, Q_LORA_RANK // SCALE_BLOCK), scale_dtype, gen),
        "wo_a.weight": random_bytes((o_out, o_in), torch.float8_e4m3fn, gen),
        "wo_a.weight_scale": random_bytes((o_out // SCALE_BLOCK, o_in // SCALE_BLOCK), scale_dtype, gen),
    }


def perm_for(name, tp_size):
    if name.startswith("wq_b"):
        return fused_layout.q_fused_permutation(TOTAL_HEADS // tp_size, HEAD_DIM)
    if name == "wo_a.weight":
        return fused_layout.o_fused_permutation(GROUP, HEAD_DIM)
    return fused_layout.o_fused_chunk_permutation(GROUP, HEAD_DIM)


def expected_shard(name, full, tp_rank, tp_size):
    """The rank's permuted shard, computed without vLLM's loaders: scales
    expanded from per-32-row blocks to per-row, rows cut, then the gather."""
    t = u8(full)
    if name.endswith("weight_scale"):
        t = t.repeat_interleave(SCALE_BLOCK, dim=0)
    rows = t.size(0) // tp_size
    shard = t.narrow(0, tp_rank * rows, rows)
    return gathered(shard, perm_for(name, tp_size), TENSORS[name][2])


# ---- subprocesses -------------------------------------------------------------


def python_env(**overrides):
    """This environment for a child Python, with the plugin switches cleared
    (then set from ``overrides``; a value of None removes the variable)."""
    env = dict(os.environ)
    env["VLLM_TARGET_DEVICE"] = "cpu"
    for k in ("VLLM_PLUGINS", "FLASHMLA_PERM_VLLM"):
        env.pop(k, None)
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def start_python(code, **env):
    """A child Python running `code` in the repo root; see json_result."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=python_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def json_result(proc, timeout=120):
    """The JSON object on the last stdout line of a child started by start_python."""
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"child python exited {proc.returncode}:\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])
