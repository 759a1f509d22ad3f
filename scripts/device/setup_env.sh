#!/usr/bin/env bash
# Prepare an offline GPU machine for this tree: wheels from .whl/ (if any), then build the extension for its GPU.
#
#   source scripts/device/setup_env.sh LOG_DIR     (from the repository root)
#
# Installs .whl/*.whl (and .devdata/hopper/*.whl: nvidia-cudnn-frontend for train.attention = "cudnn*", 5.5 MB
# as scripts/device/prepare_hopper.sh slims it, carried only when a run needs it) and unpacks .whl/cutlass-*-headers.tar.xz (include/cutlass, include/cute and
# tools/util/include of a CUTLASS release; scripts/device/cutlass_headers.sh makes it) for tscale._C_cutlass; a failed build of it is retried
# without it. Exports PYTHONPATH (wheels installed under /tmp/site), CC/CXX (the system gcc/g++ whatever the
# machine presets, unless TSCALE_CC/TSCALE_CXX say otherwise: a toolchain that links libstdc++
# statically made the tests segfault), MAX_JOBS and TORCH_CUDA_ARCH_LIST (this GPU's
# capability, e.g. 9.0, ignoring a preset such as 9.0a) and TSCALE_DATA (.devdata/data, when carried). Prints
# the build time.
LOG_DIR=${1:?usage: source scripts/device/setup_env.sh LOG_DIR}
mkdir -p "$LOG_DIR"
wheels=$(compgen -G ".whl/*.whl"; compgen -G ".devdata/hopper/*.whl")  # the second: the cuDNN frontend, when carried
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site $wheels > "$LOG_DIR/wheels.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if compgen -G ".whl/cutlass-*-headers.tar.xz" > /dev/null; then  # CUTLASS's headers, smaller than its wheel
  mkdir -p /tmp/cutlass && tar -xJf .whl/cutlass-*-headers.tar.xz -C /tmp/cutlass
  export TSCALE_CUTLASS_DIR=/tmp/cutlass
fi
# the tests' real-data folder (tests/conftest.py): the corpus the run carried, where ../shared is absent
[ -d .devdata/data ] && export TSCALE_DATA=${TSCALE_DATA:-$PWD/.devdata/data}
export CC=${TSCALE_CC:-gcc} CXX=${TSCALE_CXX:-g++} MAX_JOBS=${MAX_JOBS:-$(nproc)}
TORCH_CUDA_ARCH_LIST=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
export TORCH_CUDA_ARCH_LIST
t0=$(date +%s)
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$LOG_DIR/build.log" 2>&1; then
  # the optional CUTLASS module is the likeliest to fail on a new toolchain: report it, build without it
  tail -40 "$LOG_DIR/build.log"
  echo "build failed; retrying without tscale._C_cutlass (TSCALE_NO_CUTLASS=1)"
  if ! TSCALE_NO_CUTLASS=1 python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . \
      > "$LOG_DIR/build-without-cutlass.log" 2>&1; then
    tail -40 "$LOG_DIR/build-without-cutlass.log"
    return 1 2>/dev/null || exit 1
  fi
fi
modules=$(python3 -c "import importlib.util as u; print(' '.join(m for m in ('tscale._C', 'tscale._C_cutlass') if u.find_spec(m)))")
echo "built for sm_${TORCH_CUDA_ARCH_LIST/./} in $(( $(date +%s) - t0 )) s: $modules"
