#!/usr/bin/env bash
# The 124M index benchmark on one GPU machine, over calls that continue each other (docs/index.md §12-13).
#
#   bash scripts/device/index_runs.sh PART OUT_DIR SECONDS [index_quality.py options...]   (repository root)
#
#   quality  mix + code slice (.devdata/data: mix.jsonl.xz, code-slice.jsonl.xz, gpt2-bpe/) tokenized into
#            .cache/issue6/tokens, then scripts/bench/index_quality.py --train-tokens 49152000 --decontaminate 32
#            with its work in .cache/issue6/iq; the data files are first copied to .cache/issue6/data
#   larger   scripts/bench/index_larger.sh run .cache/issue6 .devdata/extra/linux-extra.jsonl.xz with
#            DATA=.cache/issue6/data: the 4x decontaminated index, then the same index_quality.py run
#            continued with every model also scored against it (so this call needs only .devdata/extra)
#   draft    after quality: scripts/bench/draft_speed.py with the 124M model trained without the index,
#            drafting from the raw index of the same tokens, on the GPU: 16 prompts, 2 rounds, 4 settings
#            (a few minutes); options after SECONDS go to it and override those
# Options after SECONDS go to index_quality.py (e.g. --index-max-len 16); give the same ones to both parts.
# Everything stops SECONDS after the start; finished stages are kept in .cache/issue6 (an ignored folder
# that stays on the machine between calls), so the same command continues where it stopped (a build-index
# stopped mid-way goes on from its finished index and feature batches). The
# extension is built only when it is missing. OUT_DIR gets console.log, index.json (docs/bench/index.json
# as the run left it) and results.tar.gz (the work folder's log and eval records, the setup logs).
set -u -o pipefail
PART=${1:?usage: index_runs.sh PART OUT_DIR SECONDS [options]}
OUT=${2:?usage: index_runs.sh PART OUT_DIR SECONDS [options]}
source scripts/device/deadline.sh "${3:?usage: index_runs.sh PART OUT_DIR SECONDS [options]}"
shift 3
export PYTHONUNBUFFERED=1 TSCALE_NO_CUTLASS=1
WORK=.cache/issue6
mkdir -p "$OUT" "$WORK/logs"
exec > >(tee -a "$OUT/console.log") 2>&1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import torch, pydantic, tscale._C" 2>/dev/null; then  # torch first: it loads libc10
  source scripts/device/setup_env.sh "$WORK/logs" || exit 1
fi
pack() {
  cp docs/bench/index.json "$OUT/index.json"
  tar -czf "$OUT/results.tar.gz" "$WORK/logs" $(compgen -G "$WORK/iq/eval-*.json") $(compgen -G "$WORK/iq/log.txt") \
    $(compgen -G "$WORK/iq/run-*/metrics.jsonl") 2>/dev/null
}
trap pack EXIT
case $PART in
  quality)
    mkdir -p "$WORK/data"
    for f in mix.jsonl.xz code-slice.jsonl.xz gpt2-bpe; do [ -e "$WORK/data/$f" ] || cp -r ".devdata/data/$f" "$WORK/data/"; done
    if [ ! -f "$WORK/tokens/manifest.json" ]; then
      t0=$(date +%s)
      timeout "$(left)" python3 -m tscale tokenize "$WORK/data/mix.jsonl.xz" "$WORK/data/code-slice.jsonl.xz" \
        --tokenizer "$WORK/data/gpt2-bpe" -o "$WORK/tokens" --quiet || exit 1
      echo "tokenized in $(( $(date +%s) - t0 )) s"
    fi
    timeout "$(left)" python3 scripts/bench/index_quality.py "$WORK/tokens" --train-tokens 49152000 \
      --decontaminate 32 --work "$WORK/iq" "$@" ;;
  larger)
    [ -d "$WORK/data" ] || { echo "index_runs.sh larger: $WORK/data missing (run part quality first on this machine)"; exit 2; }
    DATA="$WORK/data" timeout "$(left)" bash scripts/bench/index_larger.sh run "$WORK" \
      .devdata/extra/linux-extra.jsonl.xz "$@" ;;
  draft)
    [ -d "$WORK/iq/run-base/ckpt" ] || { echo "index_runs.sh draft: no $WORK/iq/run-base (run part quality first)"; exit 2; }
    timeout "$(left)" python3 scripts/bench/draft_speed.py "$WORK/iq/run-base" "$WORK/tokens" "$WORK/iq/index-raw" \
      --device cuda --out "$OUT" --prompts 16 --rounds 2 --draft-tokens 8 16 --min-match 4 --dominance 1 4 "$@" ;;
  *) echo "index_runs.sh: unknown part '$PART' (quality, larger or draft)"; exit 2 ;;
esac
