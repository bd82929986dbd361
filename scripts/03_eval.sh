#!/usr/bin/env bash
# Stage 3 evaluation: scripts/03_eval.sh CONFIG [--key value ...]  (e.g. configs/eval/qwen2.5-math-7b.yaml)
set -euo pipefail
PY=python; [ -x .venv/bin/python ] && PY=.venv/bin/python; [ -n "${SAGE_EVAL_PYTHON:-}" ] && PY=$SAGE_EVAL_PYTHON
exec "$PY" -m sage_unsloth.eval "$@"
