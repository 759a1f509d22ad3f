#!/usr/bin/env bash
# The attention kernel's headline metrics in one device call: kernel_vs_flex_speedup and causal_vs_sdpa_time_ratio
# (attention_kernel.py), then the attention cost of a training step at T 1024 and 4096 (architecture.py attention,
# the tscale model's recorded calls against causal SDPA in every layer), with the op's default kernel choices.
#
#   bash scripts/device/attention_headline.sh OUT_DIR [SECONDS]     (repository root, on the GPU machine)
#
# Builds the package and tokenizes the benchmark corpus (step_bench_prelude.sh), runs attention_kernel.py
# (OUT_DIR/kernel/), then times the step's attention (OUT_DIR/attention_results.json, a copy of the work folder's
# results.json). Everything stops SECONDS (default 560) after the start; the key lines are printed. Set TSCALE_COMMIT.
set -u
OUT=${1:?usage: attention_headline.sh OUT_DIR [SECONDS]}
source scripts/device/step_bench_prelude.sh "$OUT" "${2:-560}" || exit 1
mkdir -p "$OUT/kernel"
timeout "$(left)" python3 scripts/bench/attention_kernel.py --out-dir "$OUT/kernel" > "$OUT/logs/attention_kernel.log" 2>&1
echo "attention_kernel: exit $?"
grep -E "^ *[0-9]+ +[0-9]+ +(causal|local)|speedup|ratio" "$OUT/logs/attention_kernel.log"
work=$(dirname "$tok")  # architecture.py reads WORK/tokens
export TORCHINDUCTOR_CACHE_DIR=$PWD/$work/inductor
timeout "$(left)" python3 scripts/bench/architecture.py attention --work "$work" --deadline "$deadline" \
  > "$OUT/logs/attention.log" 2>&1
echo "attention cost: exit $?"
grep -E "^attention T=|Error" "$OUT/logs/attention.log"
cp "$work/results.json" "$OUT/attention_results.json" 2>/dev/null
true
