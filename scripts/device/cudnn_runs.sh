#!/usr/bin/env bash
# cuDNN's attention in the tscale step: its CUDA tests, its kernel time against causal SDPA, and training rates.
#
#   [PARTS="tests profile speed"] bash scripts/device/cudnn_runs.sh OUT_DIR [SECONDS] [PRESET ...]
#                                                    (repository root, on a Hopper GPU machine)
#
# Carry .whl, .devdata/hopper (the cuDNN frontend wheel) and the corpus: .devdata/data and .devdata/hopper
# together exceed a call's 64 MiB, so carry .devdata/sub (scripts/device/prepare_hopper.sh makes both) and run
# `mkdir -p .devdata/data && cp -r .devdata/sub/* .devdata/data/` first. Builds the package, tokenizes mix + code
# slice unless .cache/issue3/tokens holds them, then runs the PARTS in order until SECONDS (default 570) after
# the start:
#   tests      the CUDA tests of both paths over document runs (tests/test_attention_cudnn.py,
#              tests/test_attention_fa2.py; their summary and skip reasons in OUT_DIR/logs/tests.log: the frontend
#              prints reference-leak warnings after them at exit);
#   profile    scripts/bench/arch_profile.py --archs tscale_sdpa tscale_cudnn PRESET... --rounds 2 at T 4096, then
#              1024 (OUT_DIR/arch_profile_cudnn_T<T>.json: kernel time per step by group and per round; PRESET:
#              more of arch_speed.py's presets, e.g. tscale_cudnn_bucket64, the run counts padded to 64);
#   speed      scripts/bench/arch_speed.py --modes default --attention cudnn (gpt2, tscale and tscale over cuDNN,
#              the real loop, 32,768 tokens a step; OUT_DIR/architecture.json);
#   speed4096  the same on windows of 4,096 tokens (OUT_DIR/T4096/architecture.json).
# Set TSCALE_COMMIT to this tree's commit.
set -u -o pipefail
OUT=${1:?usage: cudnn_runs.sh OUT_DIR [SECONDS] [PRESET ...]}
source scripts/device/step_bench_prelude.sh "$OUT" "${2:-570}" || exit 1
for part in ${PARTS:-tests profile speed}; do
  case $part in
    tests)
      timeout "$(left)" python3 -m pytest -q -rs -k cuda tests/test_attention_cudnn.py tests/test_attention_fa2.py \
        > "$OUT/logs/tests.log" 2>&1
      echo "tests: $(grep -E '[0-9]+ (passed|failed)' "$OUT/logs/tests.log" | tail -1)"
      grep -E "^SKIPPED|^FAILED" "$OUT/logs/tests.log" ;;
    profile)
      for T in 4096 1024; do
        timeout "$(left)" python3 scripts/bench/arch_profile.py $tok --archs tscale_sdpa tscale_cudnn "${@:3}" \
          --rounds 2 --seq-len $T --top 40 --out "$OUT/arch_profile_cudnn_T$T.json" \
          > "$OUT/logs/arch_profile_cudnn_T$T.log" 2>&1
        echo "T $T: exit $?"; grep -E "^round |^== |Error" "$OUT/logs/arch_profile_cudnn_T$T.log"
      done ;;
    speed|speed4096)
      T=1024 dir=$OUT
      [ "$part" = speed4096 ] && T=4096 dir=$OUT/T4096
      timeout "$(left)" python3 scripts/bench/arch_speed.py $tok --modes default --attention cudnn --seq-len $T \
        --steps 20 --warmup 15 --out-dir "$dir" 2>&1 | tee "$OUT/logs/arch_speed_T$T.log" | grep -vi warn | tail -6 ;;
    *) echo "cudnn_runs.sh: unknown part '$part' (tests, profile, speed, speed4096)"; exit 2 ;;
  esac
done
