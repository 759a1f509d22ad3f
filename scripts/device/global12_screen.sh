#!/usr/bin/env bash
# One global layer of 12, with windows of 128 or 64 tokens, in one call: the attention-cost target at T 4096
# measured inside the step, then whether those models still reach gpt2's loss as soon (a screen at T 1024).
#
#   TSCALE_COMMIT=... bash scripts/device/global12_screen.sh OUT_DIR [SECONDS]
#       (repository root, on the GPU machine; carry .whl and .devdata/data)
#
# Builds the package and tokenizes (step_bench_prelude.sh), then, until SECONDS (default 575) after the start:
# arch_profile.py over tscale_cudnn_w64_g12, tscale_cudnn_g12 and tscale_sdpa at T 4096, one round
# (OUT_DIR/arch_profile_g12_T4096.json: cuDNN's attention kernels with one global layer against causal SDPA in
# every layer), and issue3_gpu.sh's screen of model.window=64 + model.global_every=12 and model.global_every=12
# against gpt2's recorded run (OUT_DIR/screen.md, screen.json).
set -u -o pipefail
OUT=${1:?usage: global12_screen.sh OUT_DIR [SECONDS]}
source scripts/device/step_bench_prelude.sh "$OUT" "${2:-575}" || exit 1
timeout "$(left)" python3 scripts/bench/arch_profile.py "$tok" --archs tscale_cudnn_w64_g12 tscale_cudnn_g12 \
  tscale_sdpa --rounds 1 --seq-len 4096 --top 30 --out "$OUT/arch_profile_g12_T4096.json" \
  > "$OUT/logs/arch_profile.log" 2>&1
grep -E "^round|^==|attention in a training step|Error" "$OUT/logs/arch_profile.log"
ISSUE3_BUDGET_S=$(left) ISSUE3_DATA=.devdata/data OUT=$OUT \
  ISSUE3_SCREEN="w64g12=model.window=64 model.global_every=12;g12=model.global_every=12" \
  bash scripts/bench/issue3_gpu.sh screen 2>&1 | tail -25
true
