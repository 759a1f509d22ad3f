#!/usr/bin/env bash
# The training rates withdrawn for the loop's clock fault (fixed in da14ce3), measured again on a two-GPU host.
#
#   bash scripts/device/remeasure_rates.sh PART TOKENS OUT_DIR [SECONDS]    (repository root, extension built)
#
# Each part fits one device call; both GPUs work side by side, each job pinned to its half of the
# CPU cores so that neither slows the other's host work. A ratio always comes from one process on
# one GPU (bf16 runs on both GPUs, each beside the recipe it is compared with).
#   1.5b   GPU 0: 1.5B bf16 vs int8_rowwise, then int8 with its backward in int8;
#          GPU 1: 1.5B bf16 vs fp8_tensorwise, then with fast accumulation and quantised in-graph
#          (CUDA graphs; each record is merged after every recipe, so a time limit loses only the last)
#   124m   GPU 0: 124M bf16, fp8_tensorwise, int8_rowwise under CUDA graphs, then in default mode;
#          GPU 1: arch_speed.py gpt2 vs tscale (both modes, with fa2), lowprec_graph_check.py, then
#          arch_profile.py (kernel time per step, the optimizer step alone)
# TOKENS: a GPT-2 BPE token folder of real text (arch_speed.py needs its document boundaries).
# Every job stops SECONDS (default 570) after the start; records go to OUT_DIR/<job>/.
set -u
PART=${1:?usage: remeasure_rates.sh PART TOKENS OUT_DIR [SECONDS]}
TOK=${2:?usage: remeasure_rates.sh PART TOKENS OUT_DIR [SECONDS]}
OUT=${3:?usage: remeasure_rates.sh PART TOKENS OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${4:-570}"
mkdir -p "$OUT"
source scripts/device/cpu_halves.sh  # PIN0, PIN1
speed="python3 scripts/bench/lowprec_train.py speed"
run() {  # run GPU NAME COMMAND...: one job on one GPU, its log in OUT/NAME.log, its rates echoed
  local gpu=$1 name=$2; shift 2
  local pin=("${PIN0[@]}"); [ "$gpu" = 0 ] || pin=("${PIN1[@]}")
  CUDA_VISIBLE_DEVICES=$gpu timeout "$(left)" "${pin[@]}" "$@" --out-dir "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?"; grep -hE "tokens/s|gradients|NOT RECORDED|Error" "$OUT/$name.log"
}
case $PART in
  1.5b)
    run 0 int8-1p5b $speed --sizes 1p5b --recipes bf16 int8_rowwise int8_rowwise_bwd --compile-mode reduce-overhead &
    run 1 fp8-1p5b $speed --sizes 1p5b --recipes bf16 fp8_tensorwise fp8_tensorwise_fastacc \
      fp8_tensorwise_graph --compile-mode reduce-overhead &
    wait ;;
  124m)
    ( run 0 lowprec-124m-graphs $speed --sizes 124m --recipes bf16 fp8_tensorwise int8_rowwise \
        --compile-mode reduce-overhead
      run 0 lowprec-124m-default $speed --sizes 124m --recipes bf16 fp8_tensorwise int8_rowwise ) &
    ( run 1 arch-speed python3 scripts/bench/arch_speed.py "$TOK" --fa2
      CUDA_VISIBLE_DEVICES=1 timeout "$(left)" "${PIN1[@]}" python3 scripts/bench/lowprec_graph_check.py \
        > "$OUT/graph-check.log" 2>&1
      echo "graph check: exit $?"; grep -h "gradients" "$OUT/graph-check.log"
      CUDA_VISIBLE_DEVICES=1 timeout "$(left)" "${PIN1[@]}" python3 scripts/bench/arch_profile.py "$TOK" \
        --out "$OUT/arch_profile.json" > "$OUT/arch-profile.log" 2>&1
      echo "arch profile: exit $?"; grep -h "^==" "$OUT/arch-profile.log" ) &
    wait ;;
  *) echo "remeasure_rates.sh: unknown part '$PART' (1.5b or 124m)"; exit 2 ;;
esac
