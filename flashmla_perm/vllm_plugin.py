"""vLLM plugin: route vLLM's load-time permutations of DeepSeek-V4.1 weights
to this package.

Installed as the entry point ``flashmla_perm`` in the group
``vllm.general_plugins``, so vLLM calls :func:`register` in every process it
starts (``VLLM_PLUGINS``, when set, must name ``flashmla_perm``).
``FLASHMLA_PERM_VLLM=0`` (or ``false``, ``off``, ``no``) turns it off. It never
raises into vLLM's start-up: whatever goes wrong, it changes nothing and says
why in one log line.

vLLM's callers take the function by name (``from fused_layout import
permute_on_load``), so it is replaced in fused_layout and in every module
already holding it. If fused_layout is not imported yet, it is not imported
here (that would load all of vLLM's DeepSeek-V4.1 code, seconds, in every
process, whatever the model): an import hook routes it the moment vLLM
imports it, before any caller can take the name.

A function is routed only where it takes the arguments ours takes (names,
kinds and defaults): a vLLM that changed them is not the one this package
was checked against, and keeps its own (the log line says so).
"""

import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys

from ._switches import switch

# A child of vLLM's logger, so the line comes out in vLLM's format.
logger = logging.getLogger("vllm.plugins.flashmla_perm")

FUSED_LAYOUT = "vllm.models.deepseek_v41.common.ops.fused_layout"
# permute_on_load: vLLM 0.33.0's loaders. permute_wq_b_ / permute_wo_a_: the
# earlier vLLM change this package's first API came from, where a build has them.
ROUTED_NAMES = ("permute_on_load", "permute_wq_b_", "permute_wo_a_")
# vLLM's functions this process routed, by name (what a caller had before).
_originals = {}


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


def _replace_everywhere(name, original, ours):
    """``ours`` in place of ``original`` in every imported module that holds it;
    the names of the modules changed."""
    changed = []
    for module_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get(name) is original:
            setattr(module, name, ours)
            changed.append(module_name)
    return changed


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


def _devices_text(info):
    if info["cuda"]:
        if info.get("cuda_compiler") == "nvrtc":
            return "native on cpu and cuda (kernels compiled at first use by NVRTC)"
        return "native on cpu and cuda (kernels built by nvcc)"
    import torch

    if torch.version.cuda is None:
        return "native on cpu"
    # A CUDA torch with the CPU-only module: GPU tensors take the same
    # gather vLLM does (right bytes, no gain).
    return f"native on cpu; on cuda torch's gather, as vLLM's: {info['cuda_off_reason']}"


def _route(fused_layout):
    """Routes what fused_layout has; returns the log line."""
    import flashmla_perm

    routed, already, left, modules = [], [], [], set()
    for name in ROUTED_NAMES:
        if name not in vars(fused_layout):
            continue
        ours, original = getattr(flashmla_perm, name), getattr(fused_layout, name)
        if original is ours:
            already.append(name)
            continue
        why = _differs(original, ours)
        if why:
            left.append(f"{name} ({why})")
            continue
        _originals[name] = original
        modules.update(_replace_everywhere(name, original, ours))
        routed.append(name)
    kept = f"; left vLLM's {', '.join(left)}" if left else ""
    if not routed:
        if already:
            return f"already routed: {', '.join(already)}{kept}"
        if left:
            return f"changed nothing{kept}"
        return f"changed nothing: {FUSED_LAYOUT} has none of {', '.join(ROUTED_NAMES)}"
    modules.discard(FUSED_LAYOUT)
    where = FUSED_LAYOUT + (f" and {', '.join(sorted(modules))}" if modules else "")
    return (
        f"routed vLLM's {', '.join(routed)} to flashmla_perm {flashmla_perm.__version__}"
        f" (in place, {_devices_text(flashmla_perm.build_info())}) in {where}{kept}"
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
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RouteOnImport)]


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
            _uninstall()
            sys.meta_path.insert(0, _RouteOnImport())
            line = f"will route vLLM's permute_on_load when {FUSED_LAYOUT} is imported"
    except Exception as e:  # noqa: BLE001 -- a plugin must not stop vLLM's start-up
        line = f"changed nothing: {type(e).__name__}: {e}"
    logger.info("flashmla_perm: %s", line)
