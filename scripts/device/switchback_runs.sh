#!/usr/bin/env bash
# The switchback recipes on one GPU: their CUDA tests and training rates, then their quality at 124M.
#
#   bash scripts/device/switchback_runs.sh PART OUT_DIR [SECONDS]     (repository root, on the GPU machine)
#
#   speed    build (with CUTLASS when .whl/ holds its headers), the CUDA tests of the low-precision
#            layers, then lowprec_train.py speed at 1.5B under CUDA graphs: bf16, int8_switchback,
#            fp8_switchback, int8_rowwise in one process (each ratio against that process's bf16);
#            the built tscale._C_cutlass goes to OUT_DIR/so/ for the next call
#   quality  tokenize mix + code slice (.devdata/data) and train gpt2 124M on 100M tokens with
#            int8_switchback, then bf16 (same seed and windows), `tscale eval` of each
#   profile  kernel time per step by kind at 1.5B (lowprec_step_profile.py, compile default mode with
#            train.compile_block_once to keep compiles short): bf16, int8_switchback, fp8_tensorwise;
#            then the products at the step's own M = 8,192 and at qkv's input-gradient shape
#            (lowprec_gemm.py --tokens 8192 --input-grad-shapes, printed only; the mlp_up / mlp_down /
#            attn_out shapes are also the input-gradient shapes of mlp_down / mlp_up / attn_out)
#   profile_whole  the same step profile without train.compile_block_once (torch 2.11 cannot compile the
#            switchback recipes once per block): int8_switchback, bf16, fp8_switchback, every kernel kept in the JSON
#   host     lowprec_host_cost.py (host time per product call), then the 1.5B speed of int8_switchback and
#            bf16 in default compile mode (no CUDA graphs: where the op's host time shows)
#   accum    the 1.5B speed with 4 micro-batches per optimizer step (--grad-accum 4; default compile mode,
#            since CUDA graphs refuse gradient accumulation): bf16, int8_switchback, fp8_tensorwise
#   once     the CUDA tests of the switchback recipes and of train.compile_block_once, then the 1.5B
#            speed of bf16, int8_switchback and fp8_switchback with train.compile_block_once (CUDA
#            graphs): its compile time and its rates beside the whole-graph ones of the speed part
# A tscale._C_cutlass built by an earlier call (.devdata/so/) is used instead of building it again.
# Every step stops SECONDS (default 570) after the start.
set -u -o pipefail
PART=${1:?usage: switchback_runs.sh PART OUT_DIR [SECONDS]}
OUT=${2:?usage: switchback_runs.sh PART OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${3:-570}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
prebuilt=$(compgen -G ".devdata/so/_C_cutlass*.so" | head -1)
[ -n "$prebuilt" ] && export TSCALE_NO_CUTLASS=1
source scripts/device/setup_env.sh "$OUT/logs" || exit 1
if [ -n "$prebuilt" ]; then cp "$prebuilt" tscale/ && echo "tscale._C_cutlass from $prebuilt"; fi
mkdir -p "$OUT/so" && cp tscale/_C_cutlass*.so "$OUT/so/" 2>/dev/null
python3 -c "import torch, tscale.ops.lowprec as l; print('cutlass int8:', l._cutlass_kernels(), torch.__version__)"
case $PART in
  speed)
    timeout "$(left)" python3 -m pytest -q tests/test_lowprec.py -k "cuda and (switchback or function_matches or fast_products)" \
      2>&1 | tee "$OUT/logs/tests.log" | tail -5
    timeout "$(left)" python3 scripts/bench/lowprec_train.py speed --sizes 1p5b --compile-mode reduce-overhead \
      --recipes bf16 int8_switchback fp8_switchback int8_rowwise --out-dir "$OUT/speed" 2>&1 | tee "$OUT/logs/speed.log" \
      | grep -E "tokens/s|NOT RECORDED|Error" ;;
  quality)
    tok=.cache/lowprec-tokens
    [ -f $tok/manifest.json ] || timeout "$(left)" python3 -m tscale tokenize .devdata/data/mix.jsonl.xz \
      .devdata/data/code-slice.jsonl.xz --tokenizer .devdata/data/gpt2-bpe -o $tok --quiet
    timeout "$(left)" python3 scripts/bench/lowprec_train.py quality $tok --recipes int8_switchback bf16 \
      --work .cache/lowprec-quality --out-dir "$OUT/quality" 2>&1 | tee "$OUT/logs/quality.log" | grep -E "val loss|Error|failed"
    cp .cache/lowprec-quality/eval-*.json .cache/lowprec-quality/log.txt "$OUT/quality/" 2>/dev/null ;;
  profile)
    timeout "$(left)" python3 scripts/bench/lowprec_step_profile.py --size 1p5b --compile-block-once \
      --recipes bf16 int8_switchback fp8_tensorwise --out "$OUT/lowprec_step_profile.json" 2>&1 \
      | tee "$OUT/logs/profile.log" | grep -E "^==|Error"
    timeout "$(left)" python3 scripts/bench/lowprec_gemm.py --tokens 8192 --no-write --input-grad-shapes 2>&1 \
      | tee "$OUT/logs/gemm-8192.log" | grep -E "1p5b .* (bf16|int8_cutlass|fp8_lt) " ;;
  profile_whole)
    timeout "$(left)" python3 scripts/bench/lowprec_step_profile.py --size 1p5b --top 30 \
      --recipes int8_switchback bf16 fp8_switchback --out "$OUT/lowprec_step_profile_whole.json" 2>&1 \
      | tee "$OUT/logs/profile_whole.log" | grep -E "^==|^  |Error" ;;
  host)
    timeout "$(left)" python3 scripts/bench/lowprec_host_cost.py 2>&1 | tee "$OUT/logs/host_cost.log"
    timeout "$(left)" python3 scripts/bench/lowprec_train.py speed --sizes 1p5b --compile-mode default --steps 20 \
      --warmup 6 --recipes int8_switchback bf16 --out-dir "$OUT/speed" 2>&1 | tee "$OUT/logs/speed-default.log" \
      | grep -E "tokens/s|NOT RECORDED|Error" ;;
  accum)
    timeout "$(left)" python3 scripts/bench/lowprec_train.py speed --sizes 1p5b --compile-mode default \
      --grad-accum 4 --steps 10 --warmup 5 --recipes bf16 int8_switchback fp8_tensorwise --out-dir "$OUT/speed" 2>&1 \
      | tee "$OUT/logs/speed-accum.log" | grep -E "tokens/s|NOT RECORDED|Error" ;;
  once)
    timeout "$(left)" python3 -m pytest -q tests/test_lowprec.py tests/test_block_region.py \
      -k "cuda and (switchback or once or function_matches)" 2>&1 | tee "$OUT/logs/tests.log" | tail -5
    timeout "$(left)" python3 scripts/bench/lowprec_train.py speed --sizes 1p5b --compile-mode reduce-overhead \
      --compile-block-once --recipes bf16 int8_switchback fp8_switchback --out-dir "$OUT/speed" 2>&1 \
      | tee "$OUT/logs/speed-once.log" | grep -E "tokens/s|NOT RECORDED|Error" ;;
  *) echo "switchback_runs.sh: unknown part '$PART' (speed, quality, profile, profile_whole, host, accum or once)"; exit 2 ;;
esac
