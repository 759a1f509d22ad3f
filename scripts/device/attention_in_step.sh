#!/usr/bin/env bash
# The attention-cost target inside real training steps, at T 1024 and 4096, in one device call.
#
#   bash scripts/device/attention_in_step.sh OUT_DIR [SECONDS] [PRESET ...]     (repository root, on the GPU machine)
#
# Builds the package, tokenizes mix + code slice (.devdata/data, GPT-2 BPE) unless .cache/issue3/tokens holds
# them, then runs scripts/bench/arch_profile.py --archs tscale tscale_sdpa [PRESET ...] (e.g. tscale_fa2,
# tscale_cudnn: arch_speed.py's presets) at --seq-len 1024 and 4096, 32,768 tokens a step: the GPU time of
# every attention kernel in the tscale model's step against the same model with every layer causal SDPA
# (attention_in_step_ratio in OUT_DIR/arch_profile_T<T>.json). Everything stops SECONDS (default 560) after
# the start. Set TSCALE_COMMIT to this tree's commit: the GPU machine's copy of .git may be older.
set -u -o pipefail
OUT=${1:?usage: attention_in_step.sh OUT_DIR [SECONDS] [PRESET ...]}
source scripts/device/step_bench_prelude.sh "$OUT" "${2:-560}" || exit 1
for T in 1024 4096; do
  timeout "$(left)" python3 scripts/bench/arch_profile.py $tok --archs tscale tscale_sdpa "${@:3}" --seq-len $T \
    --top 12 --out "$OUT/arch_profile_T$T.json" > "$OUT/logs/arch_profile_T$T.log" 2>&1
  echo "T $T: exit $?"; grep -E "^== |^attention in a training step|Error" "$OUT/logs/arch_profile_T$T.log"
done
