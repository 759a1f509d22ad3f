#!/usr/bin/env bash
# This tree's attention op against another build of it, in a tscale 124M training step, on one GPU, in one call.
#
#   bash scripts/device/attention_layout_ab.sh OUT_DIR SECONDS BASE_DIR [OTHER_DIR ...]     (repository root, on the GPU machine)
#
# BASE_DIR (and each OTHER_DIR): setup.py, pyproject.toml, csrc/ and tscale/ of a tree to compare against
# (`git archive BASE setup.py pyproject.toml csrc tscale | tar -x -C .cache/attn-base`, carried). All are built
# (without tscale._C_cutlass), then: the tests of tests/test_attention_kernel.py, tests/test_tscale_arch.py and
# tests/test_train.py (the CUDA ones included; emulator tests skipped); then the training rate of
# configs/tscale-124m.toml (scripts/bench/arch_speed.py's `rate`: the real loop, torch.compile default mode,
# batch 32 x 1024 of random ids) for this tree and each other tree in turn, ROUNDS times (default 2; lines
# "new-R" and "<dir name>-R" of OUT_DIR/rates.txt; SKIP_TESTS=1 skips the tests). Set TSCALE_COMMIT to this
# tree's commit.
source scripts/device/ab_builds.sh attention_layout_ab.sh "$@"
[ "${SKIP_TESTS:-0}" = 1 ] || TSCALE_SKIP_EMU=1 timeout "$(left)" python3 -m pytest -q -rfE tests/test_attention_kernel.py tests/test_tscale_arch.py \
  tests/test_train.py > "$OUT/logs/tests.log" 2>&1
[ "${SKIP_TESTS:-0}" = 1 ] || { echo "tests: $(tail -1 "$OUT/logs/tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/logs/tests.log" | head; }
random_tokens
for round in $(seq "${ROUNDS:-2}"); do
  ab_rate "new-$round" "$PWD"
  for dir in "${BASES[@]}"; do ab_rate "$(basename "$dir")-$round" "$dir"; done
done
true
