"""vLLM plugin: route vLLM's load-time permutations of DeepSeek-V4.1 weights
to this package.

Installed as the entry point ``flashmla_perm`` in the group
``vllm.general_plugins``, so vLLM calls :func:`register` in every process it
starts (``VLLM_PLUGINS``, when set, must name ``flashmla_perm``).
``FLASHMLA_PERM_VLLM=0`` (or ``false``, ``off``, ``no``) turns it off. It never
raises into vLLM's start-up, and says in one log line what it changed, or why
nothing.

vLLM's callers take the function by name (``from fused_layout import
permute_on_load``), so it is replaced in fused_layout and in every module
already holding it. If fused_layout is not imported yet, it is not imported
here (that would load all of vLLM's DeepSeek-V4.1 code, seconds, in every
process, whatever the model): an import hook routes it the moment vLLM
imports it, before any caller can take the name.

A function is routed only where it takes the arguments ours takes (names,
kinds and defaults) and, run on small CPU tensors beside ours, writes the
same bytes: a vLLM that changed either is not the one this package was
checked against, and keeps its own (the log line says why). Every decision
is made before the first name changes, and a replacement that fails undoes
the others, so vLLM runs either all of ours or none.
"""

import contextlib
import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
import types

import torch

from ._switches import switch

# A child of vLLM's logger, so the line comes out in vLLM's format.
logger = logging.getLogger("vllm.plugins.flashmla_perm")

FUSED_LAYOUT = "vllm.models.deepseek_v41.common.ops.fused_layout"
# permute_on_load: vLLM 0.33.0's loaders. permute_wq_b_ / permute_wo_a_: the
# earlier vLLM change this package's first API came from, where a build has them.
ROUTED_NAMES = ("permute_on_load", "permute_wq_b_", "permute_wo_a_")
# vLLM's functions this process routed, by name (what a caller had before).
_originals = {}
# A module's own namespace, read past its class's attribute hooks: a lazy
# module is not loaded by looking, and one whose attributes raise is still read.
_MODULE_DICT = types.ModuleType.__dict__["__dict__"]


def _why_not():
    """Why nothing should be routed, or None."""
    try:
        if not switch("FLASHMLA_PERM_VLLM", True):
            return f"FLASHMLA_PERM_VLLM={os.environ['FLASHMLA_PERM_VLLM'].strip()}"
    except ValueError as e:
        return str(e)
    import flashmla_perm

    info = flashmla_perm.build_info()
    if not info["native"]:
        return f"the native module is not loaded ({info['native_error']})"
    return None


def _fused_layout_file_exists():
    """Whether this vLLM has fused_layout, without importing its packages."""
    try:
        vllm_spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return False
    roots = list(vllm_spec.submodule_search_locations or []) if vllm_spec else []
    rel = os.path.join(*FUSED_LAYOUT.split(".")[1:]) + ".py"
    return any(os.path.exists(os.path.join(root, rel)) for root in roots)


def _namespace(module):
    """The dict a module's global names live in (raises if it has none)."""
    if issubclass(type(module), types.ModuleType):
        return _MODULE_DICT.__get__(module)
    return vars(module)  # something else in sys.modules: its attributes


def _holders(fused_layout, chosen):
    """Every (module name, module, name) whose namespace holds vLLM's function
    of that name, fused_layout first; and the sys.modules entries that could
    not be read (skipped, each with why)."""
    found, unreadable = [], []
    entries = [(FUSED_LAYOUT, fused_layout)]
    entries += [(n, m) for n, m in list(sys.modules.items()) if m is not fused_layout]
    for module_name, module in entries:
        try:
            namespace = _namespace(module)
            if not isinstance(namespace, dict):
                continue
            held = [name for name, (original, _) in chosen.items() if namespace.get(name) is original]
        except Exception as e:  # noqa: BLE001 -- an odd entry must not stop the rest
            unreadable.append(f"{module_name} ({type(e).__name__}: {e})")
            continue
        found += [(module_name, module, name) for name in held]
    return found, unreadable


def _replace_all(found, chosen):
    """Ours in every place found, or (if one refuses) vLLM's back in all of
    them. None when all took it; otherwise the log line."""
    for i, (module_name, module, name) in enumerate(found):
        ours = chosen[name][1]
        try:
            setattr(module, name, ours)
            if _namespace(module).get(name) is not ours:
                raise RuntimeError("the name did not change")
        except Exception as e:  # noqa: BLE001 -- a module that refuses: undo the others
            failed = f"{name} could not be replaced in {module_name} ({type(e).__name__}: {e})"
            break
    else:
        return None
    stuck = []
    for module_name, module, name in reversed(found[: i + 1]):
        original, ours = chosen[name]
        try:
            if _namespace(module).get(name) is ours:
                setattr(module, name, original)
            if _namespace(module).get(name) is not ours:
                continue
        except Exception:  # noqa: BLE001 -- said in the line
            pass
        stuck.append(f"{name} in {module_name}")
    if stuck:  # the line must not say "changed nothing"
        return f"routed only {', '.join(stuck)}, where vLLM's could not be put back: {failed}"
    return f"changed nothing: {failed}"


