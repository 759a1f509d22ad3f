#!/usr/bin/env bash
# The common start of the A/B scripts (attention_ab.sh, attention_layout_ab.sh): their arguments, deadline and two builds.
#
#   source scripts/device/ab_builds.sh NAME OUT_DIR SECONDS BASE_DIR     (repository root, on the GPU machine)
#
# Sets OUT, BASE (absolute) and left() (seconds until SECONDS after the start, at least 1); builds BASE in
# place (setup.py build_ext --inplace, OUT/logs/build-base.log) while scripts/device/setup_env.sh builds
# this tree, both without tscale._C_cutlass, and returns when both are done.
set -u -o pipefail
OUT=${2:?usage: $1 OUT_DIR SECONDS BASE_DIR}
deadline=$(( $(date +%s) + ${3:?usage: $1 OUT_DIR SECONDS BASE_DIR} ))
BASE=$(cd "${4:?usage: $1 OUT_DIR SECONDS BASE_DIR}" && pwd)
left() { echo $(( deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1 )); }
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
mkdir -p "$OUT/logs"
arch=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
( cd "$BASE" && CC=gcc CXX=g++ MAX_JOBS=8 TORCH_CUDA_ARCH_LIST=$arch python3 setup.py build_ext --inplace \
    > "$OUT/logs/build-base.log" 2>&1; echo "base build exit $?" ) &
MAX_JOBS=8 source scripts/device/setup_env.sh "$OUT/logs" || exit 1
wait
