#!/usr/bin/env bash
# Muon's Newton-Schulz iteration against a base tree's on one GPU, in one call: the CUDA tests, the optimizer step
# alone with its distance to the float32 iteration in both trees, and training rates in alternating processes.
#
#   [PRESET=tscale_cudnn SEQ_LEN=4096] bash scripts/device/muon_ns_ab.sh OUT_DIR SECONDS BASE_DIR
#       (repository root, on the GPU machine; carry .whl, .devdata/hopper and BASE_DIR, made with
#        git archive REV setup.py pyproject.toml csrc tscale cli scripts configs | tar -x -C BASE_DIR)
#
# Builds both trees (ab_builds.sh), runs tests/test_muon.py on the GPU (OUT_DIR/logs/tests.log), then
# scripts/bench/muon_profile.py --variants eager compiled_step in this tree and in BASE_DIR's (OUT_DIR/muon_profile.json,
# OUT_DIR/muon_profile-base.json: step time, kernels by kind, the first update against the float32 definition), then
# the training rate of arch_speed.py's PRESET at SEQ_LEN tokens a window on random GPT-2 ids in the order this tree,
# base, base, this tree (OUT_DIR/rates.txt). Everything stops SECONDS after the start.
set -u -o pipefail
source scripts/device/ab_builds.sh muon_ns_ab.sh "$@" || exit 1
timeout "$(left)" python3 -m pytest -q -rfE tests/test_muon.py > "$OUT/logs/tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/logs/tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/logs/tests.log" | head
for tree in "$PWD" "$BASE"; do
  name=$([ "$tree" = "$PWD" ] && echo muon_profile || echo muon_profile-base)
  (cd "$tree" && PYTHONPATH="$tree:/tmp/site" timeout "$(left)" python3 scripts/bench/muon_profile.py \
     --variants eager compiled_step --out "$OUT/$name.json") > "$OUT/logs/$name.log" 2>&1
  echo "$name:"; grep -E "^(eager|compiled_step)|against|Error" "$OUT/logs/$name.log"
done
random_tokens
for tree in "$PWD" "$BASE" "$BASE" "$PWD"; do
  name=$([ "$tree" = "$PWD" ] && echo this || echo base)
  ab_rate "$name" "$tree" "${PRESET:-tscale_cudnn}" "${SEQ_LEN:-4096}"
done
true
