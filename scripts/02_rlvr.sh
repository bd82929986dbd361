#!/usr/bin/env bash
# Stage 2 RLVR: scripts/02_rlvr.sh CONFIG [--key value ...] [--resume]  (e.g. configs/rlvr/qwen2.5-math-7b/grpo_branch.yaml)
set -euo pipefail
PY=python; [ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" -m sage_unsloth.rlvr "$@"
