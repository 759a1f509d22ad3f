#!/usr/bin/env bash
# Every test file with GPU tests, on the GPU machine, in one call: the CUDA tests the CPU CI skips.
#
#   bash scripts/device/gpu_tests.sh OUT_DIR [SECONDS]     (repository root, on the GPU machine)
#
# Builds the extension (setup_env.sh), then runs each file of FILES (default: every file with GPU tests, the
# kernels' first) whole, CPU tests included, each under what is left of SECONDS (default 540), with skip reasons
# (-rs), so that a GPU test that skipped shows why. Writes OUT_DIR/logs/<file>.log and prints one summary line a
# file; OUT_DIR/gpu_tests.txt keeps those lines. TESTS_K narrows every file (a pytest -k expression).
set -u
OUT=${1:?usage: gpu_tests.sh OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${2:-540}"
mkdir -p "$OUT/logs"
source scripts/device/setup_env.sh "$OUT/logs" || exit 1
python3 -c "import torch, tscale._C as c; print(torch.__version__, torch.cuda.get_device_name(), 'cuda kernels', c.with_cuda)"
FILES=${FILES:-"test_attention_kernel test_head_loss test_fused_loss test_qkv_prep test_muon test_lowprec
  test_lowprec_delayed test_lowprec_gemm test_ops_bitpack test_block_region test_tscale_arch test_attention_cudnn
  test_attention_fa2 test_train"}
for name in $FILES; do
  [ "$(left)" -gt 5 ] || { echo "$name: not run, no time left" | tee -a "$OUT/gpu_tests.txt"; continue; }
  TSCALE_SKIP_EMU=1 timeout "$(left)" python3 -m pytest -q -rs -p no:cacheprovider "tests/$name.py" \
    ${TESTS_K:+-k "$TESTS_K"} > "$OUT/logs/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc, $(grep -E "passed|failed|error" "$OUT/logs/$name.log" | tail -1)" | tee -a "$OUT/gpu_tests.txt"
  grep -E "^(FAILED|ERROR)" "$OUT/logs/$name.log" | head -10
done
true