def _parameters(fn):
    """(name, kind, default) of each parameter: what a caller's arguments bind
    to. Annotations aside."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _differs(original, ours):
    """Why ``ours`` cannot stand in for ``original``, or None. A vLLM whose
    function takes other arguments (or other defaults) is not the one ours
    was checked against: its callers would get 0.33.0's bytes, or a
    TypeError at start-up."""
    try:
        # A default whose == raises (a tensor) is not ours either.
        if _parameters(original) == _parameters(ours):
            return None
    except Exception as e:  # noqa: BLE001 -- no signature to read, or to compare
        return f"its signature cannot be read or compared ({type(e).__name__}: {e})"
    return f"it takes {inspect.signature(original)}, not {inspect.signature(ours)}"


# ---- the probe: vLLM's function and ours on the same small CPU tensors ----------
#
# A function that keeps the signature can still do something else (a later
# vLLM, a decorator): the bytes decide. The cases are the model's layouts on
# a shard of a few heads, in the dtypes vLLM loads (fp8 weights, ue8m0 scales
# as uint8), along dim 0 and 1, plus a random permutation; each param is
# loaded twice (load, then reload).

FP8 = torch.float8_e4m3fn


def _bytes(shape, dtype, seed):
    """Random bytes 1..255 as a 1-byte ``dtype``: a byte left unwritten shows."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, shape, dtype=torch.uint8, generator=gen).view(dtype)


def _copy_into(param, loaded_weight):
    """The probe's weight loader: vLLM's default_weight_loader, for one shape."""
    param.data.copy_(loaded_weight)


def _loaded(fn, shape, dtype, perm, dim):
    """A param wrapped by ``fn`` (a permute_on_load), then loaded twice: its bytes."""
    param = torch.nn.Parameter(_bytes(shape, dtype, 0), requires_grad=False)
    param.weight_loader = _copy_into
    fn(param, perm.clone(), dim)
    for seed in (1, 2):
        param.weight_loader(param, _bytes(shape, dtype, seed))
    return [param.data.view(torch.uint8)]


