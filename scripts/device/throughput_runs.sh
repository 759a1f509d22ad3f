#!/usr/bin/env bash
# Where tscale's training step goes against gpt2's, and both presets' training rates, on the benchmark corpus.
#
#   [PARTS="profile speed4096 speed"] bash scripts/device/throughput_runs.sh OUT_DIR [SECONDS] [PRESET ...]
#                                              (repository root, on a Hopper GPU machine; carry .whl,
#                                               .devdata/hopper and .devdata/sub as for cudnn_runs.sh)
#
# Builds the package and tokenizes mix + code slice (step_bench_prelude.sh), then runs the PARTS in order until
# SECONDS (default 570) after the start:
#   profile    scripts/bench/arch_profile.py --archs gpt2 tscale_cudnn PRESET... --rounds 2 at T 4096 (the order
#              reversed in the second round, against the clock's drift over a process), the top 60 kernels and every
#              matrix product by shape and layout (OUT_DIR/arch_profile_T4096.json);
#   speed4096  scripts/bench/arch_speed.py --attention cudnn [--also PRESET...] on windows of 4,096 tokens
#              (OUT_DIR/T4096/architecture.json);
#   speed      the same at 1,024 (OUT_DIR/architecture.json).
# PRESET: more of arch_speed.py's presets. Set TSCALE_COMMIT to this tree's commit.
set -u -o pipefail
OUT=${1:?usage: throughput_runs.sh OUT_DIR [SECONDS] [PRESET ...]}
source scripts/device/step_bench_prelude.sh "$OUT" "${2:-570}" || exit 1
extra=("${@:3}")
for part in ${PARTS:-profile speed4096 speed}; do
  case $part in
    profile)
      timeout "$(left)" python3 scripts/bench/arch_profile.py $tok --archs gpt2 tscale_cudnn "${extra[@]}" --rounds 2 \
        --seq-len 4096 --top 60 --products --out "$OUT/arch_profile_T4096.json" > "$OUT/logs/arch_profile_T4096.log" 2>&1
      echo "profile T 4096: exit $?"; grep -E "^== |ms per step|Error" "$OUT/logs/arch_profile_T4096.log" ;;
    speed) cudnn_rates 1024 "${extra[@]}" ;;
    speed4096) cudnn_rates 4096 "${extra[@]}" ;;
    *) echo "throughput_runs.sh: unknown part '$part' (profile, speed4096, speed)"; exit 2 ;;
  esac
done
