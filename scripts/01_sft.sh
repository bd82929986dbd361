#!/usr/bin/env bash
# Stage 1 SFT: scripts/01_sft.sh CONFIG [--key value ...]  (see python -m sage_unsloth.sft --help)
set -euo pipefail
KIT="$(cd "$(dirname "$0")/.." && pwd)"  # the kit's venvs, from any working directory
PY=python; [ -x "$KIT/.venv/bin/python" ] && PY="$KIT/.venv/bin/python"
exec "$PY" -m sage_unsloth.sft "$@"
