#!/usr/bin/env bash
# One global layer of 12, with windows of 128 or 64 tokens, in one call: the attention-cost target at T 4096
# measured inside the step, then whether those models still reach gpt2's loss as soon (a screen at T 1024).
#
#   TSCALE_COMMIT=... [ROUNDS=N] bash scripts/device/global12_screen.sh OUT_DIR [SECONDS]
#       (repository root, on the GPU machine; carry .whl, and .devdata/hopper + .devdata/sub for the profile,
#        .devdata/data for the screen: all three exceed one call's 64 MiB)
#
# Builds the package and tokenizes (step_bench_prelude.sh), then, until SECONDS (default 575) after the start:
#   with the cuDNN frontend carried (.devdata/hopper): arch_profile.py over tscale_cudnn_w64_g12, tscale_cudnn_g12
#   and tscale_sdpa at T 4096, ROUNDS rounds (default 1) (OUT_DIR/arch_profile_g12_T4096.json: cuDNN's attention
#   kernels with one global layer against causal SDPA in every layer);
#   with the whole corpus carried (.devdata/data, not .devdata/sub): issue3_gpu.sh's screen of model.window=64 +
#   model.global_every=12 and model.global_every=12 against gpt2's recorded run (OUT_DIR/screen.md, screen.json).
set -u -o pipefail
OUT=${1:?usage: global12_screen.sh OUT_DIR [SECONDS]}
whole_corpus=0
if [ -d .devdata/data ]; then whole_corpus=1; else cp -r .devdata/sub .devdata/data; fi
source scripts/device/step_bench_prelude.sh "$OUT" "${2:-575}" || exit 1
if compgen -G ".devdata/hopper/*.whl" > /dev/null; then
  timeout "$(left)" python3 scripts/bench/arch_profile.py "$tok" --archs tscale_cudnn_w64_g12 tscale_cudnn_g12 \
    tscale_sdpa --rounds "${ROUNDS:-1}" --seq-len 4096 --top 30 --out "$OUT/arch_profile_g12_T4096.json" \
    > "$OUT/logs/arch_profile.log" 2>&1
  grep -E "^round|^==|attention in a training step|Error" "$OUT/logs/arch_profile.log"
else
  echo "global12_screen.sh: no .devdata/hopper (the cuDNN frontend); the profile is skipped"
fi
[ $whole_corpus = 1 ] || { echo "global12_screen.sh: .devdata/sub only; the screen needs .devdata/data"; exit 0; }
ISSUE3_BUDGET_S=$(left) ISSUE3_DATA=.devdata/data OUT=$OUT \
  ISSUE3_SCREEN="w64g12=model.window=64 model.global_every=12;g12=model.global_every=12" \
  bash scripts/bench/issue3_gpu.sh screen 2>&1 | tail -25
true
