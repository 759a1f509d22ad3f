#!/usr/bin/env bash
# Make the carry of a Hopper run that needs cuDNN's attention fit the 64 MiB a call allows.
#
#   bash scripts/device/prepare_hopper.sh [DATA_DIR]      (repository root; DATA_DIR default ../shared/data)
#
# .devdata/hopper/: the nvidia-cudnn-frontend wheel for the GPU machine's Python (PYTHON_VERSION, default 3.12)
# without the packages `import cudnn` loads only on first attribute access and the graph API
# (tscale/ops/attention_cudnn.py) never touches: about 5.5 MB instead of 12. Its RECORD is rewritten to match.
# .devdata/sub/: every 4th document of mix.jsonl.xz and code-slice.jsonl.xz, with gpt2-bpe/ and the tests'
# shakespeare.jsonl.xz, about 18 MB: enough
# tokens (28.6M) for timing runs, not for the convergence benchmark, which needs the whole corpus
# (.devdata/data, prepare_carry.sh). With .whl (2.8 MB without CUTLASS's headers) and the tree, .devdata/data
# (57.5 MB) and .devdata/hopper together exceed the limit; carry .devdata/sub instead and copy it to
# .devdata/data on the machine (scripts/device/cudnn_runs.sh says how), or carry .devdata/min with .devdata/data.
# .devdata/min/: .whl's wheels without CUTLASS's headers and the frontend also without its kernels written in Python
# DSLs (Blackwell's; the graph API runs cuDNN's own engines) and other features' packages, 5.8 MB: with the tree
# and .devdata/data, 66 MB (scripts/device/global6_convergence.sh installs it).
set -euo pipefail
DATA=${1:-../shared/data}
PY=${PYTHON_VERSION:-3.12}
# subpackages of other features (kernels written in Python DSLs, other frameworks' bindings)
FEATURES=(cudnn/gemm/ cudnn/linear_attention/ cudnn/gated_attention_block/ cudnn/deepseek_sparse_attention/
          cudnn/moe_ep/ cudnn/block_sparse_attention/ cudnn/flex_attention/ cudnn/hstu/ cudnn/native_sparse_attention/
          cudnn/QSA/ cudnn/fla/ cudnn/gnn/ cudnn/jax/)

# slim_wheel WHEEL DIR PREFIX...: a copy of WHEEL in DIR without the files under PREFIX..., its RECORD to match
slim_wheel() {
  python3 - "$@" <<'PY'
import os, sys, zipfile
src, out_dir, drop = sys.argv[1], sys.argv[2], tuple(sys.argv[3:])
dst = os.path.join(out_dir, os.path.basename(src))
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst + ".part", "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
    for item in zin.infolist():
        if item.filename.startswith(drop):
            continue
        data = zin.read(item.filename)
        if item.filename.endswith(".dist-info/RECORD"):
            data = b"\n".join(line for line in data.split(b"\n") if not line.decode().startswith(drop))
        zout.writestr(item, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
os.replace(dst + ".part", dst)
PY
}
if ! compgen -G ".devdata/hopper/nvidia_cudnn_frontend-*.whl" > /dev/null; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" \
    --platform manylinux_2_28_x86_64 --implementation cp -d "$work" nvidia-cudnn-frontend
  mkdir -p .devdata/hopper
  slim_wheel "$(compgen -G "$work/*.whl")" .devdata/hopper "${FEATURES[@]}" include/
fi
if ! compgen -G ".devdata/min/nvidia_cudnn_frontend-*.whl" > /dev/null; then
  compgen -G ".whl/*.whl" > /dev/null || { echo "prepare_hopper.sh: .whl/ holds no wheels; run scripts/device/prepare_carry.sh first" >&2; exit 2; }
  mkdir -p .devdata/min
  cp .whl/*.whl .devdata/min/
  slim_wheel "$(compgen -G ".devdata/hopper/nvidia_cudnn_frontend-*.whl")" .devdata/min cudnn/sdpa/fwd/kernels/ \
    cudnn/sdpa/bwd/kernels/ cudnn/triangle_attention/ cudnn/causal_conv1d_bulk_sm100/ cudnn/norm/ cudnn/conv/ \
    cudnn/triangle_multiplicative_update/ cudnn/csa/
fi
if [ ! -e .devdata/sub/code-slice.jsonl.xz ]; then
  mkdir -p .devdata/sub
  [ -e .devdata/sub/gpt2-bpe ] || cp -r "$DATA/gpt2-bpe" .devdata/sub/
  for f in mix code-slice; do
    xz -dc "$DATA/$f.jsonl.xz" | awk 'NR % 4 == 1' | xz -6 -T2 > ".devdata/sub/$f.jsonl.xz.part"
    mv ".devdata/sub/$f.jsonl.xz.part" ".devdata/sub/$f.jsonl.xz"
  done
fi
# the tests' small corpus (1.6 MB): without it the CUDA training tests skip
[ -e .devdata/sub/shakespeare.jsonl.xz ] || cp "$DATA/shakespeare.jsonl.xz" .devdata/sub/
du -sh .devdata/hopper .devdata/sub .devdata/min
