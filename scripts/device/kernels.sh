#!/usr/bin/env bash
# One GPU session for the kernels: build, CUDA kernel tests against their references, kernel benchmarks.
#
#   bash scripts/device/kernels.sh OUT_DIR      (from the repository root, on the GPU machine)
#
# Writes OUT_DIR/{build,tests,*_bench}.log and copies the docs/bench/*.json the benchmarks write.
set -u
OUT=${1:?usage: kernels.sh OUT_DIR}
source scripts/device/setup_env.sh "$OUT" || exit 1
TSCALE_SKIP_EMU=1 python3 -m pytest -q -rfE --maxfail=30 tests/test_attention_kernel.py tests/test_ops_bitpack.py \
  tests/test_lowprec.py tests/test_tscale_arch.py $(ls tests/test_lowprec_gemm.py 2>/dev/null) > "$OUT/tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
for bench in ${BENCHES:-attention_kernel lowprec_gemm}; do
  t0=$(date +%s)
  timeout ${BENCH_TIMEOUT:-240} python3 "scripts/bench/$bench.py" > "$OUT/${bench}_bench.log" 2>&1
  echo "$bench: exit $? in $(( $(date +%s) - t0 )) s"; tail -25 "$OUT/${bench}_bench.log"
done
cp docs/bench/*.json "$OUT/" 2>/dev/null
true
