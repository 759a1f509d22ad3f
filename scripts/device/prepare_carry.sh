#!/usr/bin/env bash
# Make the git-ignored folders an offline GPU machine's runs carry: .whl/ and .devdata/data/.
#
#   bash scripts/device/prepare_carry.sh [DATA_DIR]      (repository root; DATA_DIR default ../shared/data)
#
# .whl/: pydantic and its compiled core as wheels for the GPU machine's Python (PYTHON_VERSION, default
# 3.12, manylinux x86_64), which it lacks, and CUTLASS's headers (scripts/device/cutlass_headers.sh);
# setup_env.sh installs and unpacks them. .devdata/data/: mix.jsonl.xz, code-slice.jsonl.xz and gpt2-bpe/
# from DATA_DIR, the benchmark corpus (DESIGN.md, "Measuring"). Folders already there are kept. Carry them
# with run's `carry` (".whl", ".devdata/data": about 60 MB together, under the 64 MiB a call allows).
set -euo pipefail
DATA=${1:-../shared/data}
PY=${PYTHON_VERSION:-3.12}
mkdir -p .whl .devdata/data
if ! compgen -G ".whl/pydantic_core-*.whl" > /dev/null; then
  python3 -m pip download -q --only-binary=:all: --python-version "$PY" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --implementation cp -d .whl pydantic pydantic-core annotated-types typing-inspection
  rm -f .whl/typing_extensions-*.whl  # torch brings its own
fi
compgen -G ".whl/cutlass-*-headers.tar.xz" > /dev/null || bash scripts/device/cutlass_headers.sh
for f in mix.jsonl.xz code-slice.jsonl.xz gpt2-bpe; do
  [ -e ".devdata/data/$f" ] || cp -r "$DATA/$f" .devdata/data/
done
du -sh .whl .devdata/data
