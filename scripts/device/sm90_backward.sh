#!/usr/bin/env bash
# The Hopper attention backward on the GPU machine: build, its CUDA tests, then GPU time per kernel of a forward +
# backward call with the sm_90a main kernel and with the sm_80 one (attention_profile.py), cuDNN's beside.
#
#   bash scripts/device/sm90_backward.sh OUT_DIR [SECONDS]      (repository root, on the GPU machine)
#
# Writes OUT_DIR/{build,tests}.log and OUT_DIR/profile-bwd-{sm90,mma}.{json,log}, each step as it ends; SEQ
# overrides the lengths profiled (default "1024 4096"). With HEADLINE=1, then attention_kernel.py with each backward
# (the op's own forward choice): OUT_DIR/headline-{mma,sm90}/attention_kernel.json and .log.
set -u
OUT=${1:?usage: sm90_backward.sh OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${2:-570}"
source scripts/device/setup_env.sh "$OUT" || exit 1
TSCALE_SKIP_EMU=1 timeout "$(left)" python3 -m pytest -q -rfE --maxfail=5 -x tests/test_attention_kernel.py \
  -k "hopper_backward" > "$OUT/tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -5
for kernel in sm90 mma; do
  TSCALE_ATTENTION_BWD_KERNEL=$kernel timeout "$(left)" python3 scripts/bench/attention_profile.py --steps 5 --seq ${SEQ:-1024 4096} \
    --out "$OUT/profile-bwd-$kernel.json" > "$OUT/profile-bwd-$kernel.log" 2>&1
  echo "profile $kernel: exit $?"
  grep -E "^T|bwd" "$OUT/profile-bwd-$kernel.log"
done
if [ "${HEADLINE:-0}" = 1 ]; then
  for kernel in mma sm90; do
    mkdir -p "$OUT/headline-$kernel"
    TSCALE_ATTENTION_BWD_KERNEL=$kernel timeout "$(left)" python3 scripts/bench/attention_kernel.py \
      --out-dir "$OUT/headline-$kernel" > "$OUT/headline-$kernel/attention_kernel.log" 2>&1
    echo "attention_kernel with the $kernel backward: exit $?"; tail -3 "$OUT/headline-$kernel/attention_kernel.log"
  done
fi
true
