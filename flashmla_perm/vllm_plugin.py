"""vLLM plugin: route vLLM's load-time permutations of DeepSeek-V4.1 weights
to this package.

Installed as the entry point ``flashmla_perm`` in the group
``vllm.general_plugins``, so vLLM calls :func:`register` in every process it
starts (``VLLM_PLUGINS``, when set, must name ``flashmla_perm``).
``FLASHMLA_PERM_VLLM=0`` turns it off. It never raises into vLLM's start-up:
whatever goes wrong, it changes nothing and says why in one log line.
"""

import logging
import os
import sys

# A child of vLLM's logger, so the line comes out in vLLM's format.
logger = logging.getLogger("vllm.plugins.flashmla_perm")

FUSED_LAYOUT = "vllm.models.deepseek_v41.common.ops.fused_layout"
# permute_on_load: vLLM 0.33.0's loaders. permute_wq_b_ / permute_wo_a_: the
# earlier vLLM change this package's first API came from, where a build has them.
ROUTED_NAMES = ("permute_on_load", "permute_wq_b_", "permute_wo_a_")

# vLLM's own functions, by name, as found the first time (register() may run again).
_originals = {}


def _why_not():
    """Why nothing should be routed, or None."""
    if os.environ.get("FLASHMLA_PERM_VLLM", "1") == "0":
        return "FLASHMLA_PERM_VLLM=0"
    import flashmla_perm

    info = flashmla_perm.build_info()
    if not info["native"]:
        return f"the native module is not loaded ({info['native_error']})"
    return None


def _replace_everywhere(name, original, ours):
    """``ours`` in place of ``original`` in every imported module that holds it
    (callers import it with ``from ... import``); the modules changed."""
    changed = []
    for module_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get(name) is original:
            setattr(module, name, ours)
            changed.append(module_name)
    return changed


def _route():
    """Routes what vLLM has; returns the log line."""
    import importlib

    import flashmla_perm

    try:
        fused_layout = importlib.import_module(FUSED_LAYOUT)
    except ImportError as e:
        return f"changed nothing: this vLLM has no {FUSED_LAYOUT} ({e})"
    routed, modules = [], set()
    for name in ROUTED_NAMES:
        if name not in vars(fused_layout):
            continue
        ours = getattr(flashmla_perm, name)
        original = _originals.setdefault(name, getattr(fused_layout, name))
        if original is ours:
            continue
        modules.update(_replace_everywhere(name, original, ours))
        routed.append(name)
    if not routed:
        return f"changed nothing: {FUSED_LAYOUT} has none of {', '.join(ROUTED_NAMES)}"
    modules.discard(FUSED_LAYOUT)
    where = f"{FUSED_LAYOUT}" + (f" and {', '.join(sorted(modules))}" if modules else "")
    info = flashmla_perm.build_info()
    devices = "cpu and cuda" if info["cuda"] else "cpu"
    return (f"routed vLLM's {', '.join(routed)} to flashmla_perm {flashmla_perm.__version__}"
            f" (in place, native on {devices}) in {where}")


def register() -> None:
    """vLLM's general-plugin hook: idempotent, never raises."""
    try:
        why = _why_not()
        line = f"changed nothing: {why}" if why else _route()
    except Exception as e:  # noqa: BLE001 -- a plugin must not stop vLLM's start-up
        line = f"changed nothing: {type(e).__name__}: {e}"
    logger.info("flashmla_perm: %s", line)
