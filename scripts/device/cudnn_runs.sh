#!/usr/bin/env bash
# cuDNN's attention in the tscale step: its kernel time against causal SDPA, the run-count bucket A/B, and training rates.
#
#   bash scripts/device/cudnn_runs.sh OUT_DIR [SECONDS]     (repository root, on a Hopper GPU machine)
#
# Carry .whl, .devdata/hopper (the cuDNN frontend wheel) and the corpus: .devdata/data and .devdata/hopper together
# exceed a call's 64 MiB, so carry .devdata/sub (scripts/device/prepare_hopper.sh makes both) and run
# `mkdir -p .devdata/data && cp -r .devdata/sub/* .devdata/data/` first. Builds the package, tokenizes mix + code slice unless .cache/issue3/tokens holds them,
# then: the CUDA tests of both paths over document runs (tests/test_attention_cudnn.py, tests/test_attention_fa2.py;
# their summary line in OUT_DIR/logs/tests.log: the frontend prints reference-leak warnings after it at exit),
# scripts/bench/arch_profile.py --archs tscale_sdpa tscale_cudnn_bucket64 tscale_cudnn at T 4096 and 1024
# (OUT_DIR/arch_profile_cudnn_T<T>.json: kernel time per step by group, the attention kernels of each preset),
# and scripts/bench/arch_speed.py --modes default --attention cudnn --also tscale_cudnn_bucket64 (gpt2, tscale
# and both cuDNN presets, the real loop; OUT_DIR/architecture.json). Everything stops SECONDS (default 570)
# after the start. Set TSCALE_COMMIT to this tree's commit.
set -u -o pipefail
OUT=${1:?usage: cudnn_runs.sh OUT_DIR [SECONDS]}
source scripts/device/step_bench_prelude.sh "$OUT" "${2:-570}" || exit 1
timeout "$(left)" python3 -m pytest -q -k cuda tests/test_attention_cudnn.py tests/test_attention_fa2.py \
  > "$OUT/logs/tests.log" 2>&1
echo "tests: $(grep -E '[0-9]+ (passed|failed)' "$OUT/logs/tests.log" | tail -1)"
for T in 4096 1024; do
  timeout "$(left)" python3 scripts/bench/arch_profile.py $tok --archs tscale_sdpa tscale_cudnn_bucket64 tscale_cudnn \
    --seq-len $T --top 40 --out "$OUT/arch_profile_cudnn_T$T.json" > "$OUT/logs/arch_profile_cudnn_T$T.log" 2>&1
  echo "T $T: exit $?"; grep -E "^== |Error" "$OUT/logs/arch_profile_cudnn_T$T.log"
done
timeout "$(left)" python3 scripts/bench/arch_speed.py $tok --modes default --attention cudnn --also tscale_cudnn_bucket64 \
  --steps 20 --warmup 15 --out-dir "$OUT" 2>&1 | grep -vi warn | tail -8
