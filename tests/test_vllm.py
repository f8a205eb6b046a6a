"""flashmla_perm inside vLLM 0.33.0.

vLLM permutes DeepSeek-V4.1's wq_b / wo_a weights by wrapping their weight
loaders with ``permute_on_load`` (docs/design.md, "How vLLM calls it today"). This
package ships a drop-in ``flashmla_perm.permute_on_load`` and a vLLM plugin
that routes vLLM's calls to it. These tests load the same random checkpoint
bytes through vLLM's function and through ours, in the places vLLM loads them
(bare parameters, its tensor-parallel linear layers, its layerwise reload,
CUDA parameters from host memory), and require identical bytes in the same
storage; then they check the plugin in both import orders.

VLLM_TARGET_DEVICE=cpu is set here when no GPU is visible; everything is skipped where vLLM (or its
DeepSeek-V4.1 model code) is not importable.
"""

import functools
import importlib
import importlib.metadata
import inspect
import logging
import os
import sys
import types

import pytest
import torch

# With no GPU, vLLM's platform detection needs to be told (its loading code
# runs on the CPU platform); set before vLLM is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

vllm = pytest.importorskip("vllm", reason="vLLM is not installed")
pytest.importorskip(
    "vllm.models.deepseek_v41.common.ops.fused_layout",
    reason="this vLLM has no DeepSeek-V4.1 fused_layout (vLLM 0.33.0 has)",
)

import vllm.plugins  # noqa: E402, F811  (the submodule, after the skips)
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.model_executor.model_loader.reload import layerwise  # noqa: E402
from vllm.model_executor.model_loader.weight_utils import default_weight_loader  # noqa: E402

import flashmla_perm  # noqa: E402
from flashmla_perm import reference  # noqa: E402
from conftest import expect_path  # noqa: E402
from vllm_harness import (  # noqa: E402
    FUSED_LAYOUT,
    GROUP,
    HEAD_DIM,
    MEGA_ATTN,
    MEGA_ATTN_WRAP_LINES,
    TENSORS,
    TOTAL_HEADS,
    VLLM_PERMUTE_ON_LOAD,
    assert_same_bytes,
    bare_param,
    build_attention_linears,
    deepseek_v4_fp8_config,
    expected_shard,
    full_checkpoint,
    fused_layout,
    gathered,
    json_result,
    mega_attn_wrap,
    patch_kernel_choice,
    random_bytes,
    single_process_tp_group,
    start_python,
    u8,
)

FP8 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
ENTRY_POINT = "flashmla_perm.vllm_plugin:register"


@pytest.fixture(scope="module")
def ours():
    """This package's permute_on_load (skipped while it does not exist yet)."""
    fn = getattr(flashmla_perm, "permute_on_load", None)
    if fn is None:
        pytest.skip("flashmla_perm.permute_on_load is not in this build")
    return fn


# ---- 1. bare parameters with vLLM's default_weight_loader ---------------------

K = 256  # wq_b columns (q_lora_rank is 1280 in the model; the layout ignores it)
O_LORA = 64  # wo_a rows per group of 8 heads (1024 in the model)


