#!/usr/bin/env bash
# Sets up (or reuses) a virtual environment with torch and this package built
# in place, and prints nothing else but progress. Sourced by bench.sh and test.sh.
#
#   FLASHMLA_PERM_VENV   where the environment lives         (default: .venv)
#   FLASHMLA_PERM_TORCH  torch release to install            (default: 2.13.0, the CPU build;
#                        2.14.1 is the CUDA 13.0 build: its NVRTC builds the kernels)
#   FLASHMLA_PERM_WITH_VLLM  0: no vLLM 0.33.0 beside torch 2.13.0 (default 1)
#   plus setup.py's switches: FLASHMLA_PERM_CUDA, FLASHMLA_PERM_CUDA_ARCHS
# Any release in pyproject.toml's range works (README: "Tested torch releases").
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${FLASHMLA_PERM_VENV:-$ROOT/.venv}
TORCH=${FLASHMLA_PERM_TORCH:-2.13.0}
PY=$VENV/bin/python
# An on/off switch as flashmla_perm/_switches.py reads it (1/true/on/yes,
# 0/false/off/no, any case, blanks ignored; unset: the default): 1 or 0, or
# a stop naming the variable and the value.
switch() {  # name default
  local word
  word=$(printf '%s' "${!1:-}" | tr '[:upper:]' '[:lower:]' | tr -d '[:space:]')
  case $word in
    '') echo "$2" ;; 1 | true | on | yes) echo 1 ;; 0 | false | off | no) echo 0 ;;
    *) echo "$1='${!1}' is not a switch value: use one of 1, true, on, yes (on) or 0, false, off, no (off), in any case" >&2
       exit 2 ;;
  esac
}
WITH_VLLM=$(switch FLASHMLA_PERM_WITH_VLLM 1)

if [ ! -x "$PY" ]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
fi
if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
  echo "== installing torch==$TORCH into $VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "torch==$TORCH"
fi
# vLLM 0.33.0's DeepSeek-V4.1 loading code, on the CPU torch it pins (2.13.0),
# so that tests/test_vllm.py and the benchmark's `load` kind run vLLM's own
# code: its pins, --no-deps (vLLM's full dependency set is a CUDA stack of
# several GB that loading never uses). On by default with torch 2.13.0;
# FLASHMLA_PERM_WITH_VLLM=0 leaves it out (its tests then skip).
if [ "$WITH_VLLM" = 1 ] && [ "$TORCH" = 2.13.0 ] &&
   ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '0.33.0')" 2>/dev/null; then
  echo "== installing vLLM 0.33.0's CPU loading stack into $VENV (about 2 GB)"
  rm -f "$VENV/.vllm_imports"
  "$PY" -m pip install -q --no-deps -r "$ROOT/scripts/vllm033-cpu-requirements.txt"
fi
# The build and test tools (pip only when one is missing: asking the index
# costs about 15 s a call, and CI sources this six times). --no-warn-conflicts:
# vLLM requires ninja, so pip would check vLLM too and list, as an ERROR, each
# of its requirements that the stack above leaves out on purpose. The check
# below is what tells a real conflict.
if ! "$PY" -c "import ninja, setuptools, wheel, pytest, xdist, hypothesis, numpy" 2>/dev/null; then
  "$PY" -m pip install -q --no-warn-conflicts ninja setuptools wheel pytest pytest-xdist hypothesis numpy
fi
# Once vLLM's stack is installed (and the tools beside it), the modules the
# benchmark's load kind imports must import, as vLLM 0.33.0: checked until
# they do (a stamp), their output shown only if they do not (on success, it
# is vLLM's warnings about its GPU stack).
if [ "$WITH_VLLM" = 1 ] && [ "$TORCH" = 2.13.0 ] && [ ! -e "$VENV/.vllm_imports" ]; then
  if ! out=$("$PY" -c "
import vllm
assert vllm.__version__ == '0.33.0', f'vllm {vllm.__version__}, not 0.33.0'
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.models.deepseek_v41.common.ops import fused_layout" 2>&1); then
    printf '%s\n' "$out"
    echo "== vLLM 0.33.0's CPU loading stack does not import in $VENV"
    exit 1
  fi
  touch "$VENV/.vllm_imports"
fi

# The native module is built in place (flashmla_perm/_C*.so), so a stamp
# records which torch and sources it was built from: another environment or
# an edited source rebuilds it.
stamp_now() {
  (cd "$ROOT" && "$PY" -c "import torch; print(torch.__version__)" &&
    find setup.py csrc -type f ! -name '*.pyc' | sort | xargs cat | sha256sum &&
    env | grep -E '^(FLASHMLA_PERM_CUDA|FLASHMLA_PERM_CUDA_ARCHS|FLASHMLA_PERM_SANITIZE)=' | sort || true)
}
STAMP=$ROOT/flashmla_perm/.build_stamp
if [ "$(stamp_now)" != "$(cat "$STAMP" 2>/dev/null)" ] || ! ls "$ROOT"/flashmla_perm/_C*.so >/dev/null 2>&1; then
  echo "== building flashmla_perm against torch $TORCH (a few minutes)"
  rm -f "$ROOT"/flashmla_perm/_C*.so "$STAMP"
  start=$(date +%s)
  # The whole log is kept (CI's warnings gate reads it).
  if ! (cd "$ROOT" && "$PY" -m pip install -v --no-build-isolation -e .) > "$VENV/build.log" 2>&1; then
    tail -n 60 "$VENV/build.log"
    echo "== build FAILED; full log: $VENV/build.log"
    exit 1
  fi
  echo "== built in $(( $(date +%s) - start ))s (log: $VENV/build.log)"
  # pip shows a build's output only with -v: repeat setup.py's line on CUDA.
  grep -E '^ *flashmla_perm: (kernels|CUDA off)' "$VENV/build.log" | tail -n 1 | sed 's/^ */== /' || true
  stamp_now > "$STAMP"
fi
# (An instrumented module loads only with its sanitizer runtime preloaded.)
if [ -z "${FLASHMLA_PERM_SANITIZE:-}" ]; then
  "$PY" -c "import flashmla_perm; print('== flashmla_perm', flashmla_perm.build_info())"
fi
