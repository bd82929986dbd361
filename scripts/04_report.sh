#!/usr/bin/env bash
# Stage 4 report: scripts/04_report.sh [CONFIG.yaml] [--results outputs/results] [--pairs a:b,...]  (see python -m sage_unsloth.report --help)
set -euo pipefail
PY=python; [ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" -m sage_unsloth.report "$@"
