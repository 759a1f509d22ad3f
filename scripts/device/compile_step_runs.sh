#!/usr/bin/env bash
# Muon's compiled update (optim.compile_step) on one GPU, in one call: its CUDA test, the optimizer step alone,
# and the training rates it should lift.
#
#   bash scripts/device/compile_step_runs.sh OUT_DIR [SECONDS]     (repository root, on the GPU machine; carry .whl
#                                                                   and .devdata/hopper for the cuDNN presets)
#
# Builds the package (without tscale._C_cutlass), then: tests/test_muon.py -k compiled (the compiled update against
# the definition on the GPU, bf16 Newton-Schulz); scripts/bench/muon_profile.py --variants eager compiled_step
# (OUT_DIR/muon_profile.json: step time, kernels by kind, launches, the first update's difference); then
# scripts/bench/arch_speed.py on random GPT-2 ids at 4,096 and then 1,024 tokens a window, gpt2, tscale and
# tscale with train.attention = "cudnn" (their update compiled, the default on a GPU), each also with
# optim.compile_step = false (--also tscale_eager_step tscale_cudnn_eager_step), records merged into a copy of
# docs/bench/architecture.json in OUT_DIR. Everything stops SECONDS (default 570) after the start. Set
# TSCALE_COMMIT to this tree's commit.
set -u -o pipefail
OUT=${1:?usage: compile_step_runs.sh OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${2:-570}"
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$OUT/logs"
source scripts/device/setup_env.sh "$OUT/logs" || exit 1
timeout "$(left)" python3 -m pytest -q -rfE tests/test_muon.py -k compiled > "$OUT/logs/tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/logs/tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/logs/tests.log" | head
timeout "$(left)" python3 scripts/bench/muon_profile.py --variants eager compiled_step --out "$OUT/muon_profile.json" \
  2>&1 | tee "$OUT/logs/muon_profile.log" | grep -E "step|against"
source scripts/device/random_tokens.sh
random_tokens
cp docs/bench/architecture.json "$OUT/"
for seq in 4096 1024; do
  timeout "$(left)" python3 scripts/bench/arch_speed.py "$RANDOM_TOKENS" --modes default --attention cudnn \
    --also tscale_eager_step tscale_cudnn_eager_step --seq-len $seq --steps 20 --warmup 8 --out-dir "$OUT" 2>&1 \
    | tee "$OUT/logs/arch-speed-T$seq.log" | grep -E "tokens/s|tscale / gpt2|Error|error"
done
true
