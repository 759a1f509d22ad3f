#!/usr/bin/env bash
# Training tokens/s of tscale against gpt2 at 124M on windows of 4,096 tokens, in one device call.
#
#   bash scripts/device/arch_long.sh OUT_DIR [SECONDS] [SEQ_LEN]     (repository root, on the GPU machine)
#
# Builds the package, tokenizes the mix (.devdata/data/mix.jsonl.xz, GPT-2 BPE) unless .cache/arch-long
# holds it, then runs scripts/bench/arch_speed.py --seq-len SEQ_LEN (default 4096) in default compile mode:
# gpt2, tscale and tscale with train.attention = cudnn_global and fa2, 32,768 tokens a step for each.
# The record goes to OUT_DIR/architecture.json (merged into a copy of docs/bench/architecture.json).
# Everything stops SECONDS (default 560) after the start.
set -u -o pipefail
OUT=${1:?usage: arch_long.sh OUT_DIR [SECONDS] [SEQ_LEN]}
source scripts/device/deadline.sh "${2:-560}"
SEQ=${3:-4096}
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$OUT/logs"
source scripts/device/setup_env.sh "$OUT/logs" || exit 1
tok=.cache/arch-long/tokens
[ -f $tok/manifest.json ] || timeout "$(left)" python3 -m tscale tokenize .devdata/data/mix.jsonl.xz \
  --tokenizer .devdata/data/gpt2-bpe -o $tok --quiet || exit 1
cp docs/bench/architecture.json "$OUT/"
timeout "$(left)" python3 scripts/bench/arch_speed.py $tok --modes default --seq-len "$SEQ" --steps 20 --warmup 8 \
  --attention cudnn_global fa2 --out-dir "$OUT" 2>&1 | tee "$OUT/logs/arch-speed-T$SEQ.log" \
  | grep -E "tokens/s|tscale / gpt2|Error|error"
