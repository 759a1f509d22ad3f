#!/usr/bin/env bash
# The start of a device script that times training steps on the benchmark corpus: a deadline, the build, the tokens.
#
#   source scripts/device/step_bench_prelude.sh OUT_DIR SECONDS     (repository root, on the GPU machine)
#
# Defines left() (seconds until SECONDS after now, at least 1) and tok (.cache/issue3/tokens), exports
# PYTHONUNBUFFERED and TSCALE_NO_CUTLASS (these scripts need no int8 products), builds the package with
# setup_env.sh (logs in OUT_DIR/logs), and tokenizes mix + code slice from .devdata/data with the GPT-2 BPE
# unless $tok holds them. Returns 1 when the build or the tokenization fails.
deadline=$(( $(date +%s) + ${2:?usage: source step_bench_prelude.sh OUT_DIR SECONDS} ))
left() { echo $(( deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1 )); }
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$1/logs"
source scripts/device/setup_env.sh "$1/logs" || return 1
tok=.cache/issue3/tokens
[ -f $tok/manifest.json ] || timeout "$(left)" python3 -m tscale tokenize .devdata/data/mix.jsonl.xz \
  .devdata/data/code-slice.jsonl.xz --tokenizer .devdata/data/gpt2-bpe -o $tok --quiet || return 1
