#!/usr/bin/env bash
# fp8_tensorwise with delayed scaling on one GPU: its CUDA tests, the quantize kernels, training rates, quality.
#
#   bash scripts/device/delayed_runs.sh PART OUT_DIR [SECONDS]     (repository root, on the GPU machine)
#
#   check    build (without CUTLASS: the fp8 products take cuBLASLt), the CUDA tests of delayed scaling and
#            of the fp8 layers, quantize_delayed_speed.py (dynamic against delayed at the 1.5B shapes)
#   speed    build, then lowprec_train.py speed at 1.5B under CUDA graphs: fp8_tensorwise_delayed and
#            fp8_tensorwise in one process (RECIPES overrides the list). A recipe takes 170-210 s on an H200
#            with its compile, so three (with bf16) do not fit the 600 s of a call beside the build: at
#            c968758 the third was cut off
#   quality  tokenize mix + code slice (.devdata/data) and train gpt2 124M on 100M tokens with
#            fp8_tensorwise_delayed, then `tscale eval` of it (bf16 runs in another call: `--recipes bf16`
#            through lowprec_train.py quality)
# Every step stops SECONDS (default 570) after the start.
set -u -o pipefail
PART=${1:?usage: delayed_runs.sh PART OUT_DIR [SECONDS]}
OUT=${2:?usage: delayed_runs.sh PART OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${3:-570}"
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$OUT/logs"
source scripts/device/setup_env.sh "$OUT/logs" || exit 1
case $PART in
  check)
    timeout "$(left)" python3 -m pytest -q -p no:cacheprovider tests/test_lowprec_delayed.py \
      tests/test_lowprec.py -k "cuda and (quantize or function_matches or layer)" 2>&1 | tee "$OUT/logs/tests.log" | tail -5
    timeout "$(left)" python3 scripts/bench/quantize_delayed_speed.py --out "$OUT/bench" 2>&1 \
      | tee "$OUT/logs/quantize.log" ;;
  speed)
    timeout "$(left)" python3 scripts/bench/lowprec_train.py speed --sizes 1p5b --compile-mode reduce-overhead \
      --recipes ${RECIPES:-fp8_tensorwise_delayed fp8_tensorwise} --out-dir "$OUT/speed" 2>&1 | tee "$OUT/logs/speed.log" \
      | grep -E "tokens/s|NOT RECORDED|Error" ;;
  quality)
    tok=.cache/lowprec-tokens
    [ -f $tok/manifest.json ] || timeout "$(left)" python3 -m tscale tokenize .devdata/data/mix.jsonl.xz \
      .devdata/data/code-slice.jsonl.xz --tokenizer .devdata/data/gpt2-bpe -o $tok --quiet
    timeout "$(left)" python3 scripts/bench/lowprec_train.py quality $tok --recipes fp8_tensorwise_delayed \
      --work .cache/lowprec-quality --out-dir "$OUT/quality" 2>&1 | tee "$OUT/logs/quality.log" | grep -E "val loss|Error|failed"
    cp .cache/lowprec-quality/eval-*.json .cache/lowprec-quality/log.txt "$OUT/quality/" 2>/dev/null ;;
  *) echo "delayed_runs.sh: unknown part '$PART' (check, speed or quality)"; exit 2 ;;
esac
