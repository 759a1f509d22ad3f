#!/usr/bin/env bash
# Two copies of HEAD's attention build (committed files only) that differ only in the order their blocks take tiles,
# for attention_ab.sh: .cache/attn-lpt launches (H, B, tiles) (every head's and batch row's longest tile before any
# shorter one) and .cache/attn-perb (H, tiles, B) (the same within each batch row); HEAD launches (tiles, H, B).
#
#   bash scripts/device/grid_order_trees.sh      (repository root, on this machine; carry both folders)
#
# docs/BENCHMARKS.md, "Built, not yet timed", says what each should change.
# Check them on CPU first: TSCALE_EMU_SOURCE_ROOT=.cache/attn-lpt python3 -m pytest tests/test_attention_emulated.py.
# For timing only: their tile_grid still checks H and B against the 65535 limit of a grid's y and z, not the tile
# count they put there; the order adopted must check its own y and z dims.
set -euo pipefail
make_tree() {  # DIR GRID BLOCK_TILE: the tile_grid dims and block_tile's (rank, h, b) fields
  local dir=$1 grid=$2 fields=$3
  rm -rf "$dir" && mkdir -p "$dir"
  git archive HEAD setup.py pyproject.toml csrc tscale | tar -x -C "$dir"
  local host=$dir/csrc/attention/attention_host.h common=$dir/csrc/attention/attention_common.cuh
  local dims='return dim3(tiles, H, B);'
  grep -qF "$dims" "$host" || { echo "tile_grid not found in $host" >&2; exit 1; }
  sed -i "s|$dims|return dim3($grid);|" "$host"
  local old='return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z)};'
  grep -qF "$old" "$common" || { echo "block_tile not found in $common" >&2; exit 1; }
  sed -i "s|$old|return {$fields};|" "$common"
  echo "$dir: grid ($grid)"
}
idx() { echo "static_cast<int>(blockIdx.$1)"; }
make_tree .cache/attn-lpt "H, B, tiles" "$(idx z), $(idx x), $(idx y)"
make_tree .cache/attn-perb "H, tiles, B" "$(idx y), $(idx x), $(idx z)"
