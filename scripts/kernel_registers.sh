#!/usr/bin/env bash
# Registers and spills of every kernel in one CUDA source, compiled here for one architecture (no GPU needed).
#
#   bash scripts/kernel_registers.sh SOURCE.cu [ARCH] [FILTER]      (repository root)
#
# ARCH is an nvcc code name (default sm_90a; the Hopper kernels need it), FILTER an extended regex that the kernels'
# mangled names must match (default: all). Prints one line a kernel: registers, spill stores and loads in bytes, then
# the demangled name. Works with a CPU build of torch: the one header such a build lacks
# (c10/cuda/impl/cuda_cmake_macros.h) is supplied from a temporary folder.
set -eu
src=${1:?usage: kernel_registers.sh SOURCE.cu [ARCH] [FILTER]}
arch=${2:-sm_90a}
filter=${3:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/inc/c10/cuda/impl"
echo '#define C10_CUDA_BUILD_SHARED_LIBS' > "$tmp/inc/c10/cuda/impl/cuda_cmake_macros.h"
torch_inc=$(python3 -c "import torch.utils.cpp_extension as c; print(' '.join('-I' + p for p in c.include_paths()))")
py_inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
# shellcheck disable=SC2086
if ! nvcc -O3 --use_fast_math -std=c++17 --expt-relaxed-constexpr -gencode="arch=compute_${arch#sm_},code=$arch" \
    -Xptxas -v -I"$tmp/inc" $torch_inc -I"$py_inc" -Icsrc -Icsrc/attention -DTORCH_EXTENSION_NAME=_C \
    -c "$src" -o "$tmp/out.o" > "$tmp/log" 2>&1; then
  grep -E "error" "$tmp/log" | head -20 >&2
  exit 1
fi
# ptxas prints, per entry function: "Compiling entry function 'NAME'", then its spills, then "Used N registers".
awk -v filter="$filter" '
  /Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); name = substr($0, RSTART + 1, RLENGTH - 2); next }
  /spill stores/ { match($0, /[0-9]+ bytes spill stores/); st = substr($0, RSTART, RLENGTH) + 0
                   match($0, /[0-9]+ bytes spill loads/); ld = substr($0, RSTART, RLENGTH) + 0; next }
  /Used [0-9]+ registers/ && name ~ filter { match($0, /Used [0-9]+/); regs = substr($0, RSTART + 5, RLENGTH - 5)
                   printf "%4d regs %4d/%-4d spill  %s\n", regs, st, ld, name }
' "$tmp/log" | while read -r regs unit spill word name; do
  printf '%s %s %s %s %s\n' "$regs" "$unit" "$spill" "$word" "$(echo "$name" | c++filt)"
done
