"""vLLM plugin: route vLLM's load-time permutations of DeepSeek-V4.1 weights
to this package.

Installed as the entry point ``flashmla_perm`` in the group
``vllm.general_plugins``, so vLLM calls :func:`register` in every process it
starts (``VLLM_PLUGINS``, when set, must name ``flashmla_perm``).
``FLASHMLA_PERM_VLLM=0`` turns it off. It never raises into vLLM's start-up:
whatever goes wrong, it changes nothing and says why in one log line.

vLLM's callers take the function by name (``from fused_layout import
permute_on_load``), so it is replaced in fused_layout and in every module
already holding it. If fused_layout is not imported yet, it is not imported
here (that would load all of vLLM's DeepSeek-V4.1 code, seconds, in every
process, whatever the model): an import hook routes it the moment vLLM
imports it, before any caller can take the name.
"""

import importlib.abc
import importlib.util
import logging
import os
import sys

# A child of vLLM's logger, so the line comes out in vLLM's format.
logger = logging.getLogger("vllm.plugins.flashmla_perm")

FUSED_LAYOUT = "vllm.models.deepseek_v41.common.ops.fused_layout"
# permute_on_load: vLLM 0.33.0's loaders. permute_wq_b_ / permute_wo_a_: the
# earlier vLLM change this package's first API came from, where a build has them.
ROUTED_NAMES = ("permute_on_load", "permute_wq_b_", "permute_wo_a_")


def _why_not():
    """Why nothing should be routed, or None."""
    if os.environ.get("FLASHMLA_PERM_VLLM", "1") == "0":
        return "FLASHMLA_PERM_VLLM=0"
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


def _route(fused_layout):
    """Routes what fused_layout has; returns the log line."""
    import flashmla_perm

    routed, already, modules = [], [], set()
    for name in ROUTED_NAMES:
        if name not in vars(fused_layout):
            continue
        ours, original = getattr(flashmla_perm, name), getattr(fused_layout, name)
        if original is ours:
            already.append(name)
            continue
        modules.update(_replace_everywhere(name, original, ours))
        routed.append(name)
    if not routed:
        if already:
            return f"already routed: {', '.join(already)}"
        return f"changed nothing: {FUSED_LAYOUT} has none of {', '.join(ROUTED_NAMES)}"
    modules.discard(FUSED_LAYOUT)
    where = FUSED_LAYOUT + (f" and {', '.join(sorted(modules))}" if modules else "")
    devices = "cpu and cuda" if flashmla_perm.build_info()["cuda"] else "cpu"
    return (f"routed vLLM's {', '.join(routed)} to flashmla_perm {flashmla_perm.__version__}"
            f" (in place, native on {devices}) in {where}")


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
