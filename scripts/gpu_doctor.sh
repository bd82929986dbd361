#!/usr/bin/env bash
# One-shot GPU check of the kit: `sage-unsloth doctor` (machine, driver, kernels, pins, vLLM, memory) and its
# 2-step SAGE self-test on the tiny offline model with the Unsloth backend (real CUDA / Triton kernels, real
# patching), then the same self-test on the TRL backend. No hub and no network are needed at run time.
# NOT YET RUN ON A GPU: it was written and dry-run on CPU only (the self-test forces Unsloth's patching there).
#
# Usage, from the repository root on the GPU machine:   bash scripts/gpu_doctor.sh [CONFIG]
#   CONFIG (optional) e.g. configs/rlvr/qwen2.5-math-7b/grpo_branch.yaml: its memory estimate and needs are checked.
#   Output: $OUT (default /tmp/sage_gpu_doctor) holds doctor.json, selftest_trl.json, gpu_doctor.log.
#   Exit status 0 only when nothing failed. Give it ~8 minutes (imports and Unsloth's compile take most).
#
# A machine whose Python already has torch (ideally the pinned 2.13.0 CUDA 13 wheel), transformers, accelerate,
# safetensors, tokenizers and pyyaml but not the rest: download these wheels ON A MACHINE WITH NETWORK into .whl/
# in the repository root (ignored by git; ~36 MiB, they travel with the tree), the script installs them offline:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform any -d .whl unsloth==2026.10.9 unsloth_zoo==2026.10.9 trl==1.15.0 peft==0.21.2 \
#     datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 pydantic==2.14.4 pydantic_core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 tyro==1.0.17 docstring-parser==0.18.0 \
#     typeguard==4.6.1 msgspec==0.23.0 cut_cross_entropy==25.1.1 packaging
# (Match --python-version to the GPU machine's python3.) With network, `pip install -e ".[gpu]"` instead.
# A preinstalled torch, TRL or vLLM other than the pins is reported by the pin check (FAIL) but the self-test still
# runs (SAGE_ALLOW_UNPINNED=1 below turns the kit's version guard into a warning): then it checks the kit's logic
# on real CUDA kernels, not the pinned stack. With a CONFIG that uses Unsloth's vLLM the doctor also runs its
# fast_inference smoke test (the tiny model through Unsloth's vLLM, one generate with a LoRA).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/sage_gpu_doctor}"; mkdir -p "$OUT"
LOG="$OUT/gpu_doctor.log"
cd "$ROOT" || exit 2
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/sage_site .whl/*.whl \
    || { echo "offline wheel install failed" | tee "$LOG"; exit 3; }
  export PYTHONPATH="/tmp/sage_site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false \
       PYTHONUNBUFFERED=1 UNSLOTH_SKIP_TORCHVISION_CHECK=1 HF_HUB_ENABLE_HF_TRANSFER=0 SAGE_ALLOW_UNPINNED=1
{
  echo "== nvidia-smi"; nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
  echo "== doctor (unsloth backend)"
} 2>&1 | tee "$LOG"
# The sage-unsloth console script may not exist without an install: call the module.
timeout 600 python3 -m sage_unsloth.doctor ${1:+"$1"} --backend unsloth --workdir "$OUT/work-unsloth" \
  --json "$OUT/doctor.json" 2>&1 | tee -a "$LOG"
rc_unsloth=${PIPESTATUS[0]}
echo "== self-test (trl backend)" | tee -a "$LOG"
timeout 400 python3 -m sage_unsloth.doctor.selftest "$OUT/work-trl" --backend trl --json "$OUT/selftest_trl.json" \
  2>&1 | tee -a "$LOG"
rc_trl=${PIPESTATUS[0]}
echo "gpu_doctor: unsloth doctor exit $rc_unsloth, trl self-test exit $rc_trl" | tee -a "$LOG"
[ "$rc_unsloth" -eq 0 ] && [ "$rc_trl" -eq 0 ]
