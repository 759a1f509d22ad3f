#!/usr/bin/env bash
# End-to-end run of the pipeline: tokenize -> train -> eval -> infer, on any corpus.
#
#   scripts/e2e.sh CORPUS [CONFIG] [WORK_DIR] [extra `tscale train` options...]
#
# CORPUS is anything `tscale tokenize` reads; TOKENIZER (env) is a tokenizer.json or a
# GPT-2 encoder.json + vocab.bpe folder, else a BPE of VOCAB_SIZE (env, default 8192) is
# trained. CONFIG defaults to configs/tiny-cpu.toml; WORK_DIR to .cache/e2e. The token
# folder is reused when it exists; each run gets a new run folder.
set -euo pipefail
corpus=${1:?usage: scripts/e2e.sh CORPUS [CONFIG] [WORK_DIR] [train options...]}
config=${2:-configs/tiny-cpu.toml}
work=${3:-.cache/e2e}
shift $(( $# < 3 ? $# : 3 ))
tokens=$work/tokens
run=$work/run-$(date +%Y%m%d-%H%M%S)

if [ ! -f "$tokens/manifest.json" ]; then
  if [ -n "${TOKENIZER:-}" ]; then
    tscale tokenize "$corpus" --tokenizer "$TOKENIZER" -o "$tokens"
  else
    tscale tokenize "$corpus" --vocab-size "${VOCAB_SIZE:-8192}" -o "$tokens"
  fi
fi
tscale train "$config" --tokens "$tokens" -o "$run" "$@"
tscale eval "$run" --tokens "$tokens" --plot "$run/loss.png"
tscale infer "$run" --prompt "${PROMPT:-The}" --max-new-tokens 120 --temperature 0.8 --top-k 50 --seed 1
echo "run folder: $run"
