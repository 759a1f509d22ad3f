#!/usr/bin/env bash
# Index drafting at generation on the GPU machine: scripts/bench/draft_speed.py with the model on CUDA.
#
#   bash scripts/device/draft_gpu.sh OUT_DIR [draft_speed.py options...]     (repository root)
#
# Needs .devdata/draft/: ckpt/ (a checkpoint of the model to run, its tokenizer.json inside) and
# code-slice.jsonl.xz. Builds the extension without CUDA code (the index lookups run on the CPU; the
# model needs no tscale CUDA kernel), tokenizes the slice with the checkpoint's tokenizer, indexes its
# training split and times greedy generation with and without drafts (OUT_DIR/infer_draft.json).
set -eu -o pipefail
OUT=${1:?usage: draft_gpu.sh OUT_DIR [options]}
shift
export PYTHONUNBUFFERED=1 TSCALE_NO_CUDA=1
mkdir -p "$OUT"
W=.cache/draft-gpu
mkdir -p $W
source scripts/device/setup_env.sh $W/logs
[ -f $W/code/manifest.json ] || python3 -m tscale tokenize .devdata/draft/code-slice.jsonl.xz \
  --tokenizer .devdata/draft/ckpt/tokenizer.json -o $W/code -q
[ -f $W/index/manifest.json ] || python3 -m tscale build-index $W/code -o $W/index -q
python3 scripts/bench/draft_speed.py .devdata/draft/ckpt $W/code $W/index --device cuda --out "$OUT" "$@"
