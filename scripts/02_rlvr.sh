#!/usr/bin/env bash
# Stage 2 RLVR: scripts/02_rlvr.sh CONFIG [--key value ...] [--resume]  (e.g. configs/rlvr/qwen2.5-math-7b/grpo_branch.yaml)
set -euo pipefail
KIT="$(cd "$(dirname "$0")/.." && pwd)"  # the kit's venvs, from any working directory
PY=python; [ -x "$KIT/.venv/bin/python" ] && PY="$KIT/.venv/bin/python"
exec "$PY" -m sage_unsloth.rlvr "$@"
