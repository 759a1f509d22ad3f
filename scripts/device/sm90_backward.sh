#!/usr/bin/env bash
# The Hopper attention backward on the GPU machine: build, its CUDA tests, then GPU time per kernel of a forward +
# backward call with the sm_90a main kernel and with the sm_80 one (attention_profile.py), cuDNN's beside.
#
#   bash scripts/device/sm90_backward.sh OUT_DIR [SECONDS]      (repository root, on the GPU machine)
#
# Writes OUT_DIR/{build,tests}.log and OUT_DIR/profile-bwd-VARIANT-ROUND.{json,log} for each of VARIANTS (default
# "sm90:1 sm90:2 mma"; a variant is KERNEL[:WGS[:TMA[:EARLY_DV[:DQ_FIRST[:DQ_V4]]]]], the last four the values of
# TSCALE_ATTENTION_SM90_BWD_TMA, _EARLY_DV, _DQ_FIRST and _DQ_V4, auto when left out, and VARIANT the same joined by
# dashes) in
# each of ROUNDS rounds (default 1), each step as it ends, and after each round one summary line a variant. SEQ overrides
# the lengths profiled (default "1024 4096") and WINDOWS the local masks' windows (default 128); TESTS=0 skips the
# tests, TESTS=last runs them after the profiles, TESTS_K narrows them (a pytest -k expression). With HEADLINE=1,
# then attention_kernel.py with each of HEADLINE_VARIANTS (the op's own forward choice):
# OUT_DIR/headline-VARIANT/attention_kernel.json and .log.
set -u
OUT=${1:?usage: sm90_backward.sh OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${2:-570}"
source scripts/device/setup_env.sh "$OUT" || exit 1
run_tests() {
  # (without the settings a variant exported: the tests choose their own)
  env -u TSCALE_ATTENTION_BWD_KERNEL -u TSCALE_ATTENTION_SM90_BWD_WGS -u TSCALE_ATTENTION_SM90_BWD_TMA \
    -u TSCALE_ATTENTION_SM90_BWD_EARLY_DV -u TSCALE_ATTENTION_SM90_BWD_DQ_FIRST -u TSCALE_ATTENTION_SM90_BWD_DQ_V4 \
    TSCALE_SKIP_EMU=1 timeout "$(left)" python3 -m pytest -q -rfE --maxfail=5 -x tests/test_attention_kernel.py \
    -k "hopper_backward${TESTS_K:+ and ($TESTS_K)}" > "$OUT/tests.log" 2>&1
  echo "tests: $(tail -1 "$OUT/tests.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -5
}
[ "${TESTS:-1}" = 1 ] && run_tests
# A variant is KERNEL[:WGS[:TMA[:EARLY_DV[:DQ_FIRST[:DQ_V4]]]]]: the backward kernel and, for sm90, its warpgroups per
# block (1 when left out), how its Q and dO come, whether dV is issued early, whether dQ's first half goes before dK
# and whether dQ's atomics go four floats at once (the op's defaults when left out). Sets the settings' variables and
# `name`.
split_variant() {
  IFS=: read -r kernel wgs tma early dqfirst dqv4 <<< "$1"
  export TSCALE_ATTENTION_BWD_KERNEL=$kernel TSCALE_ATTENTION_SM90_BWD_WGS=${wgs:-1} \
    TSCALE_ATTENTION_SM90_BWD_TMA=${tma:-auto} TSCALE_ATTENTION_SM90_BWD_EARLY_DV=${early:-auto} \
    TSCALE_ATTENTION_SM90_BWD_DQ_FIRST=${dqfirst:-auto} TSCALE_ATTENTION_SM90_BWD_DQ_V4=${dqv4:-auto}
  name=$kernel-${wgs:-1}-${tma:-auto}-${early:-auto}${dqfirst:+-$dqfirst}${dqv4:+-$dqv4}
}
for round in $(seq "${ROUNDS:-1}"); do
  for variant in ${VARIANTS:-sm90:1 sm90:2 mma}; do
    split_variant "$variant"
    timeout "$(left)" python3 scripts/bench/attention_profile.py --steps 5 --seq ${SEQ:-1024 4096} \
      --windows ${WINDOWS:-128} \
      --out "$OUT/profile-bwd-$name-$round.json" > "$OUT/profile-bwd-$name-$round.log" 2>&1
    echo "profile $name round $round: exit $?"
  done
  # after each round, one line a variant, the rounds so far averaged (OUT_DIR/ab_summary.json)
  [ -n "$(compgen -G "$OUT/profile-bwd-*.json")" ] && python3 scripts/bench/attention_ab_summary.py "$OUT"
done
[ "${TESTS:-1}" = last ] && run_tests
if [ "${HEADLINE:-0}" = 1 ]; then
  for variant in ${HEADLINE_VARIANTS:-mma sm90:1 sm90:2}; do
    split_variant "$variant"
    dir="$OUT/headline-$name"; mkdir -p "$dir"
    timeout "$(left)" python3 scripts/bench/attention_kernel.py --out-dir "$dir" > "$dir/attention_kernel.log" 2>&1
    echo "attention_kernel with the backward $name: exit $?"
    grep -E "^ *[0-9]+ +[0-9]+ +(causal|local)|speedup|ratio" "$dir/attention_kernel.log"
  done
fi
true
