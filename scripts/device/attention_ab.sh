#!/usr/bin/env bash
# The fused attention kernel of this tree against other builds of it, on one GPU, in one call.
#
#   bash scripts/device/attention_ab.sh OUT_DIR SECONDS [BASE_DIR [OTHER_DIR ...]]     (repository root, on the GPU machine)
#
# BASE_DIR (and each OTHER_DIR): a copy of setup.py, pyproject.toml, csrc/ and tscale/ of a tree to compare
# against (e.g. `git archive BASE setup.py pyproject.toml csrc tscale | tar -x -C .cache/attn-base`, carried).
# Without one only this tree is built and profiled, with its VARIANTS: the shortest call that compares settings.
# All are built (without tscale._C_cutlass) side by side, then: the CUDA tests of tests/test_attention_kernel.py;
# scripts/bench/attention_profile.py for this tree and each other tree in turn, ROUNDS times (kernel time per forward +
# backward call by kernel, records OUT_DIR/profile-{new,<dir name>}-ROUND.json); scripts/bench/attention_kernel.py
# (docs/bench/attention_kernel.json); the resources (registers, spills) of this tree's and BASE_DIR's kernels;
# then, with what time is left, the model's attention cost (scripts/bench/architecture.py attention on mix +
# code slice from .devdata/data, 3 steps profiled; OUT_DIR/model-<name>/results.json) for this tree and each
# other; last, OUT_DIR/ab_summary.json (scripts/bench/attention_ab_summary.py: per tree, kernel time per call by
# mask, main forward and backward kernels apart, and the model's ratios from its results.json), which comes back
# when the logs do not.
# ROUNDS (default 2) sets the profile rounds; TESTS_K narrows the tests (a pytest -k expression), TESTS=0 skips
# them; VARIANTS adds profiles of this tree with settings, each NAME:VAR=VALUE[,VAR=VALUE...]
# (profile-new_NAME-ROUND.json), e.g. "dqv4:TSCALE_ATTENTION_SM90_BWD_DQ_V4=1"; MODEL_VARIANTS the same for the
# model's attention cost (OUT_DIR/model-new_NAME/); HEADLINE=0 skips attention_kernel.py; PROFILE_ARGS are passed to
# attention_profile.py (e.g. "--windows 128 512").
# Set TSCALE_COMMIT to this tree's commit: the GPU machine's copy of .git may be older than the tree sent.
AB_TREES_OPTIONAL=1 source scripts/device/ab_builds.sh attention_ab.sh "$@"
usage() {  # one "kernel name:" line (template arguments kept) and its REG/STACK/SHARED line per kernel
  cuobjdump -res-usage "$1" 2>/dev/null | grep -A1 "attention_\|doc_stats" | grep -v "^--" \
    | sed 's/.*_[0-9]*\(attention_[a-z_]*kernel\|doc_stats_kernel\)/\1/; s/EEvNS1_9[A-Za-z]*ParamsE:/:/; s/EPKiPiS4_iii:/:/'
}
echo "resources, this tree:"; usage "$(ls tscale/_C*.so)" | tee "$OUT/resources-new.txt"
[ -n "$BASE" ] && { echo "resources, base:"; usage "$(ls "$BASE"/tscale/_C*.so)" | tee "$OUT/resources-base.txt"; }
if [ "${TESTS:-1}" = 1 ]; then
  TSCALE_SKIP_EMU=1 timeout "$(left)" python3 -m pytest -q -p no:logging -m cuda tests/test_attention_kernel.py \
    ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$OUT/logs/tests.log" | tail -4
fi
profile() {  # NAME PYTHONPATH-FIRST [VAR=VALUE,...]
  local name=$1 root=$2
  local -a settings=()
  [ -n "${3:-}" ] && IFS=, read -r -a settings <<< "$3"
  env "${settings[@]}" PYTHONPATH="$root:/tmp/site" timeout "$(left)" python3 scripts/bench/attention_profile.py \
    ${PROFILE_ARGS:-} --out "$OUT/profile-$name.json" > "$OUT/logs/profile-$name.log" 2>&1
  echo "$name: $(grep -E "per forward" "$OUT/logs/profile-$name.log" | tr '\n' ' ')"
}
for dir in "${BASES[@]}"; do
  (cd /tmp && PYTHONPATH="$dir:/tmp/site" python3 -c "import tscale; print('$(basename "$dir") imports', tscale.__file__)")
done
for round in $(seq "${ROUNDS:-2}"); do
  profile "new-$round" "$PWD"
  for dir in "${BASES[@]}"; do profile "$(basename "$dir")-$round" "$dir"; done
  for variant in ${VARIANTS:-}; do profile "new_${variant%%:*}-$round" "$PWD" "${variant#*:}"; done
done
if [ "${HEADLINE:-1}" = 1 ]; then
  timeout "$(left)" python3 scripts/bench/attention_kernel.py > "$OUT/logs/attention_kernel.log" 2>&1
  echo "attention_kernel.py exit $?"; tail -12 "$OUT/logs/attention_kernel.log"
  cp docs/bench/attention_kernel.json "$OUT/" 2>/dev/null
fi
tok=.cache/issue3/tokens
if [ ! -f $tok/manifest.json ] && [ -d .devdata/data ]; then
  timeout "$(left)" python3 -m tscale tokenize .devdata/data/mix.jsonl.xz .devdata/data/code-slice.jsonl.xz \
    --tokenizer .devdata/data/gpt2-bpe -o $tok --quiet
fi
model_cost() {  # NAME PYTHONPATH-FIRST [VAR=VALUE,...]: the attention of a tscale 124M step, timed and profiled (3 steps)
  local name=$1 root=$2
  local -a settings=()
  [ -n "${3:-}" ] && IFS=, read -r -a settings <<< "$3"
  env "${settings[@]}" PYTHONPATH="$root:/tmp/site" timeout "$(left)" python3 scripts/bench/architecture.py attention --tokens $tok \
    --work "$OUT/model-$name" --out-dir "$OUT/model-$name" --profile-steps 3 > "$OUT/logs/model-$name.log" 2>&1
  echo "$name: $(grep -E "^attention T=" "$OUT/logs/model-$name.log" | cut -c1-60 | tr '\n' ' ')"
}
if [ -f $tok/manifest.json ]; then  # no tokens (.devdata/data not carried, or no time left): no model cost
  model_cost new "$PWD"
  for dir in "${BASES[@]}"; do model_cost "$(basename "$dir")" "$dir"; done
  for variant in ${MODEL_VARIANTS:-}; do model_cost "new_${variant%%:*}" "$PWD" "${variant#*:}"; done
fi
python3 scripts/bench/attention_ab_summary.py "$OUT" | tail -1
true
