#!/usr/bin/env bash
# The Hopper attention forward on the GPU machine: build, the attention kernel's CUDA tests, then GPU time per
# kernel of a forward + backward call with each forward (the sm_80 kernel; the pipelined sm_90a one at 64- and
# 128-key tiles, one or two warpgroups a block; the specialised-warp one at 64- and 128-key tiles, two or three
# buffers), cuDNN's causal call beside.
#
#   bash scripts/device/sm90_forward.sh OUT_DIR [SECONDS]      (repository root, on the GPU machine)
#
# Writes OUT_DIR/{build,tests}.log, OUT_DIR/profile-{CONFIG}-r{ROUND}.json (attention_profile.py; CONFIG = auto, mma
# or sm90-BN-WGS or ws-BN-STAGES-PINGPONG[-PERSISTENT]; CONFIGS overrides the list, ROUNDS (default 1) repeats it;
# TESTS_K selects the tests by pytest -k, all of the file's by default, TESTS=0 skips them) and, with HEADLINE=1, the
# op's own choice timed by attention_kernel.py (OUT_DIR/attention_kernel.json and .log).
set -u
OUT=${1:?usage: sm90_forward.sh OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${2:-570}"
source scripts/device/setup_env.sh "$OUT" || exit 1
if [ "${TESTS:-1}" = 1 ]; then
  TSCALE_SKIP_EMU=1 timeout "$(( $(left) - 150 ))" python3 -m pytest -q -rfE --maxfail=20 -x tests/test_attention_kernel.py \
    ${TESTS_K:+-k "$TESTS_K"} > "$OUT/tests.log" 2>&1
  echo "tests: $(tail -1 "$OUT/tests.log")"
  grep -E "^(FAILED|ERROR)|Error|error" "$OUT/tests.log" | head -20
fi
for round in $(seq "${ROUNDS:-1}"); do
  for cfg in ${CONFIGS:-ws-128-2-1 ws-128-2-0 ws-128-3-1 ws-64-2-1 sm90-128-2 mma}; do
    IFS=- read -r kernel bn third fourth fifth <<< "$cfg"
    if [ "$kernel" = ws ]; then
      kernel=sm90
      form="TSCALE_ATTENTION_SM90_FWD=ws TSCALE_ATTENTION_SM90_STAGES=$third TSCALE_ATTENTION_SM90_PINGPONG=${fourth:-1}"
      form="$form TSCALE_ATTENTION_SM90_PERSISTENT=${fifth:-0}"
    else
      form="TSCALE_ATTENTION_SM90_FWD=pipelined TSCALE_ATTENTION_SM90_WGS=${third:-1}"
    fi
    env TSCALE_ATTENTION_FWD_KERNEL=$kernel TSCALE_ATTENTION_SM90_BN=${bn:-64} $form timeout "$(left)" \
      python3 scripts/bench/attention_profile.py --steps 10 --out "$OUT/profile-$cfg-r$round.json" \
      > "$OUT/profile-$cfg-r$round.log" 2>&1
    echo "profile $cfg round $round: exit $?"
    grep -E "^T|fwd" "$OUT/profile-$cfg-r$round.log"
  done
done
if [ "${HEADLINE:-0}" = 1 ]; then
  timeout "$(left)" python3 scripts/bench/attention_kernel.py > "$OUT/attention_kernel.log" 2>&1
  echo "attention_kernel: exit $?"; tail -12 "$OUT/attention_kernel.log"
  cp docs/bench/attention_kernel.json "$OUT/" 2>/dev/null
fi
true
