#!/usr/bin/env bash
# The common start of the A/B scripts (attention_ab.sh, attention_layout_ab.sh, loss_kernel_ab.sh): their arguments,
# deadline, builds and training rates.
#
#   source scripts/device/ab_builds.sh NAME OUT_DIR SECONDS BASE_DIR [OTHER_DIR ...]     (repository root, on the GPU machine)
#
# A caller that sets AB_TREES_OPTIONAL=1 before sourcing may be given no comparison tree (BASES empty, BASE "").
# Sets OUT, BASES (the absolute comparison trees, BASE_DIR first), BASE (= BASES[0]) and left() (seconds until
# SECONDS after the start, at least 1); builds every comparison tree in place (setup.py build_ext --inplace,
# OUT/logs/build-<dir name>.log) while scripts/device/setup_env.sh builds this tree, all without
# tscale._C_cutlass, and returns when all are done. Defines ab_rate (below) and random_tokens.
set -u -o pipefail
usage="usage: $1 OUT_DIR SECONDS BASE_DIR [OTHER_DIR ...]"
OUT=${2:?$usage}
source scripts/device/deadline.sh "${3:?$usage}"
[ -n "${4:-}" ] || [ "${AB_TREES_OPTIONAL:-0}" = 1 ] || { echo "$usage" >&2; exit 2; }
BASES=()
for dir in "${@:4}"; do
  [ -d "$dir" ] || { echo "$1: $dir: no such comparison tree (make it with git archive, then carry it)" >&2; exit 2; }
  BASES+=("$(cd "$dir" && pwd)")
done
BASE=${BASES[0]:-}
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$OUT/logs"
arch=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
for dir in "${BASES[@]}"; do
  ( cd "$dir" && CC=gcc CXX=g++ MAX_JOBS=8 TORCH_CUDA_ARCH_LIST=$arch python3 setup.py build_ext --inplace \
      > "$OUT/logs/build-$(basename "$dir").log" 2>&1; echo "$(basename "$dir") build exit $?" ) &
done
MAX_JOBS=8 source scripts/device/setup_env.sh "$OUT/logs" || exit 1
wait

# random_tokens: the token folder of random GPT-2 ids that ab_rate trains on
source scripts/device/random_tokens.sh

# ab_rate NAME TREE [PRESET [SEQ_LEN]]: the training rate of an arch_speed.py preset (default tscale, 1,024 tokens a
# window, 32,768 tokens a step) in TREE's build, through the real loop in torch.compile's default mode, 30 steps after
# 10; run from TREE's root, whose tscale/ a `python -c` imports before any other. Appends "NAME tscale-path
# tokens/s GiB" to OUT/rates.txt.
ab_rate() {
  local preset=${3:-tscale} seq=${4:-1024} repo=$PWD
  (cd "$2" && PYTHONPATH="/tmp/site" timeout "$(left)" python3 -c "
import sys; sys.path.insert(0, '$repo/scripts/bench')
from pathlib import Path
import tscale
from arch_speed import rate
r, mem = rate('$preset', Path('$RANDOM_TOKENS'), 'default', 30, 10, 32768 // $seq, $seq)
print('$1', tscale.__file__, round(r), 'tokens/s', round(mem, 2), 'GiB')" 2>"$OUT/logs/rate-$1.log" | tee -a "$OUT/rates.txt")
}
