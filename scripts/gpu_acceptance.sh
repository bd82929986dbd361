#!/usr/bin/env bash
# The acceptance check of the GPU path, offline, at most 10 minutes on one A100 / H100 (docs/verification.md says
# what each check means; sage_unsloth/acceptance/run.py runs them):
#
#   bash scripts/gpu_acceptance.sh [--wheelhouse DIR] [--workdir DIR]    # on the GPU machine
#   bash scripts/gpu_acceptance.sh --cpu-rehearsal [--workdir DIR]       # the same steps on a CPU, tiny model
#
# On the GPU machine: its python3 must already hold a CUDA build of torch 2.11 or newer (and numpy, pyarrow, pandas:
# GPU images carry them; see docs/troubleshooting.md). Everything else the kit needs, besides torch and vLLM, comes
# from a wheel bundle made on a machine with network by `make wheelhouse` (wheelhouse/, at most 60 MiB; copy it beside
# this checkout). It is installed into WORKDIR/site, first on PYTHONPATH for this run only: the machine's own packages
# are left as they are. vLLM's check runs where vLLM is importable and is skipped in one line where not.
#
# Output: WORKDIR/verdict.json (default WORKDIR /tmp/sage_gpu_acceptance; copied to $OUT/ when OUT is set) and a
# one-screen summary; every stage's log in WORKDIR/logs/. Exit 0 when every check that applies passed, 1 when one
# failed, 2 when the machine cannot run it (the line says what is missing).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK=/tmp/sage_gpu_acceptance
WHEELHOUSE="$ROOT/wheelhouse"
REHEARSAL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-rehearsal) REHEARSAL="--cpu-rehearsal" ;;
    --workdir) WORK="$2"; shift ;;
    --wheelhouse) WHEELHOUSE="$2"; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1 (see: bash scripts/gpu_acceptance.sh --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$WORK" || exit 2
WORK="$(cd "$WORK" && pwd)"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
export UNSLOTH_SKIP_TORCHVISION_CHECK=1 PYTHONUNBUFFERED=1

if [ -n "$REHEARSAL" ]; then
  PY=python3; [ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
else
  PY=python3
  if ! "$PY" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if v >= (2, 11) and torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "error: $PY has no CUDA build of torch >= 2.11 that sees a GPU: use the GPU image's python3 (or --cpu-rehearsal)" >&2
    exit 2
  fi
  missing="$("$PY" -c 'import importlib.util as u; print(" ".join(m for m in ("numpy", "pyarrow", "pandas") if u.find_spec(m) is None))')"
  if [ -n "$missing" ]; then
    echo "error: $PY lacks $missing (datasets needs them; GPU images carry them): make wheelhouse WHEELHOUSE_FULL=1 adds them" >&2
    exit 2
  fi
  if compgen -G "$WHEELHOUSE/*.whl" >/dev/null; then
    echo "installing $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels from $WHEELHOUSE into $WORK/site (offline)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$WORK/site" "$WHEELHOUSE"/*.whl \
      || { echo "error: installing $WHEELHOUSE failed (made for another Python? see make wheelhouse WHEEL_PYTHON=...)" >&2; exit 2; }
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  elif ! "$PY" -c 'import unsloth_zoo, trl, peft, datasets' 2>/dev/null; then
    echo "error: no wheels in $WHEELHOUSE and the kit's stack is not installed: run make wheelhouse where there is network and copy wheelhouse/ here (docs/troubleshooting.md)" >&2
    exit 2
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 2
"$PY" -m sage_unsloth.acceptance "$WORK" $REHEARSAL
code=$?
if [ -n "${OUT:-}" ] && [ -f "$WORK/verdict.json" ]; then cp "$WORK/verdict.json" "$OUT/"; fi
exit $code
