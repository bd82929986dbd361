#!/usr/bin/env bash
# Stage 1 SFT: scripts/01_sft.sh CONFIG [--key value ...]  (see python -m sage_unsloth.sft --help)
set -euo pipefail
PY=python; [ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" -m sage_unsloth.sft "$@"
