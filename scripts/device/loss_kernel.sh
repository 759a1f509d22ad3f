#!/usr/bin/env bash
# The head's loss kernel on one GPU: its CUDA tests, its speed alone, and the 124M training rates with it.
#
#   bash scripts/device/loss_kernel.sh OUT_DIR [SECONDS] [PART]     (repository root, on the GPU machine)
#
# Builds the package (without tscale._C_cutlass), then
#   all    (the default) the CUDA tests of tests/test_head_loss.py and tests/test_fused_loss.py, then
#          scripts/bench/head_loss_speed.py (record OUT_DIR/head_loss.json), then tokenizes the mix
#          (.devdata/data/mix.jsonl.xz, GPT-2 BPE) and runs scripts/bench/arch_speed.py --logits-loss in
#          default compile mode: gpt2 and tscale, each with train.loss_kernel off (the logits path) and on
#   rates  arch_speed.py --logits-loss at 1,024 tokens a window, then at 4,096 (--seq-len 4096) gpt2, tscale and
#          tscale with train.attention = cudnn_global (carry .devdata/hopper for the cuDNN frontend)
# Records merge into a copy of docs/bench/architecture.json in OUT_DIR. Everything stops SECONDS
# (default 570) after the start.
set -u -o pipefail
OUT=${1:?usage: loss_kernel.sh OUT_DIR [SECONDS] [PART]}
source scripts/device/deadline.sh "${2:-570}"
PART=${3:-all}
case $PART in all|rates) ;; *) echo "loss_kernel.sh: unknown part '$PART' (all or rates)"; exit 2 ;; esac
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$OUT/logs"
source scripts/device/setup_env.sh "$OUT/logs" || exit 1
if [ "$PART" = all ]; then
  timeout "$(left)" python3 -m pytest -q -p no:logging tests/test_head_loss.py tests/test_fused_loss.py -k cuda 2>&1 \
    | tee "$OUT/logs/tests.log" | tail -15
  timeout "$(left)" python3 scripts/bench/head_loss_speed.py --out-dir "$OUT" 2>&1 \
    | tee "$OUT/logs/head_loss_speed.log" | grep -vE "^\s*$" | tail -12
fi
tok=.cache/arch-long/tokens
[ -f $tok/manifest.json ] || timeout "$(left)" python3 -m tscale tokenize .devdata/data/mix.jsonl.xz \
  --tokenizer .devdata/data/gpt2-bpe -o $tok --quiet || exit 1
cp docs/bench/architecture.json "$OUT/"
timeout "$(left)" python3 scripts/bench/arch_speed.py $tok --modes default --logits-loss --steps 20 --warmup 8 \
  --out-dir "$OUT" 2>&1 | tee "$OUT/logs/arch-speed-logits-loss.log" | grep -E "tokens/s|tscale / gpt2|Error|error"
if [ "$PART" = rates ]; then
  timeout "$(left)" python3 scripts/bench/arch_speed.py $tok --modes default --attention cudnn_global --steps 20 \
    --warmup 8 --seq-len 4096 --out-dir "$OUT" 2>&1 | tee "$OUT/logs/arch-speed-T4096.log" \
    | grep -E "tokens/s|tscale / gpt2|Error|error"
fi
