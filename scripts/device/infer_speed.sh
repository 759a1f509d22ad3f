#!/usr/bin/env bash
# Generation speed per `--precision` mode of a 124M gpt2 checkpoint on this GPU, after a script that built the tree.
#
#   bash scripts/device/infer_speed.sh OUT_DIR [SECONDS]     (repository root, on the GPU machine, extension built)
#
# Makes the checkpoint from one training step on .devdata/small (carried: Shakespeare and the GPT-2 BPE; speed does
# not depend on the weights' values), then
# runs scripts/bench/infer_speed.py on it (OUT_DIR/lowprec.json, OUT_DIR/infer_speed.log), then
# scripts/bench/weight_only_forms.py at 1 and 64 rows (the weight-only int8 product's forms at the model's shapes).
set -u
OUT=${1:?usage: infer_speed.sh OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${2:-240}"
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
tokens=/tmp/gen-tokens
[ -f $tokens/manifest.json ] || timeout "$(left)" python3 -m tscale tokenize .devdata/small/shakespeare.jsonl.xz \
  --tokenizer .devdata/small/gpt2-bpe -o $tokens --quiet > "$OUT/tokenize.log" 2>&1 || { tail -3 "$OUT/tokenize.log"; exit 1; }
rm -rf /tmp/gen-124m
timeout "$(left)" python3 -m tscale train configs/gpt2-124m.toml --tokens $tokens -o /tmp/gen-124m \
  --set train.steps=1 --set train.batch_size=1 --set train.compile=false --set train.eval_batches=1 \
  > "$OUT/train.log" 2>&1 || { tail -5 "$OUT/train.log"; exit 1; }
timeout "$(left)" python3 scripts/bench/infer_speed.py /tmp/gen-124m --label "${LABEL:-gpu_124m}" --out-dir "$OUT" \
  2>&1 | tee "$OUT/infer_speed.log" | tail -7
for rows in 1 64; do
  timeout "$(left)" python3 scripts/bench/weight_only_forms.py --tokens $rows --label "${LABEL:-gpu}_rows$rows" \
    --out-dir "$OUT" 2>&1 | grep -v "^->" | sed "s/^/rows $rows: /"
done