def bare_case(kind, heads):
    """(shape, dtype, perm, dim) of one tensor of a rank holding `heads` heads."""
    q_perm = fused_layout.q_fused_permutation(heads, HEAD_DIM)
    wo_rows = heads // GROUP * O_LORA
    return {
        "wq_b.weight": ((heads * HEAD_DIM, K), FP8, q_perm, 0),
        "wq_b.weight_scale-uint8": ((heads * HEAD_DIM, K // 32), torch.uint8, q_perm, 0),
        "wq_b.weight_scale-e8m0": ((heads * HEAD_DIM, K // 32), E8M0, q_perm, 0),
        "wo_a.weight": ((wo_rows, GROUP * HEAD_DIM), FP8, fused_layout.o_fused_permutation(GROUP, HEAD_DIM), 1),
        "wo_a.weight_scale": (
            (wo_rows, GROUP * HEAD_DIM // 32),
            torch.uint8,
            fused_layout.o_fused_chunk_permutation(GROUP, HEAD_DIM),
            1,
        ),
    }[kind]


@pytest.mark.parametrize(
    "kind", ["wq_b.weight", "wq_b.weight_scale-uint8", "wq_b.weight_scale-e8m0", "wo_a.weight", "wo_a.weight_scale"]
)
@pytest.mark.parametrize("heads", [64, 32, 16, 8])  # num_local_heads at TP 1, 2, 4, 8
def test_bare_param_load_and_reload(ours, gen, kind, heads):
    """A checkpoint tensor loaded, then reloaded with new bytes, through
    vLLM's default_weight_loader wrapped by vLLM's permute_on_load and by
    ours: the same bytes as index_select, in the param's own storage."""
    shape, dtype, perm, dim = bare_case(kind, heads)
    theirs, mine = bare_param(shape, dtype, gen), bare_param(shape, dtype, gen)
    VLLM_PERMUTE_ON_LOAD(theirs, perm, dim)
    ours(mine, perm, dim)
    storage = mine.data_ptr()
    previous = None
    for _ in ("load", "reload"):
        ckpt = random_bytes(shape, dtype, gen)
        theirs.weight_loader(theirs, ckpt)
        with expect_path("cpu"):
            mine.weight_loader(mine, ckpt)
        assert_same_bytes(theirs, gathered(ckpt, perm, dim), "vLLM's permute_on_load")
        assert_same_bytes(mine, theirs, "ours vs vLLM's")
        assert previous is None or not torch.equal(u8(mine), previous), "the reload changed nothing"
        previous = u8(mine).clone()
    assert mine.data_ptr() == storage


def test_wrapped_loader_signature(ours, gen):
    """vLLM's layerwise reload binds the loader's arguments by name
    (inspect.signature(...).bind, then args.arguments["param"] = ...), and
    merged/QKV loaders take more arguments: the first two parameters are
    `param` and `loaded_weight`, the rest is passed through."""
    seen = {}

    def loader(param, loaded_weight, shard_id=None, **kwargs):
        seen.update(shard_id=shard_id, **kwargs)
        param.data.copy_(loaded_weight)

    p = bare_param((8 * HEAD_DIM, 64), FP8, gen, loader=loader)
    ours(p, fused_layout.q_fused_permutation(8), 0)
    names = list(inspect.signature(p.weight_loader).parameters)
    assert names[:2] == ["param", "loaded_weight"], names
    ckpt = random_bytes(p.shape, FP8, gen)
    p.weight_loader(param=p, loaded_weight=ckpt, shard_id="q", num_heads=8)
    assert seen == {"shard_id": "q", "num_heads": 8}
    assert_same_bytes(p, gathered(ckpt, fused_layout.q_fused_permutation(8), 0))


def test_param_without_loader_is_copied_then_permuted(ours, gen):
    """Ours wraps a plain copy when the param has no weight_loader (vLLM's
    raises AttributeError at wrap time there)."""
    p = bare_param((GROUP * O_LORA, GROUP * HEAD_DIM), FP8, gen, loader=None)
    perm = fused_layout.o_fused_permutation(GROUP, HEAD_DIM)
    ours(p, perm, 1)
    ckpt = random_bytes(p.shape, FP8, gen)
    p.weight_loader(p, ckpt)
    assert_same_bytes(p, gathered(ckpt, perm, 1))


# ---- 2. vLLM's ColumnParallelLinear wq_b / wo_a, every rank of TP 1..8 --------

TP_RANKS = [(tp, rank) for tp in (1, 2, 4, 8) for rank in range(tp)]


@pytest.fixture(scope="module")
def tp_layers(ours):
    """get(tp, rank) -> (vLLM-wrapped, ours-wrapped) dicts {"wq_b", "wo_a"}:
    vLLM's ColumnParallelLinear layers built like DeepSeek-V4.1 attention
    builds them, under DeepseekV4FP8Config, for that rank's shard, wrapped
    like the mega-attention layer wraps them. Built once per (tp, rank)."""
    with pytest.MonkeyPatch.context() as mp, single_process_tp_group() as config:
        patch_kernel_choice(mp)
        qc = deepseek_v4_fp8_config()
        built = {}

        def get(tp, rank):
            if (tp, rank) not in built:
                pair = []
                for wrap in (VLLM_PERMUTE_ON_LOAD, ours):
                    with set_current_vllm_config(config):
                        wq_b, wo_a = build_attention_linears(qc, rank, tp)
                    mega_attn_wrap(wrap, wq_b, wo_a, TOTAL_HEADS // tp)
                    pair.append({"wq_b": wq_b, "wo_a": wo_a})
                built[(tp, rank)] = tuple(pair)
            return built[(tp, rank)]

        yield get


@pytest.fixture(scope="module")
def checkpoints():
    """Two unsharded checkpoints (load, then reload), scales as uint8 in the
    first and float8_e8m0fnu in the second (vLLM's scale loader takes both)."""
    g = torch.Generator()
    g.manual_seed(15)
    return full_checkpoint(g, torch.uint8), full_checkpoint(g, E8M0)


def test_layers_are_vllms(tp_layers):
    """The layers under test are vLLM's MXFP8 ColumnParallelLinear with
    vLLM's parameter classes and shapes, not stand-ins."""
    from vllm.model_executor.layers.linear import ColumnParallelLinear
    from vllm.model_executor.layers.quantization.modelopt import ModelOptLinearMethod
    from vllm.model_executor.parameter import ModelWeightParameter

    theirs, mine = tp_layers(2, 1)
    for layers in (theirs, mine):
        for name, layer in layers.items():
            assert type(layer) is ColumnParallelLinear and layer.tp_rank == 1 and layer.tp_size == 2
            assert isinstance(layer.quant_method, ModelOptLinearMethod)
            for p in (layer.weight, layer.weight_scale):
                assert type(p) is ModelWeightParameter and p.tp_rank == 1
    assert tuple(mine["wq_b"].weight.shape) == (TOTAL_HEADS // 2 * HEAD_DIM, 128)
    assert mine["wq_b"].weight.dtype == FP8 and mine["wq_b"].weight_scale.dtype == torch.uint8
    assert tuple(mine["wo_a"].weight.shape) == (8 // 2 * 64, GROUP * HEAD_DIM)
    assert tuple(mine["wo_a"].weight_scale.shape) == (8 // 2 * 64, GROUP * HEAD_DIM // 32)


@pytest.mark.parametrize("name", list(TENSORS))
@pytest.mark.parametrize("tp,rank", TP_RANKS)
def test_tp_shard_load_and_reload(tp_layers, checkpoints, tp, rank, name):
    """The full checkpoint tensor through the param's own loader (vLLM cuts
    the rank's shard; for scales it first expands the per-32-row blocks), then
    a reload with new bytes: ours gives vLLM's bytes in the same storage.
    (Expanded scales repeat each row 32 times, so a swap of rows inside a
    block would not show here: the bare-param test covers per-row scales.)"""
    layer, pname, _ = TENSORS[name]
    theirs_layers, my_layers = tp_layers(tp, rank)
    theirs, mine = getattr(theirs_layers[layer], pname), getattr(my_layers[layer], pname)
    storage = mine.data_ptr()
    previous = None
    for full in [ckpt[name] for ckpt in checkpoints]:
        theirs.weight_loader(theirs, full)
        with expect_path("cpu"):
            mine.weight_loader(mine, full)
        assert_same_bytes(theirs, expected_shard(name, full, rank, tp), "vLLM's loader")
        assert_same_bytes(mine, theirs, "ours vs vLLM's")
        assert previous is None or not torch.equal(u8(mine), previous), "the reload changed nothing"
        previous = u8(mine).clone()
    assert mine.data_ptr() == storage


def test_mega_attn_still_wraps_like_this():
    """tp_layers copies the permute_on_load calls of vLLM's mega-attention
    layer (which cannot be built without an SM100 GPU): fail if vLLM's
    __init__ no longer makes them, so the copy cannot silently drift."""
    mega = importlib.import_module(MEGA_ATTN)
    source = inspect.getsource(mega.DeepseekV4MegaAttnAttention.__init__)
    missing = [line for line in MEGA_ATTN_WRAP_LINES if line not in source]
    assert not missing, f"vLLM's mega-attention __init__ changed: {missing}"


# ---- 3. the plugin ---------------------------------------------------------------


def plugin_entry_point():
    eps = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins") if ep.name == "flashmla_perm"]
    return eps[0] if eps else None


@pytest.fixture
def entry_point():
    ep = plugin_entry_point()
    if ep is None:
        pytest.skip(
            "the flashmla_perm entry point is not installed (pip install --no-build-isolation -e . registers it)"
        )
    assert ep.value == ENTRY_POINT
    return ep


@pytest.fixture
def vllm_names(monkeypatch):
    """vLLM's permute_on_load in fused_layout, in the mega-attention module
    and wherever else it was imported, for this test; put back after it, so a
    routing test leaves the rest of the session on vLLM's function. Plugin
    switches cleared, vLLM's plugins not yet loaded."""
    mega = importlib.import_module(MEGA_ATTN)
    for name, module in list(sys.modules.items()):
        held = getattr(module, "__dict__", {}).get("permute_on_load")
        if name.startswith("vllm") and held in (VLLM_PERMUTE_ON_LOAD, flashmla_perm.permute_on_load):
            monkeypatch.setattr(module, "permute_on_load", VLLM_PERMUTE_ON_LOAD)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv("FLASHMLA_PERM_VLLM", raising=False)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    return mega


@pytest.fixture
def plugin_log():
    """The records the plugin logs. Its logger is a child of vLLM's, which
    does not propagate to the root logger once vLLM configures logging, and
    which vLLM 0.33.0 configures only when an engine starts (in a bare
    process the effective level is the root's WARNING): so a handler of our
    own, on the plugin's logger, at INFO for the test."""
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    log = logging.getLogger("vllm.plugins.flashmla_perm")
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    yield records
    log.removeHandler(handler)
    log.setLevel(level)


def routed(mega):
    return (
        mega.permute_on_load is flashmla_perm.permute_on_load
        and fused_layout.permute_on_load is flashmla_perm.permute_on_load
    )


def untouched(mega):
    return mega.permute_on_load is VLLM_PERMUTE_ON_LOAD and fused_layout.permute_on_load is VLLM_PERMUTE_ON_LOAD


def needs_native():
    if not flashmla_perm.build_info()["native"]:
        pytest.skip("the plugin routes nothing without the native module")


def test_register_routes_imported_callers(vllm_names, plugin_log):
    """register() replaces the function in fused_layout and in the module
    that imported it by name (flash_mla_mega_attn), and says so in one line."""
    needs_native()
    from flashmla_perm import vllm_plugin

    vllm_plugin.register()
    assert routed(vllm_names)
    assert len(plugin_log) == 1 and "routed" in plugin_log[0].getMessage()
    assert MEGA_ATTN in plugin_log[0].getMessage()


def test_register_is_idempotent(vllm_names, plugin_log):
    """vLLM may load general plugins more than once per process."""
    needs_native()
    from flashmla_perm import vllm_plugin

    vllm_plugin.register()
    vllm_plugin.register()
    assert routed(vllm_names)
    assert len(plugin_log) == 2


def test_register_keeps_what_it_replaced(vllm_names, plugin_log):
    """vLLM's own function, for whatever needs it after routing (the test
    harness, imported after the plugin ran, compares against it)."""
    needs_native()
    from flashmla_perm import vllm_plugin

    vllm_plugin.register()
    assert routed(vllm_names)
    assert vllm_plugin._originals["permute_on_load"] is VLLM_PERMUTE_ON_LOAD


def test_register_leaves_a_function_that_takes_other_arguments(vllm_names, plugin_log, monkeypatch):
    """A later vLLM whose permute_on_load takes other arguments (or other
    defaults) keeps its own: ours would give its callers 0.33.0's bytes."""
    needs_native()
    from flashmla_perm import vllm_plugin

    def later(param, perm, dim, *, scale_block_rows=1):
        return VLLM_PERMUTE_ON_LOAD(param, perm, dim)

    def other_default(param, perm, dim=0):
        return VLLM_PERMUTE_ON_LOAD(param, perm, dim)

    def tensor_default(param, perm, dim=torch.tensor([0, 1])):  # == cannot say
        return VLLM_PERMUTE_ON_LOAD(param, perm, int(dim[0]))

    for fn in (later, other_default, tensor_default):
        monkeypatch.setattr(fused_layout, "permute_on_load", fn)
        monkeypatch.setattr(vllm_names, "permute_on_load", fn)
        plugin_log.clear()
        vllm_plugin.register()
        assert fused_layout.permute_on_load is fn and vllm_names.permute_on_load is fn
        message = plugin_log[0].getMessage()
        assert len(plugin_log) == 1 and "changed nothing" in message, message
        assert "left vLLM's permute_on_load (it" in message, message


# A later vLLM (or a decorator around its function) can keep 0.33.0's
# signature and still write other bytes: the plugin must see it by running it.


def inverse_everywhere(param, perm, dim):
    return VLLM_PERMUTE_ON_LOAD(param, flashmla_perm.inverse_permutation(perm), dim)


def inverse_on_dim_1(param, perm, dim):
    return VLLM_PERMUTE_ON_LOAD(param, flashmla_perm.inverse_permutation(perm) if dim == 1 else perm, dim)


def only_raises(param, perm, dim):
    raise NotImplementedError("a stub")


@functools.wraps(VLLM_PERMUTE_ON_LOAD)  # inspect.signature follows __wrapped__: 0.33.0's
def wraps_nothing(*args, **kwargs):
    return None  # the loader is left as it was: nothing permuted


def delegates(param, perm, dim):
    return VLLM_PERMUTE_ON_LOAD(param, perm, dim)


@pytest.mark.parametrize(
    "stub,routes,why",
    [
        (inverse_everywhere, False, "it wrote other bytes than ours on an fp8 wq_b shard, dim 0"),
        (inverse_on_dim_1, False, "it wrote other bytes than ours on an fp8 wo_a shard, dim 1"),
        (only_raises, False, "it raised NotImplementedError on an fp8 wq_b shard, dim 0: a stub"),
        (wraps_nothing, False, "it wrote other bytes than ours"),
        (delegates, True, None),  # another object, the same bytes: routed
    ],
    ids=["inverse", "inverse_on_dim_1", "only_raises", "decorated_no_op", "delegates"],
)
def test_register_routes_only_a_function_shown_to_write_our_bytes(
    vllm_names, plugin_log, monkeypatch, stub, routes, why
):
    """Each stub takes 0.33.0's arguments; register() runs it beside ours on
    small CPU tensors and routes it only if the bytes are the same."""
    needs_native()
    from flashmla_perm import vllm_plugin

    assert vllm_plugin._parameters(stub) == vllm_plugin._parameters(VLLM_PERMUTE_ON_LOAD)
    monkeypatch.setattr(fused_layout, "permute_on_load", stub)
    monkeypatch.setattr(vllm_names, "permute_on_load", stub)
    vllm_plugin.register()
    message = plugin_log[0].getMessage()
    assert len(plugin_log) == 1, message
    if routes:
        assert routed(vllm_names) and message.startswith("flashmla_perm: routed"), message
        return
    assert fused_layout.permute_on_load is stub and vllm_names.permute_on_load is stub, message
    assert holders_of_ours() == set(), message
    assert message.startswith(f"flashmla_perm: changed nothing; left vLLM's permute_on_load ({why}"), message


def theirs_wq_b(weight, weight_scale, num_local_heads):
    reference.permute_wq_b_(weight, weight_scale, num_local_heads)


def inverse_wq_b(weight, weight_scale, num_local_heads):
    reference.unpermute_wq_b_(weight, weight_scale, num_local_heads)


def wq_b_weight_only(weight, weight_scale, num_local_heads):
    reference.permute_wq_b_(weight, weight_scale.clone(), num_local_heads)


def theirs_wo_a(weight, weight_scale, heads_per_group=GROUP):
    reference.permute_wo_a_(weight, weight_scale, heads_per_group)


def inverse_wo_a(weight, weight_scale, heads_per_group=GROUP):
    reference.unpermute_wo_a_(weight, weight_scale, heads_per_group)


def wo_a_weight_only(weight, weight_scale, heads_per_group=GROUP):
    reference.permute_wo_a_(weight, weight_scale.clone(), heads_per_group)


@pytest.mark.parametrize(
    "name,right,wrong",
    [
        ("permute_wq_b_", theirs_wq_b, [inverse_wq_b, wq_b_weight_only]),
        ("permute_wo_a_", theirs_wo_a, [inverse_wo_a, wo_a_weight_only]),
    ],
)
def test_register_runs_the_model_ops_before_routing_them(vllm_names, plugin_log, monkeypatch, name, right, wrong):
    """A vLLM with permute_wq_b_ / permute_wo_a_ (vLLM 0.33.0 has neither):
    each is run beside ours on a small shard first; one that writes the
    inverse, or leaves the scale as it was, keeps its own."""
    needs_native()
    from flashmla_perm import vllm_plugin

    for fn in wrong:
        monkeypatch.setattr(fused_layout, name, fn, raising=False)
        plugin_log.clear()
        vllm_plugin.register()
        message = plugin_log[0].getMessage()
        assert getattr(fused_layout, name) is fn, message
        assert f"left vLLM's {name} (it wrote other bytes than ours on an fp8 shard" in message, message
    monkeypatch.setattr(fused_layout, name, right)
    plugin_log.clear()
    vllm_plugin.register()
    message = plugin_log[0].getMessage()
    assert getattr(fused_layout, name) is getattr(flashmla_perm, name), message
    assert f"routed vLLM's {name} to flashmla_perm" in message or f"routed vLLM's permute_on_load, {name}" in message


MODULE_DICT = types.ModuleType.__dict__["__dict__"]  # a module's namespace, past its hooks


def holders_of_ours():
    """The modules (other than this package's) whose namespace holds our
    permute_on_load under that name."""
    held = set()
    for module_name, module in list(sys.modules.items()):
        ours = module_name == "flashmla_perm" or module_name.startswith("flashmla_perm.")
        if issubclass(type(module), types.ModuleType) and not ours:
            if MODULE_DICT.__get__(module).get("permute_on_load") is flashmla_perm.permute_on_load:
                held.add(module_name)
    return held


class Guarded(types.ModuleType):
    """A module that refuses every attribute read and write (a read-only
    wrapper): it holds vLLM's function, and ours cannot be put in."""

    def __getattribute__(self, name):
        raise RuntimeError(f"no reading {name}")

    def __setattr__(self, name, value):
        raise RuntimeError(f"no writing {name}")


class Ignoring(types.ModuleType):
    """A module whose attribute writes do nothing, and say nothing."""

    def __setattr__(self, name, value):
        pass


class WritesOnce(types.ModuleType):
    """A module that takes one attribute write, then refuses."""

    def __setattr__(self, name, value):
        if "written" in MODULE_DICT.__get__(self):
            raise RuntimeError(f"no writing {name} again")
        MODULE_DICT.__get__(self).update({name: value, "written": True})


class ReadGuarded(types.ModuleType):
    """A module whose attribute reads raise (its class's hook), writes work."""

    def __getattribute__(self, name):
        raise RuntimeError(f"no reading {name}")


class Unreadable:
    """Not a module, in sys.modules, and every attribute read raises."""

    def __getattribute__(self, name):
        raise RuntimeError(f"no reading {name}")


def fake_caller(cls, name, monkeypatch):
    """A ``cls`` module in sys.modules (after vLLM's) that imported vLLM's
    permute_on_load by name."""
    module = cls(name)
    MODULE_DICT.__get__(module)["permute_on_load"] = VLLM_PERMUTE_ON_LOAD
    monkeypatch.setitem(sys.modules, name, module)
    return module


@pytest.mark.parametrize(
    "cls,why",
    [(Guarded, "RuntimeError: no writing permute_on_load"), (Ignoring, "RuntimeError: the name did not change")],
)
def test_register_routes_nothing_where_one_caller_refuses_ours(vllm_names, plugin_log, monkeypatch, cls, why):
    """All or nothing: fused_layout and flash_mla_mega_attn come first and
    take ours; then a caller refuses it (or drops it without a word), so both
    get vLLM's back, and the line says nothing changed, and why."""
    needs_native()
    from flashmla_perm import vllm_plugin

    caller = fake_caller(cls, "fake_caller", monkeypatch)
    vllm_plugin.register()
    message = plugin_log[0].getMessage()
    assert len(plugin_log) == 1, message
    assert untouched(vllm_names), message
    assert MODULE_DICT.__get__(caller)["permute_on_load"] is VLLM_PERMUTE_ON_LOAD
    assert holders_of_ours() == set(), message
    assert message == f"flashmla_perm: changed nothing: permute_on_load could not be replaced in fake_caller ({why})"


def test_register_says_where_ours_could_not_be_taken_back(vllm_names, plugin_log, monkeypatch):
    """A caller takes ours, a later one refuses it, and the first will not
    give ours back: the line says where ours runs, not "changed nothing"."""
    needs_native()
    from flashmla_perm import vllm_plugin

    fake_caller(WritesOnce, "fake_writes_once", monkeypatch)
    fake_caller(Guarded, "fake_guarded", monkeypatch)
    vllm_plugin.register()
    message = plugin_log[0].getMessage()
    assert untouched(vllm_names), message
    assert holders_of_ours() == {"fake_writes_once"}, message
    assert message == (
        "flashmla_perm: routed only permute_on_load in fake_writes_once, where vLLM's could not be put back:"
        " permute_on_load could not be replaced in fake_guarded (RuntimeError: no writing permute_on_load)"
    )


def test_register_reads_past_attribute_hooks_and_skips_what_it_cannot_read(vllm_names, plugin_log, monkeypatch):
    """A module whose attribute reads raise is read through its namespace
    (and routed); an entry of sys.modules that is no module and cannot be
    read is skipped. The line names every module that now runs ours, and
    the entry it skipped."""
    needs_native()
    from flashmla_perm import vllm_plugin

    caller = fake_caller(ReadGuarded, "fake_read_guarded_caller", monkeypatch)
    monkeypatch.setitem(sys.modules, "fake_unreadable", Unreadable())
    vllm_plugin.register()
    message = plugin_log[0].getMessage()
    assert len(plugin_log) == 1, message
    assert routed(vllm_names), message
    assert MODULE_DICT.__get__(caller)["permute_on_load"] is flashmla_perm.permute_on_load
    held = holders_of_ours()
    assert held >= {FUSED_LAYOUT, MEGA_ATTN, "fake_read_guarded_caller"}, held
    where = message.split(") in ", 1)[1].split(";", 1)[0]
    assert set(where.replace(" and ", ", ").split(", ")) == held, message
    assert message.endswith("; could not read fake_unreadable (RuntimeError: no reading __dict__)"), message


def test_the_import_hook_never_edits_the_finder_list_an_import_walks(vllm_names, plugin_log, monkeypatch):
    """An import in another thread walks the sys.meta_path list it read.
    register() puts the hook in, and the hook takes itself out, by replacing
    the list: such a walk sees every finder once (an edit in place made it
    skip the finder after the hook, and report an existing module missing)."""
    needs_native()
    from flashmla_perm import vllm_plugin

    finders = [f for f in sys.meta_path if type(f) is not vllm_plugin._RouteOnImport]
    monkeypatch.setattr(sys, "meta_path", list(finders))
    monkeypatch.delitem(sys.modules, FUSED_LAYOUT)  # as before vLLM imports it
    seen = []
    for finder in sys.meta_path:
        seen.append(finder)
        if len(seen) == 1:
            vllm_plugin.register()
    assert seen == finders
    assert "will route vLLM's permute_on_load" in plugin_log[0].getMessage()
    hooked = sys.meta_path
    assert type(hooked[0]) is vllm_plugin._RouteOnImport and hooked[1:] == finders
    seen = []
    for finder in hooked:
        seen.append(finder)
        if type(finder) is vllm_plugin._RouteOnImport:
            vllm_plugin._uninstall()
    assert seen == hooked
    assert sys.meta_path == finders


@pytest.mark.parametrize(
    "torch_cuda,expected",
    [
        (None, "(in place, native on cpu)"),
        ("13.0", "on cuda torch's gather, as vLLM's: (why)"),
    ],
    ids=["cpu_torch", "cuda_torch"],
)
def test_register_says_where_it_runs_natively(vllm_names, plugin_log, monkeypatch, torch_cuda, expected):
    """A CUDA torch beside the CPU-only module (no toolkit of its CUDA
    version at build time): routed, right bytes, but GPU tensors take the
    gather vLLM's own function does, and the line says so and why."""
    needs_native()
    from flashmla_perm import vllm_plugin

    info = dict(flashmla_perm.build_info(), cuda=False, cuda_off_reason="(why)")
    monkeypatch.setattr(flashmla_perm, "build_info", lambda: info)
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    vllm_plugin.register()
    assert routed(vllm_names)
    assert expected in plugin_log[0].getMessage(), plugin_log[0].getMessage()


@pytest.fixture
def cuda_side(monkeypatch):
    """What a CUDA build's build_info says, on any machine."""
    info = dict(flashmla_perm.build_info(), cuda=True, cuda_compiler="NVRTC 13.0", cuda_off_reason=None)
    info.update(cuda_archs=["sm_80", "sm_90", "sm_100", "sm_103", "sm_120"], cuda_ptx="compute_80")
    monkeypatch.setattr(flashmla_perm, "build_info", lambda: info)
    return info


@pytest.mark.parametrize("gpu, image", [("sm_100", "sm_100 cubin"), ("sm_121", "sm_120 cubin"),
                                        ("sm_110", "compute_80 PTX")])  # fmt: skip
def test_register_says_which_image_the_gpu_loads(vllm_names, plugin_log, monkeypatch, cuda_side, gpu, image):
    needs_native()
    from flashmla_perm import _kernels, vllm_plugin

    monkeypatch.setattr(_kernels, "gpu_archs", lambda: (gpu,))
    vllm_plugin.register()
    assert routed(vllm_names)
    said = plugin_log[0].getMessage()
    assert f"(in place, native on cpu and cuda (kernels built at install by NVRTC 13.0; {gpu}: {image}))" in said, said
    # No GPU seen (NVML absent): what the install built.
    monkeypatch.setattr(_kernels, "gpu_archs", lambda: ())
    assert "kernels built at install by NVRTC 13.0 for sm_80, sm_90, sm_100, sm_103, sm_120 and PTX for compute_80" in (
        vllm_plugin._devices_text(flashmla_perm.build_info())
    )


@pytest.mark.parametrize("value", ["0", "false", " OFF ", "No"])
def test_register_off_switch(vllm_names, plugin_log, monkeypatch, value):
    monkeypatch.setenv("FLASHMLA_PERM_VLLM", value)
    from flashmla_perm import vllm_plugin

    vllm_plugin.register()
    assert untouched(vllm_names)
    assert len(plugin_log) == 1 and f"FLASHMLA_PERM_VLLM={value.strip()}" in plugin_log[0].getMessage()


@pytest.mark.parametrize("value", ["1", " TRUE", "on", "Yes ", "", "  "])
def test_register_on_switch(vllm_names, plugin_log, monkeypatch, value):
    needs_native()
    monkeypatch.setenv("FLASHMLA_PERM_VLLM", value)
    from flashmla_perm import vllm_plugin

    vllm_plugin.register()
    assert routed(vllm_names), plugin_log[0].getMessage()


@pytest.mark.parametrize("value", ["garbage", "2", "of", "y"])
def test_register_refuses_a_switch_it_cannot_read(vllm_names, plugin_log, monkeypatch, value):
    """Neither on nor off: nothing routed, and the line names the variable
    and the value."""
    monkeypatch.setenv("FLASHMLA_PERM_VLLM", value)
    from flashmla_perm import vllm_plugin

    vllm_plugin.register()
    assert untouched(vllm_names)
    message = plugin_log[0].getMessage()
    assert len(plugin_log) == 1 and message.startswith("flashmla_perm: changed nothing: "), message
    assert f"FLASHMLA_PERM_VLLM={value!r} is not a switch value" in message, message


def test_register_without_native_module(vllm_names, plugin_log, monkeypatch):
    """Without the native module the plugin leaves vLLM's (gathering) function."""
    from flashmla_perm import vllm_plugin

    info = dict(flashmla_perm.build_info(), native=False, native_error="(test)")
    monkeypatch.setattr(flashmla_perm, "build_info", lambda: info)
    vllm_plugin.register()
    assert untouched(vllm_names)
    assert len(plugin_log) == 1 and "changed nothing" in plugin_log[0].getMessage()


def test_register_never_raises(vllm_names, plugin_log, monkeypatch):
    """A failure inside the plugin must not stop vLLM's start-up."""
    from flashmla_perm import vllm_plugin

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(flashmla_perm, "build_info", broken)
    vllm_plugin.register()
    assert untouched(vllm_names)
    assert len(plugin_log) == 1 and "boom" in plugin_log[0].getMessage()


def test_load_general_plugins_routes(entry_point, vllm_names):
    """Through vLLM's own plugin loading, the mega-attention module already
    imported (import order (a), in this process)."""
    needs_native()
    vllm.plugins.load_general_plugins()
    assert routed(vllm_names)


@pytest.mark.parametrize(
    "env",
    [{"VLLM_PLUGINS": "some_other_plugin"}, {"FLASHMLA_PERM_VLLM": "0"}],
    ids=["VLLM_PLUGINS=other", "FLASHMLA_PERM_VLLM=0"],
)
def test_load_general_plugins_can_be_turned_off(entry_point, vllm_names, monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    vllm.plugins.load_general_plugins()
    assert untouched(vllm_names)


# Fresh processes, for a clean import state. Each prints one JSON line.
REPORT = """
import json, sys, flashmla_perm
mega = sys.modules["{mega}"]
fl = sys.modules["{fl}"]
from {fl} import permute_on_load as late_import
print(json.dumps(dict(
    imported_before_plugins=imported_before_plugins,
    late_import_is_ours=late_import is flashmla_perm.permute_on_load,
    mega_is_ours=mega.permute_on_load is flashmla_perm.permute_on_load,
    fused_layout_is_ours=fl.permute_on_load is flashmla_perm.permute_on_load,
    mega_module=mega.permute_on_load.__module__,
    native=flashmla_perm.build_info()["native"])))
""".format(mega=MEGA_ATTN, fl=FUSED_LAYOUT)

MODULE_FIRST = (
    f"""
import importlib, sys, vllm.plugins
importlib.import_module("{MEGA_ATTN}")
imported_before_plugins = True
vllm.plugins.plugins_loaded = False
vllm.plugins.load_general_plugins()
"""
    + REPORT
)

PLUGINS_FIRST = (
    f"""
import importlib, sys, vllm.plugins
vllm.plugins.plugins_loaded = False
vllm.plugins.load_general_plugins()
imported_before_plugins = "{MEGA_ATTN}" in sys.modules
importlib.import_module("{MEGA_ATTN}")
"""
    + REPORT
)


# A worker process of vLLM's, in its order: logging configured from the engine's
# config (MultiprocExecutor's worker_main), then the plugins (init_worker), then
# the model's code. vLLM's handler writes to sys.stdout as it is when logging
# is configured: here, a buffer whose plugin lines the child prints as JSON.
WORKER_LOG = f"""
import importlib, io, json, sys
captured = io.StringIO()
sys.stdout = captured
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging
import vllm.plugins
configure_logging(LoggingConfig())
vllm.plugins.plugins_loaded = False
vllm.plugins.load_general_plugins()
importlib.import_module("{MEGA_ATTN}")
sys.stdout = sys.__stdout__
import flashmla_perm
print(json.dumps(dict(lines=[l for l in captured.getvalue().splitlines() if "flashmla_perm" in l],
                      native=flashmla_perm.build_info()["native"])))
"""


@pytest.fixture(scope="module")
def import_orders():
    """The child processes, started together (each spends most of its
    seconds importing vLLM)."""
    if plugin_entry_point() is None:
        pytest.skip(
            "the flashmla_perm entry point is not installed (pip install --no-build-isolation -e . registers it)"
        )
    procs = {
        "module_first": start_python(MODULE_FIRST),
        "plugins_first": start_python(PLUGINS_FIRST),
        "worker_log": start_python(WORKER_LOG),
    }
    return {k: json_result(p) for k, p in procs.items()}


@pytest.mark.parametrize("order", ["module_first", "plugins_first"])
def test_plugin_in_a_fresh_process(import_orders, order):
    """(a) flash_mla_mega_attn imported, then vLLM loads its plugins; (b) the
    plugins loaded, then the module imported: the module's permute_on_load
    is ours either way."""
    r = import_orders[order]
    if not r["native"]:
        pytest.skip("the plugin routes nothing without the native module")
    # (b): register() does not import vLLM's DeepSeek-V4.1 code (seconds, in
    # every process, whatever the model); an import hook routes fused_layout
    # when vLLM imports it, before flash_mla_mega_attn takes the name.
    assert r["imported_before_plugins"] == (order == "module_first")
    assert r["mega_is_ours"] and r["fused_layout_is_ours"] and r["late_import_is_ours"], r
    assert r["mega_module"].startswith("flashmla_perm"), r


def test_plugin_says_what_it_routed_in_a_worker_log(import_orders):
    """What an engineer sees in a worker's log: vLLM's own format (level,
    file), one line when the plugin is loaded and one when it routes. (vLLM's
    API-server process loads the plugins while it parses its command line,
    before it configures logging, so no INFO line of any plugin shows there;
    the engine and worker processes, which load the weights, show both.)"""
    r = import_orders["worker_log"]
    lines = r["lines"]
    assert lines and all(" INFO " in l and "[vllm_plugin.py:" in l for l in lines), lines
    if not r["native"]:
        assert len(lines) == 1 and "flashmla_perm: changed nothing" in lines[0], lines
        return
    assert len(lines) == 2, lines
    assert "flashmla_perm: will route vLLM's permute_on_load" in lines[0], lines
    assert "flashmla_perm: routed vLLM's permute_on_load to flashmla_perm" in lines[1], lines


# ---- 4. vLLM's layerwise (in-place) reload ---------------------------------------


def spy(loader, log):
    """`loader`, recording the device of every param it is called with."""

    def spying_loader(param, loaded_weight):
        log.append(param.device.type)
        return loader(param, loaded_weight)

    return spying_loader


SMALL = {  # name: (shape, dtype, perm, dim); a rank with 8 heads, one wo_a group
    "wq_b_weight": ((8 * HEAD_DIM, 64), FP8, fused_layout.q_fused_permutation(8), 0),
    "wq_b_weight_scale": ((8 * HEAD_DIM, 2), E8M0, fused_layout.q_fused_permutation(8), 0),
    "wo_a_weight": ((64, GROUP * HEAD_DIM), FP8, fused_layout.o_fused_permutation(GROUP), 1),
    "wo_a_weight_scale": ((64, GROUP * HEAD_DIM // 32), torch.uint8, fused_layout.o_fused_chunk_permutation(GROUP), 1),
}


def small_module(wrap, gen, log):
    m = torch.nn.Module()
    for name, (shape, dtype, perm, dim) in SMALL.items():
        p = bare_param(shape, dtype, gen, loader=spy(default_weight_loader, log))
        m.register_parameter(name, p)
        wrap(p, perm, dim)
    return m


def test_layerwise_reload(ours, gen):
    """vLLM's layerwise reload (used for RL weight updates): the wrapped
    loaders run once on meta tensors (to count what they copy), then on
    freshly materialised ones once the layer has all its weights, and the
    results are copied into the original storage. Two reloads in a row; the
    original Parameter objects and storage stay, the bytes are vLLM's."""
    theirs_log, my_log = [], []
    theirs, mine = small_module(VLLM_PERMUTE_ON_LOAD, gen, theirs_log), small_module(ours, gen, my_log)
    original = {n: (p, p.data_ptr()) for n, p in mine.named_parameters()}
    ckpts = [{n: random_bytes(s, d, gen) for n, (s, d, _, _) in SMALL.items()} for _ in range(3)]
    for m in (theirs, mine):  # the first load: plain, as the model loader does it
        for n, p in m.named_parameters():
            p.weight_loader(p, ckpts[0][n])
        layerwise.record_metadata_for_reloading(m)
    for ckpt in ckpts[1:]:
        for m, log in ((theirs, theirs_log), (mine, my_log)):
            log.clear()
            layerwise.initialize_layerwise_reload(m)
            for n in SMALL:
                p = getattr(m, n)
                assert p.is_meta  # the reload's model-format tensors
                p.weight_loader(p, ckpt[n])
            # One counting run on meta per tensor; the last one completes the
            # layer's element count (so the wrapped loader counted right) and
            # the real loads run then, not later in finalize.
            assert log == ["meta"] * len(SMALL) + ["cpu"] * len(SMALL), log
            layerwise.finalize_layerwise_reload(m, None)
            assert len(log) == 2 * len(SMALL), log
        for n, (_, _, perm, dim) in SMALL.items():
            assert_same_bytes(getattr(theirs, n), gathered(ckpt[n], perm, dim), f"vLLM's {n}")
            assert_same_bytes(getattr(mine, n), getattr(theirs, n), f"ours vs vLLM's {n}")
            p, ptr = original[n]
            assert getattr(mine, n) is p and p.data_ptr() == ptr, n


def test_layerwise_reload_of_vllm_layers(ours, checkpoints):
    """The same reload on vLLM's own wq_b / wo_a layers (TP 2, rank 1), with
    their quantization method's post-load processing (kernel stand-in)."""
    with pytest.MonkeyPatch.context() as mp, single_process_tp_group() as config:
        patch_kernel_choice(mp)
        qc = deepseek_v4_fp8_config()
        models = []
        for wrap in (VLLM_PERMUTE_ON_LOAD, ours):
            model = torch.nn.Module()
            with set_current_vllm_config(config):
                model.wq_b, model.wo_a = build_attention_linears(qc, 1, 2)
            mega_attn_wrap(wrap, model.wq_b, model.wo_a, TOTAL_HEADS // 2)
            for name, (layer, pname, _) in TENSORS.items():
                p = getattr(getattr(model, layer), pname)
                p.weight_loader(p, checkpoints[0][name])
            layerwise.record_metadata_for_reloading(model)
            models.append(model)
        theirs, mine = models
        storage = {name: getattr(getattr(mine, l), p).data_ptr() for name, (l, p, _) in TENSORS.items()}
        for model in models:
            layerwise.initialize_layerwise_reload(model)
            for name, (layer, pname, _) in TENSORS.items():
                p = getattr(getattr(model, layer), pname)
                p.weight_loader(p, checkpoints[1][name])
            layerwise.finalize_layerwise_reload(model, None)
        for name, (layer, pname, _) in TENSORS.items():
            t, m = getattr(getattr(theirs, layer), pname), getattr(getattr(mine, layer), pname)
            assert_same_bytes(t, expected_shard(name, checkpoints[1][name], 1, 2), f"vLLM's {name}")
            assert_same_bytes(m, t, f"ours vs vLLM's {name}")
            assert m.data_ptr() == storage[name], name


# ---- 5. CUDA ---------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("kind", ["wq_b.weight", "wq_b.weight_scale-e8m0", "wo_a.weight", "wo_a.weight_scale"])
def test_cuda_params_from_pinned_host(ours, gen, kind):
    """CUDA params loaded from pinned host checkpoint tensors (what vLLM's
    loader does on a GPU), load then reload, ours vs vLLM's."""
    shape, dtype, perm, dim = bare_case(kind, 16)
    theirs = bare_param(shape, dtype, gen, device="cuda")
    mine = bare_param(shape, dtype, gen, device="cuda")
    VLLM_PERMUTE_ON_LOAD(theirs, perm, dim)
    ours(mine, perm, dim)
    storage = mine.data_ptr()
    for _ in ("load", "reload"):
        ckpt = random_bytes(shape, dtype, gen).pin_memory()
        theirs.weight_loader(theirs, ckpt)
        with expect_path("cuda"):
            mine.weight_loader(mine, ckpt)
        torch.cuda.synchronize()
        assert_same_bytes(theirs, gathered(ckpt, perm, dim), "vLLM's")
        assert_same_bytes(mine, theirs, "ours vs vLLM's")
    assert mine.data_ptr() == storage


@cuda
def test_permutation_in_a_cuda_graph(gen):
    """A Permutation, once used on the device (warm-up: plan and index upload),
    captured in a CUDA graph: each replay permutes whatever the tensor holds."""
    perm = fused_layout.q_fused_permutation(16)
    p = flashmla_perm.Permutation(perm)
    t = random_bytes((16 * HEAD_DIM, 128), FP8, gen).cuda()
    before = t.clone()
    p.apply_(t, 0)  # warm-up, outside the capture
    assert_same_bytes(t, gathered(before, perm, 0), "warm-up")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p.apply_(t, 0)
    for _ in range(2):
        new = random_bytes(t.shape, FP8, gen).cuda()
        t.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bytes(t, gathered(new, perm, 0), "replay")


# ---- 6. bad input at wrap time; a failed load ------------------------------------

N = 4 * HEAD_DIM  # a wq_b shard of 4 heads


def bad_perms():
    good = fused_layout.q_fused_permutation(4)
    dup = good.clone()
    dup[1] = dup[0]
    high, low = good.clone(), good.clone()
    high[3] = N
    low[3] = -1
    return {
        "too_short": (torch.randperm(N - 1), ValueError),
        "too_long": (torch.randperm(N + 1), ValueError),
        "duplicate": (dup, ValueError),
        "out_of_range_high": (high, ValueError),
        "out_of_range_negative": (low, ValueError),
        "float": (good.float(), TypeError),
        "bool": (torch.ones(N, dtype=torch.bool), TypeError),
    }


@pytest.mark.parametrize("case", list(bad_perms()))
def test_bad_perm_is_refused_at_wrap_time(ours, gen, case):
    perm, error = bad_perms()[case]
    p = bare_param((N, 64), FP8, gen)
    with pytest.raises(error):
        ours(p, perm, 0)
    assert p.weight_loader is default_weight_loader


@pytest.mark.parametrize("dim", [2, -3])
def test_bad_dim_is_refused_at_wrap_time(ours, gen, dim):
    p = bare_param((N, 64), FP8, gen)
    with pytest.raises(ValueError):
        ours(p, fused_layout.q_fused_permutation(4), dim)
    assert p.weight_loader is default_weight_loader


def test_self_overlapping_param_is_refused_at_wrap_time(ours, gen):
    """An expanded param: its rows share bytes, so no in-place permutation of
    them can be right."""
    row = random_bytes((1, 64), FP8, gen)
    p = torch.nn.Parameter(row.expand(N, 64), requires_grad=False)
    p.weight_loader = default_weight_loader
    assert p.stride(0) == 0
    with pytest.raises(ValueError):
        ours(p, fused_layout.q_fused_permutation(4), 0)
    assert p.weight_loader is default_weight_loader


def test_wrong_shape_load_raises_the_loaders_error(ours, gen):
    """The original loader's error (default_weight_loader's AssertionError,
    as through vLLM's wrapper), and the param's bytes untouched (no
    permutation of bytes that were never loaded)."""
    perm = fused_layout.q_fused_permutation(4)
    theirs, mine = bare_param((N, 64), FP8, gen), bare_param((N, 64), FP8, gen)
    VLLM_PERMUTE_ON_LOAD(theirs, perm, 0)
    ours(mine, perm, 0)
    before = u8(mine).clone()
    wrong = random_bytes((N, 32), FP8, gen)
    with pytest.raises(Exception) as theirs_error:
        theirs.weight_loader(theirs, wrong)
    with pytest.raises(theirs_error.type):
        mine.weight_loader(mine, wrong)
    assert torch.equal(u8(mine), before)
