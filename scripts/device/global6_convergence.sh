#!/usr/bin/env bash
# gpt2 against tscale with two global layers of 12 (model.global_every = 6) over cuDNN's attention at T 4096, on the
# whole benchmark corpus in one call: convergence and training throughput (issue3_gpu.sh part 1).
#
#   TSCALE_COMMIT=... bash scripts/device/global6_convergence.sh OUT_DIR [SECONDS]
#       (repository root, on a Hopper GPU machine; carry .devdata/data and .devdata/min, which
#        scripts/device/prepare_hopper.sh makes: .whl's wheels and a slimmer cuDNN frontend, to fit the 64 MiB)
#
# Installs the wheels of .devdata/min, builds the package without CUTLASS, checks cuDNN's attention against its
# reference (tests/test_attention_cudnn.py's CUDA test, OUT_DIR/logs/cudnn_tests.log); then part 1 at 4,096 tokens
# a window with ISSUE3_TSCALE_SET='model.global_every=6 train.attention="cudnn"' (without the attention setting
# when that check failed) until SECONDS (default 590) after the start. Records: OUT_DIR (issue3-part1.log,
# the report and the runs' metrics), never docs/bench.
set -u -o pipefail
OUT=${1:?usage: global6_convergence.sh OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${2:-590}"
mkdir -p "$OUT/logs" .whl
cp .devdata/min/*.whl .whl/
export PYTHONUNBUFFERED=1
TSCALE_NO_CUTLASS=1 source scripts/device/setup_env.sh "$OUT/logs" || exit 1
settings="model.global_every=6"
if timeout 120 python3 -m pytest -q -x -k cuda_cudnn_matches tests/test_attention_cudnn.py \
    > "$OUT/logs/cudnn_tests.log" 2>&1; then
  settings="$settings train.attention=\"cudnn\""
fi
echo "cuDNN check: $(grep -E '[0-9]+ (passed|failed)' "$OUT/logs/cudnn_tests.log" | tail -1); tscale settings: $settings"
OUT=$OUT ISSUE3_DATA=.devdata/data ISSUE3_SEQ_LEN=4096 ISSUE3_TSCALE_SET="$settings" \
  ISSUE3_BUDGET_S=$(left) bash scripts/bench/issue3_gpu.sh 1
