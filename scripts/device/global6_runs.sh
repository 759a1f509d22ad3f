#!/usr/bin/env bash
# Two global layers of 12 (model.global_every = 6) against three at T 4096 on one GPU, in one call: the training rates
# and the attention-cost target measured inside the step.
#
#   TSCALE_COMMIT=... bash scripts/device/global6_runs.sh OUT_DIR [SECONDS]
#       (repository root, on a Hopper GPU machine; carry .whl, .devdata/hopper and .devdata/sub, which becomes
#        .devdata/data here when that is absent)
#
# Builds the package and tokenizes (step_bench_prelude.sh), then, until SECONDS (default 570) after the start: the
# prelude's cudnn_rates at 4,096 tokens a window with tscale_g6 and tscale_cudnn_g6 as well
# (OUT_DIR/T4096/architecture.json), and arch_profile.py over tscale_cudnn_g6 and tscale_sdpa at T 4096, two rounds
# in alternating order: attention_in_step_ratio_cudnn_g6, cuDNN's attention kernels with two global layers against
# causal SDPA in every layer (OUT_DIR/arch_profile_g6_T4096.json; tscale_cudnn's own ratio is recorded in
# docs/bench/architecture.json).
set -u -o pipefail
OUT=${1:?usage: global6_runs.sh OUT_DIR [SECONDS]}
[ -d .devdata/data ] || cp -r .devdata/sub .devdata/data
source scripts/device/step_bench_prelude.sh "$OUT" "${2:-570}" || exit 1
cudnn_rates 4096 tscale_g6 tscale_cudnn_g6
timeout "$(left)" python3 scripts/bench/arch_profile.py "$tok" --archs tscale_cudnn_g6 tscale_sdpa --rounds 2 \
  --seq-len 4096 --top 30 --out "$OUT/arch_profile_g6_T4096.json" > "$OUT/logs/arch_profile.log" 2>&1
grep -E "^round|^==|attention in a training step|Error" "$OUT/logs/arch_profile.log"
true
