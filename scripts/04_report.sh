#!/usr/bin/env bash
# Stage 4 report: scripts/04_report.sh [CONFIG.yaml] [--results outputs/results] [--pairs a:b,...]  (see python -m sage_unsloth.report --help)
set -euo pipefail
KIT="$(cd "$(dirname "$0")/.." && pwd)"  # the kit's venvs, from any working directory
PY=python; [ -x "$KIT/.venv/bin/python" ] && PY="$KIT/.venv/bin/python"
exec "$PY" -m sage_unsloth.report "$@"
