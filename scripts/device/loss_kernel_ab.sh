#!/usr/bin/env bash
# This tree's head-loss kernel against another build's, alone and in training steps, on one GPU, in one call.
#
#   bash scripts/device/loss_kernel_ab.sh OUT_DIR SECONDS BASE_DIR     (repository root, on the GPU machine)
#
# BASE_DIR: setup.py, pyproject.toml, csrc/ and tscale/ of the tree to compare against (`git archive BASE setup.py
# pyproject.toml csrc tscale | tar -x -C .cache/xent-base`, carried). Both are built (without tscale._C_cutlass),
# then: the CUDA tests of tests/test_head_loss.py and tests/test_fused_loss.py; scripts/bench/head_loss_kernel.py
# with --base BASE_DIR/csrc/loss (record OUT_DIR/head_loss_kernel.json); then the training rates of the presets
# in PRESETS (default "gpt2 tscale") at each length of SEQ_LENS (default "1024"; 32,768 tokens a step), this
# tree and the base tree in turn, ROUNDS times (default 1): lines "new-PRESET-T-R" and "base-PRESET-T-R" of
# OUT_DIR/rates.txt. Presets tscale_cudnn* need .devdata/hopper carried. Set TSCALE_COMMIT to this tree's commit.
source scripts/device/ab_builds.sh loss_kernel_ab.sh "$@"
TSCALE_SKIP_EMU=1 timeout "$(left)" python3 -m pytest -q -rfE tests/test_head_loss.py tests/test_fused_loss.py \
  -k cuda > "$OUT/logs/tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/logs/tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/logs/tests.log" | head
timeout "$(left)" python3 scripts/bench/head_loss_kernel.py --base "$BASE/csrc/loss" --out-dir "$OUT" 2>&1 \
  | tee "$OUT/logs/head_loss_kernel.log" | grep -vE "^\s*$" | tail -20
random_tokens
for round in $(seq "${ROUNDS:-1}"); do
  for seq in ${SEQ_LENS:-1024}; do
    for preset in ${PRESETS:-gpt2 tscale}; do
      ab_rate "new-$preset-$seq-$round" "$PWD" "$preset" "$seq"
      ab_rate "base-$preset-$seq-$round" "$BASE" "$preset" "$seq"
    done
  done
done
true