def _permute_on_load_cases():
    from .reference import o_fused_chunk_permutation, o_fused_permutation, q_fused_permutation

    # A small head_dim (permute_on_load takes the permutation as given). Not
    # as many heads as 16-row chunks (4 x 4 would be a transpose that is its
    # own inverse, and a function applying the inverse would pass).
    q, o, chunks = q_fused_permutation(4, 32), o_fused_permutation(8, 64), o_fused_chunk_permutation(8, 64)
    shuffled = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    cases = [
        ("an fp8 wq_b shard, dim 0", (4 * 32, 16), FP8, q, 0),
        ("its uint8 scale, dim 0", (4 * 32, 1), torch.uint8, q, 0),
        ("an fp8 wo_a shard, dim 1", (2, 8 * 64), FP8, o, 1),
        ("its uint8 scale, dim 1", (2, 8 * 64 // 32), torch.uint8, chunks, 1),
        ("a random permutation, dim 1", (3, 40), FP8, shuffled, 1),
    ]
    return [(what, lambda fn, c=c: _loaded(fn, *c)) for what, *c in cases]


def _model_op_cases(name):
    """permute_wq_b_(weight, weight_scale, num_local_heads) on 2 heads;
    permute_wo_a_(weight, weight_scale, heads_per_group) on one group of 8.
    head_dim 512: these find it from the shapes, and vLLM's may assume it."""
    if name == "permute_wq_b_":
        shapes, last = ((2 * 512, 32), (2 * 512, 1)), 2
    else:
        shapes, last = ((2, 8 * 512), (2, 8 * 512 // 32)), 8

    def run(fn):
        weight, scale = _bytes(shapes[0], FP8, 4), _bytes(shapes[1], torch.uint8, 5)
        fn(weight, scale, last)
        return [weight.view(torch.uint8), scale]

    return [(f"an fp8 shard and its uint8 scale, {last} heads", run)]


def _probe(name, original, ours):
    """Why ``original`` is not shown to write the bytes ``ours`` writes, or None."""
    # The caller's default device (vLLM builds models under one), grad and
    # inference modes must not reach these tensors. One thread: on a busy
    # machine each parallel region waits for a time slice (about 12 ms on
    # 2 cores), many times the probe's whole work; put back after.
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        # (A device context only where one is set: it costs a Python call per op.)
        on_cpu = contextlib.nullcontext() if torch.get_default_device().type == "cpu" else torch.device("cpu")
        with on_cpu, torch.inference_mode(False), torch.no_grad():
            cases = _permute_on_load_cases() if name == "permute_on_load" else _model_op_cases(name)
            for what, run in cases:
                results = []
                for who, fn in (("it", original), ("ours", ours)):
                    try:
                        results.append(run(fn))
                    except Exception as e:  # noqa: BLE001 -- not shown equal: keep vLLM's
                        said = (str(e).splitlines() or [""])[0][:200]
                        return f"{who} raised {type(e).__name__} on {what}: {said}"
                if not all(torch.equal(a, b) for a, b in zip(*results)):
                    return f"it wrote other bytes than ours on {what}"
    finally:
        if threads > 1:
            torch.set_num_threads(threads)
    return None


def _devices_text(info):
    if info["cuda"]:
        return f"native on cpu and cuda ({_kernels_text(info)})"
    import torch

    if torch.version.cuda is None:
        return "native on cpu"
    # A CUDA torch with the CPU-only module: GPU tensors take the same
    # gather vLLM does (right bytes, no gain).
    return f"native on cpu; on cuda torch's gather, as vLLM's: {info['cuda_off_reason']}"


def _kernels_text(info):
    """The image this machine's GPUs load (NVML's view: nothing of CUDA is
    called here); without a GPU seen, what the install built."""
    from . import _kernels

    built = f"built at install by {info['cuda_compiler']}"
    archs = _kernels.gpu_archs()
    if archs:
        images = ", ".join(f"{a}: {_kernels.image_for(a, info['cuda_archs'], info['cuda_ptx'])}" for a in archs)
        return f"kernels {built}; {images}"
    return f"kernels {built} for {', '.join(info['cuda_archs'])} and PTX for {info['cuda_ptx']}"


def _route(fused_layout):
    """Routes what fused_layout has; returns the log line."""
    import flashmla_perm

    namespace = _namespace(fused_layout)
    chosen, already, left = {}, [], []
    for name in ROUTED_NAMES:
        if name not in namespace:
            continue
        ours, original = getattr(flashmla_perm, name), namespace[name]
        if original is ours:
            already.append(name)
            continue
        # The signature first: a cheap filter, and what the probe's calls rely on.
        why = _differs(original, ours) or _probe(name, original, ours)
        if why:
            left.append(f"{name} ({why})")
            continue
        chosen[name] = (original, ours)
    kept = f"; left vLLM's {', '.join(left)}" if left else ""
    if not chosen:
        if already:
            return f"already routed: {', '.join(already)}{kept}"
        if left:
            return f"changed nothing{kept}"
        return f"changed nothing: {FUSED_LAYOUT} has none of {', '.join(ROUTED_NAMES)}"
    found, unreadable = _holders(fused_layout, chosen)
    failed = _replace_all(found, chosen)
    if failed:
        return failed + kept
    for name, (original, _) in chosen.items():
        _originals[name] = original
    modules = sorted({module_name for module_name, _, _ in found} - {FUSED_LAYOUT})
    where = FUSED_LAYOUT + (f" and {', '.join(modules)}" if modules else "")
    skipped = f"; could not read {', '.join(unreadable)}" if unreadable else ""
    return (
        f"routed vLLM's {', '.join(chosen)} to flashmla_perm {flashmla_perm.__version__}"
        f" (in place, {_devices_text(flashmla_perm.build_info())}) in {where}{kept}{skipped}"
    )


def _log_route(fused_layout):
    try:
        line = _route(fused_layout)
    except Exception as e:  # noqa: BLE001 -- a plugin must not stop vLLM
        line = f"changed nothing: {type(e).__name__}: {e}"
    logger.info("flashmla_perm: %s", line)


class _RouteOnImport(importlib.abc.MetaPathFinder):
    """Finds fused_layout as the other finders would, and routes it right
    after its code runs (before any module can import a name from it)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != FUSED_LAYOUT:
            return None
        _uninstall()
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            exec_module = spec.loader.exec_module

            def exec_then_route(module):
                exec_module(module)
                _log_route(module)

            spec.loader.exec_module = exec_then_route
        return spec


def _uninstall():
    # A new list, never an edit of the old one: an import running in another
    # thread iterates the list it read, and an edit in place can make it skip
    # a finder (and report an existing module missing).
    sys.meta_path = [f for f in sys.meta_path if type(f) is not _RouteOnImport]


def register() -> None:
    """vLLM's general-plugin hook: idempotent, never raises."""
    try:
        why = _why_not()
        if why:
            line = f"changed nothing: {why}"
        elif FUSED_LAYOUT in sys.modules:
            line = _route(sys.modules[FUSED_LAYOUT])
        elif not _fused_layout_file_exists():
            line = f"changed nothing: this vLLM has no {FUSED_LAYOUT}"
        else:
            sys.meta_path = [_RouteOnImport()] + [f for f in sys.meta_path if type(f) is not _RouteOnImport]
            line = f"will route vLLM's permute_on_load when {FUSED_LAYOUT} is imported"
    except Exception as e:  # noqa: BLE001 -- a plugin must not stop vLLM's start-up
        line = f"changed nothing: {type(e).__name__}: {e}"
    logger.info("flashmla_perm: %s", line)
