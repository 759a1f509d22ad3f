#!/usr/bin/env bash
# The common start of the A/B scripts (attention_ab.sh, attention_layout_ab.sh): their arguments, deadline and builds.
#
#   source scripts/device/ab_builds.sh NAME OUT_DIR SECONDS BASE_DIR [OTHER_DIR ...]     (repository root, on the GPU machine)
#
# Sets OUT, BASES (the absolute comparison trees, BASE_DIR first), BASE (= BASES[0]) and left() (seconds until
# SECONDS after the start, at least 1); builds every comparison tree in place (setup.py build_ext --inplace,
# OUT/logs/build-<dir name>.log) while scripts/device/setup_env.sh builds this tree, all without
# tscale._C_cutlass, and returns when all are done.
set -u -o pipefail
usage="usage: $1 OUT_DIR SECONDS BASE_DIR [OTHER_DIR ...]"
OUT=${2:?$usage}
deadline=$(( $(date +%s) + ${3:?$usage} ))
: "${4:?$usage}"
BASES=()
for dir in "${@:4}"; do BASES+=("$(cd "$dir" && pwd)"); done
BASE=${BASES[0]}
left() { echo $(( deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1 )); }
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$OUT/logs"
arch=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
for dir in "${BASES[@]}"; do
  ( cd "$dir" && CC=gcc CXX=g++ MAX_JOBS=8 TORCH_CUDA_ARCH_LIST=$arch python3 setup.py build_ext --inplace \
      > "$OUT/logs/build-$(basename "$dir").log" 2>&1; echo "$(basename "$dir") build exit $?" ) &
done
MAX_JOBS=8 source scripts/device/setup_env.sh "$OUT/logs" || exit 1
wait
