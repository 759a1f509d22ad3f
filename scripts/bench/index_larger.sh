#!/usr/bin/env bash
# The 124M index benchmark with a decontaminated index of 4x the text: mix + all of Linux 6.1 (docs/index.md §12).
#
#   bash scripts/bench/index_larger.sh extra WORK           # a machine that reaches Debian's archive
#   bash scripts/bench/index_larger.sh run WORK EXTRA [index_quality.py options...]   # the GPU machine
#
# extra: the Linux 6.1 sources as JSONL (DATA/fetch_code_corpus.sh, about 130 MB of xz), mix + code slice
#   and mix + Linux tokenized with the GPT-2 BPE, the index of the latter decontaminated at 32 against
#   the former's validation documents, and WORK/linux-extra.jsonl.xz: the documents that index holds
#   beyond mix + code slice (scripts/bench/index_extra_docs.py; about 41 MB, small enough to carry to
#   an offline machine). About 25 minutes on 2 cores.
# run: mix + code slice (the benchmark's token folder, WORK/tokens) and mix + code slice + EXTRA tokenized,
#   the larger index built from the latter decontaminated at 32 against WORK/tokens' validation documents,
#   then scripts/bench/index_quality.py with --extra-index linux=WORK/index-big (every model also scored
#   against it). Every finished step is kept, so the same command continues after a stop.
# DATA (default ../shared/data) holds mix.jsonl.xz, code-slice.jsonl.xz, gpt2-bpe/ and fetch_code_corpus.sh.
set -euo pipefail
cmd=${1:?usage: index_larger.sh extra WORK | run WORK EXTRA [options]}
WORK=${2:?usage: index_larger.sh extra WORK | run WORK EXTRA [options]}
DATA=${DATA:-../shared/data}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
tokenize() {  # tokenize OUT FILE...: once
  local out=$1; shift
  [ -f "$out/manifest.json" ] || "$PY" -m tscale tokenize "$@" --tokenizer "$DATA/gpt2-bpe" -o "$out"
}
index() {  # index TOKENS OUT AGAINST: once, decontaminated at 32 against AGAINST's validation documents
  [ -f "$2/manifest.json" ] || "$PY" -m tscale build-index "$1" -o "$2" --decontaminate 32 --decontaminate-against "$3"
}
case $cmd in
  extra)
    BPE_DIR="$DATA/gpt2-bpe" bash "$DATA/fetch_code_corpus.sh" "$WORK/corpus"
    tokenize "$WORK/tokens" "$DATA/mix.jsonl.xz" "$DATA/code-slice.jsonl.xz"
    tokenize "$WORK/tokens-mixlinux" "$DATA/mix.jsonl.xz" "$WORK/corpus/code.jsonl.xz"
    index "$WORK/tokens-mixlinux" "$WORK/index-mixlinux" "$WORK/tokens"
    [ -f "$WORK/linux-extra.jsonl.xz" ] || "$PY" scripts/bench/index_extra_docs.py "$WORK/index-mixlinux" \
      "$DATA/mix.jsonl.xz" "$WORK/corpus/code.jsonl.xz" --minus "$DATA/mix.jsonl.xz" "$DATA/code-slice.jsonl.xz" \
      -o "$WORK/linux-extra.jsonl.xz"
    ;;
  run)
    EXTRA=${3:?usage: index_larger.sh run WORK EXTRA [options]}
    shift 3
    tokenize "$WORK/tokens" "$DATA/mix.jsonl.xz" "$DATA/code-slice.jsonl.xz"
    tokenize "$WORK/tokens-big" "$DATA/mix.jsonl.xz" "$DATA/code-slice.jsonl.xz" "$EXTRA"
    index "$WORK/tokens-big" "$WORK/index-big" "$WORK/tokens"
    "$PY" scripts/bench/index_quality.py "$WORK/tokens" --train-tokens 49152000 --decontaminate 32 \
      --work "$WORK/iq" --extra-index "linux=$WORK/index-big" "$@"
    ;;
  *) echo "index_larger.sh: unknown command '$cmd' (extra or run)" >&2; exit 2 ;;
esac
