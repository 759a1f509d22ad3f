#!/usr/bin/env bash
# Issue 4's end-to-end runs in one GPU session: training speed alone on one GPU, the quality runs beside it.
#
#   bash scripts/device/lowprec_runs.sh TOKENS OUT_DIR [SECONDS]    (repository root, extension built)
#
# With two GPUs: GPU 0 runs `lowprec_train.py speed` for SPEED_RECIPES (default: bf16 and the two
# headline recipes), then the bf16 quality run; GPU 1 runs the quality runs of QUALITY_RECIPES
# (default: the fp8 and int8 headline ones) side by side (their wall time is not a measurement).
# With one GPU everything runs on it, speed first and alone. Every job stops SECONDS (default 540)
# after the start; the quality runs resume from their last checkpoint when the script is called
# again on the same machine. Then, if every quality run has finished, one `quality` call merges
# the differences. COMPILE_MODE (default "default") is the speed runs' train.compile_mode, e.g.
# reduce-overhead (CUDA graphs); SPEED_SIZES (default "124m 1p5b") their sizes.
set -u
TOK=${1:?usage: lowprec_runs.sh TOKENS OUT_DIR [SECONDS]}
OUT=${2:?usage: lowprec_runs.sh TOKENS OUT_DIR [SECONDS]}
LIMIT=${3:-540}
SPEED_RECIPES=${SPEED_RECIPES:-bf16 fp8_tensorwise int8_rowwise}   # names of lowprec_train.py RECIPES
QUALITY_RECIPES=${QUALITY_RECIPES:-fp8_tensorwise int8_rowwise}    # besides bf16, which runs on GPU 0
COMPILE_MODE=${COMPILE_MODE:-default}
SPEED_SIZES=${SPEED_SIZES:-124m 1p5b}
source scripts/device/deadline.sh "$LIMIT"
mkdir -p "$OUT"
bench="python3 scripts/bench/lowprec_train.py"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
speed_then_bf16() {
  timeout "$(left)" $bench speed --sizes $SPEED_SIZES --recipes $SPEED_RECIPES --compile-mode "$COMPILE_MODE" \
    > "$OUT/speed-$COMPILE_MODE.log" 2>&1
  echo "speed ($COMPILE_MODE): exit $?"; tail -8 "$OUT/speed-$COMPILE_MODE.log"
  timeout "$(left)" $bench quality "$TOK" --recipes bf16 > "$OUT/quality-bf16.log" 2>&1
  echo "quality bf16: exit $?"
}
low_precision_quality() {
  for recipe in $QUALITY_RECIPES; do
    ( timeout "$(left)" $bench quality "$TOK" --recipes $recipe > "$OUT/quality-$recipe.log" 2>&1
      echo "quality $recipe: exit $?" ) &
  done
  wait
}
if [ "$gpus" -gt 1 ]; then
  ( export CUDA_VISIBLE_DEVICES=0; speed_then_bf16 ) &
  ( export CUDA_VISIBLE_DEVICES=1; low_precision_quality ) &
  wait
else
  speed_then_bf16
  low_precision_quality
fi
if ls .cache/lowprec-quality/eval-bf16.json $(printf ".cache/lowprec-quality/eval-%s.json " $QUALITY_RECIPES) > /dev/null 2>&1; then
  $bench quality "$TOK" --recipes bf16 $QUALITY_RECIPES > "$OUT/quality.log" 2>&1; tail -12 "$OUT/quality.log"
fi
grep -h "tokens/s\|val loss" "$OUT"/*.log
cp docs/bench/lowprec.json .cache/lowprec-quality/log.txt "$OUT/" 2>/dev/null
true
