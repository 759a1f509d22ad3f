#!/usr/bin/env bash
# The start of a device script that times training steps on the benchmark corpus: a deadline, the build, the tokens.
#
#   source scripts/device/step_bench_prelude.sh OUT_DIR SECONDS     (repository root, on the GPU machine)
#
# Defines left() (seconds until SECONDS after now, at least 1), tok (.cache/issue3/tokens) and cudnn_rates (below), exports
# PYTHONUNBUFFERED and TSCALE_NO_CUTLASS (these scripts need no int8 products), builds the package with
# setup_env.sh (logs in OUT_DIR/logs), and tokenizes mix + code slice from .devdata/data with the GPT-2 BPE
# unless $tok holds them. Returns 1 when the build or the tokenization fails.
source scripts/device/deadline.sh "${2:?usage: source step_bench_prelude.sh OUT_DIR SECONDS}"
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$1/logs"
source scripts/device/setup_env.sh "$1/logs" || return 1
tok=.cache/issue3/tokens
[ -f $tok/manifest.json ] || timeout "$(left)" python3 -m tscale tokenize .devdata/data/mix.jsonl.xz \
  .devdata/data/code-slice.jsonl.xz --tokenizer .devdata/data/gpt2-bpe -o $tok --quiet || return 1

# cudnn_rates T [PRESET ...]: arch_speed.py --attention cudnn (and --also PRESET ...) on $tok with windows of T tokens,
# 20 timed steps after 10, merged into a copy of docs/bench/architecture.json in OUT_DIR (T 1024) or OUT_DIR/T4096
# (any other T: OUT_DIR/T<T>); log OUT_DIR/logs/arch_speed_T<T>.log, its rates printed.
bench_out=$1
cudnn_rates() {
  local T=$1 dir=$bench_out also=()
  [ "$T" != 1024 ] && dir=$bench_out/T$T
  [ $# -gt 1 ] && also=(--also "${@:2}")
  mkdir -p "$dir" && cp docs/bench/architecture.json "$dir/"
  timeout "$(left)" python3 scripts/bench/arch_speed.py $tok --modes default --attention cudnn "${also[@]}" \
    --seq-len "$T" --steps 20 --warmup 10 --out-dir "$dir" 2>&1 | tee "$bench_out/logs/arch_speed_T$T.log" \
    | grep -E "tokens/s|tscale / gpt2|Error|error"
}
