#!/usr/bin/env bash
# The fused attention-input kernel (train.qkv_kernel) on one GPU, in one call: its GPU tests, its time alone against
# the model's compiled path, and the training rates it should lift.
#
#   TSCALE_COMMIT=... bash scripts/device/qkv_runs.sh OUT_DIR [SECONDS]
#       (repository root, on a Hopper GPU machine; carry .whl, .devdata/hopper and .devdata/sub, which becomes
#        .devdata/data here when that is absent)
#
# Builds the package and tokenizes mix + code slice (step_bench_prelude.sh), then, until SECONDS (default 570) after
# the start: tests/test_qkv_prep.py (its CUDA cases against the reference twin and under torch.compile, and the
# model with the kernel against its own path), scripts/bench/qkv_prep_speed.py (OUT_DIR/qkv_prep.json), and the
# prelude's cudnn_rates with tscale_qkv and tscale_cudnn_qkv at 4,096 and then 1,024 tokens a window
# (OUT_DIR/T4096/architecture.json, OUT_DIR/architecture.json).
set -u -o pipefail
OUT=${1:?usage: qkv_runs.sh OUT_DIR [SECONDS]}
[ -d .devdata/data ] || cp -r .devdata/sub .devdata/data
source scripts/device/step_bench_prelude.sh "$OUT" "${2:-570}" || exit 1
timeout "$(left)" python3 -m pytest -q -rfE tests/test_qkv_prep.py > "$OUT/logs/tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/logs/tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/logs/tests.log" | head
timeout "$(left)" python3 scripts/bench/qkv_prep_speed.py --out-dir "$OUT" 2>&1 | tee "$OUT/logs/qkv_prep_speed.log" \
  | grep -E "forward|speedup|Error|error"
for T in 4096 1024; do cudnn_rates $T tscale_qkv tscale_cudnn_qkv; done
true
