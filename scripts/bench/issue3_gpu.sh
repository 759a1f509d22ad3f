#!/usr/bin/env bash
# Issue 3's measurements ("optimized transformer") in two device calls of at most ~9 minutes each.
#
#   scripts/bench/issue3_gpu.sh 1|1x2|2|screen [--tiny]
#
# Run from the repository root with the package built (on an offline GPU machine: TSCALE_NO_CUTLASS=1 source
# scripts/device/setup_env.sh LOG_DIR; nothing here runs an int8 product, and CUTLASS's kernels triple the
# build, 183 s against 55-65 on an H200 machine). Both parts tokenize the benchmark corpus
# (mix.jsonl.xz + code-slice.jsonl.xz, GPT-2 BPE) into $WORK/tokens unless it is there already.
#   Part 1: gpt2 124M for B = 100M tokens, then tscale 124M until it reaches gpt2's final val loss
#           (convergence + throughput). The compile warm-ups of both models run beside tokenizing.
#   Part 1x2: part 1 on a two-GPU host in one call: gpt2 on GPU 0 and, beside it, tscale on GPU 1 over
#           its whole schedule (the crossing read from its curve); each pinned to its half of the
#           cores, no warm-ups (the report counts each run's first log interval, its compile, at
#           the next interval's rate).
#   Screen: tscale variants one after another (ISSUE3_SCREEN), each stopping when it reaches the final val
#           loss of gpt2's recorded run (docs/bench/architecture.json, same protocol and corpus; gpt2 is not
#           trained again), the first variant's compile warm-up beside tokenizing; a table of where each
#           crossed, in tokens and training seconds, to $OUT/screen.md and screen.json (never docs/bench).
#   Part 2: attention cost of one training step at T = 1024 and 4096 (its compile warm-up runs
#           beside tokenizing), through the default op and through FlashAttention-2
#           (train.attention = "fa2", reported as attention_fa2_*), then the ablation table.
# Each part writes docs/bench/architecture.json (keeping the metrics of the other part found in
# that file: copy part 1's $OUT/architecture.json to docs/bench/ before part 2) and, in part 2,
# docs/bench/ablation.json; results, tables, logs and the runs' metrics go to $OUT as well.
# --tiny: the same on CPU with tiny models, a slice of the corpus and ../shared/data, into
# .cache/issue3-tiny (records in $WORK/bench, docs/bench untouched).
#
# Env: ISSUE3_BUDGET_S  seconds from start by which everything has ended (default 540)
#      ISSUE3_DATA      folder with mix.jsonl.xz, code-slice.jsonl.xz, gpt2-bpe/ (default .devdata)
#      ISSUE3_WORK      work folder, git-ignored (default .cache/issue3)
#      ISSUE3_ABLATION_TOKENS  training tokens per ablation variant (default 12e6)
#      OUT              folder whose files come back from the device (default $WORK/out)
#      ISSUE3_SCREEN    screen: the variants, ';'-separated, each NAME=SETTINGS with SETTINGS space-separated
#                       (e.g. "base=;nosink=model.sink=false;tied=model.tie_embeddings=true")
#      ISSUE3_SEQ_LEN   parts 1, 1x2 and screen: window length of the convergence runs, 32,768 tokens a step kept
#                       (default 1024); another length works in .cache/issue3-T<LEN> and records there, not in
#                       docs/bench, and a screen's target is then the gpt2 run of that work folder (part 1 first)
#      ISSUE3_TSCALE_SET  parts 1 and 1x2: settings of the tscale run, space-separated (e.g. "model.sink=false"),
#                       to measure a variant against gpt2's run; the report names them and goes to $WORK/bench
#                       (and $OUT), not docs/bench
set -euo pipefail

part=${1:?usage: scripts/bench/issue3_gpu.sh 1|2 [--tiny]}
tiny=${2:-}
start=$(date +%s)
budget=${ISSUE3_BUDGET_S:-540}
bench=scripts/bench
if [ "$tiny" = "--tiny" ]; then
  work=${ISSUE3_WORK:-.cache/issue3-tiny}
  data=${ISSUE3_DATA:-../shared/data}
  records=$work/bench
  flags=(--tiny)
  ablation_flags=(--jobs 2 --min-job-s 0)
else
  work=${ISSUE3_WORK:-.cache/issue3}
  data=${ISSUE3_DATA:-.devdata}
  records=docs/bench
  [ -n "${ISSUE3_TSCALE_SET:-}" ] && records=$work/bench  # a variant's record never stands in for the headline's
  flags=()
  if [ -n "${ISSUE3_SEQ_LEN:-}" ] && [ "$ISSUE3_SEQ_LEN" != 1024 ]; then  # nor a record of another length
    work=${ISSUE3_WORK:-.cache/issue3-T$ISSUE3_SEQ_LEN}
    records=$work/bench
  fi
  ablation_flags=(--jobs 7 --min-job-s 150 --tokens-per-run "${ISSUE3_ABLATION_TOKENS:-12e6}")
fi
out=${OUT:-$work/out}
deadline=$((start + budget - 20))  # the last 20 s are for the reports and the copies
mkdir -p "$work/logs" "$out" "$records"
exec > >(tee -a "$out/issue3-part$part.log") 2>&1
tee_pid=$!
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$PWD/$work/inductor
seq_len=(); [ -n "${ISSUE3_SEQ_LEN:-}" ] && seq_len=(--seq-len "$ISSUE3_SEQ_LEN")  # architecture.py's only
common=(--work "$work" --deadline "$deadline" "${flags[@]}" "${seq_len[@]}")
# as_tscale_sets "KEY=VALUE ...": the array sets=(--tscale-set KEY=VALUE ...), one per space-separated setting
as_tscale_sets() { sets=(); local setting; for setting in $1; do sets+=(--tscale-set "$setting"); done; }
as_tscale_sets "${ISSUE3_TSCALE_SET:-}"
variant=("${sets[@]}")
report=(--work "$work" --out-dir "$records" "${flags[@]}" "${seq_len[@]}")

say() { echo "[issue3 part $part +$(( $(date +%s) - start ))s] $*"; }
left() { echo $(( deadline - $(date +%s) )); }
# A step that must end by the deadline: SIGTERM then (the loop checkpoints and returns), SIGKILL 20 s later.
bounded() {
  local l; l=$(left)
  if [ "$l" -lt 10 ]; then say "no time left for: $*"; return 1; fi
  timeout -k 20 "$l" "$@"
}

tokenize() {
  if [ -f "$work/tokens/manifest.json" ]; then say "tokens: reusing $work/tokens"; return; fi
  rm -rf "$work/tokens"
  local inputs=("$data/mix.jsonl.xz" "$data/code-slice.jsonl.xz")
  if [ "$tiny" = "--tiny" ]; then
    python $bench/corpus_slice.py "${inputs[@]}" -o "$work/slice.jsonl.xz" --chars 1500000
    inputs=("$work/slice.jsonl.xz")
  fi
  say "tokenize ${inputs[*]}"
  bounded python -m tscale tokenize "${inputs[@]}" --tokenizer "$data/gpt2-bpe" -o "$work/tokens" -q
  say "tokenized"
}

collect() {  # results, tables and run metrics to $OUT (at most 8 files come back)
  cp "$records/architecture.json" "$out/" 2>/dev/null || true
  [ "$part" = 2 ] && cp "$records/ablation.json" "$out/" 2>/dev/null || true
  (cd "$work" && tar czf - --ignore-failed-read results.json ablation/results.json ablation/logs logs \
     runs/*/metrics.jsonl runs/*/config.toml ablation/runs/*/metrics.jsonl ablation/runs/*/config.toml \
     2>/dev/null) > "$out/issue3-part$part-runs.tar.gz" || true
  say "done; files in $out: $(ls "$out" | tr '\n' ' ')"
  exec >&- 2>&-  # let tee write the end of the log before the call returns
  wait "$tee_pid" 2>/dev/null || true
}
trap collect EXIT

if [ "$part" = 1 ]; then
  say "warm-ups of gpt2 and tscale (compile on random ids) beside tokenizing"
  TORCHINDUCTOR_COMPILE_THREADS=4 python $bench/architecture.py warmup --arch gpt2 "${common[@]}" \
    > "$work/logs/warm-gpt2.log" 2>&1 & warm_gpt2=$!
  TORCHINDUCTOR_COMPILE_THREADS=4 python $bench/architecture.py warmup --arch tscale "${common[@]}" "${variant[@]}" \
    > "$work/logs/warm-tscale.log" 2>&1 & warm_tscale=$!
  tokenize
  # Nothing should compile while a measured run trains: wait for the warm-ups, but at most until
  # +150 s (a late one keeps running: its GPU use is a few steps; its cache entries still help).
  for pid in $warm_gpt2 $warm_tscale; do
    while kill -0 "$pid" 2>/dev/null && [ $(( $(date +%s) - start )) -lt 150 ]; do sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then say "warm-up $pid still running at +150 s: not waiting for it"
    else wait "$pid" || say "warm-up $pid failed (see $work/logs/warm-*.log): its run compiles cold"; fi
  done
  tail -n 1 "$work"/logs/warm-*.log || true
  say "gpt2 convergence run"
  bounded python $bench/architecture.py convergence --arch gpt2 "${common[@]}" || say "gpt2 run failed"
  say "tscale convergence run"
  bounded python $bench/architecture.py convergence --arch tscale "${common[@]}" "${variant[@]}" \
    || say "tscale run failed"
  python $bench/architecture.py report "${report[@]}" | tee "$out/architecture.md"
elif [ "$part" = 1x2 ]; then
  tokenize
  source scripts/device/cpu_halves.sh  # PIN0, PIN1
  say "gpt2 (GPU 0) and tscale (GPU 1) convergence runs side by side"
  ( CUDA_VISIBLE_DEVICES=0 bounded "${PIN0[@]}" python $bench/architecture.py convergence --arch gpt2 "${common[@]}" \
      || say "gpt2 run failed" ) & run_gpt2=$!
  ( CUDA_VISIBLE_DEVICES=1 bounded "${PIN1[@]}" python $bench/architecture.py convergence --arch tscale --beside \
      "${common[@]}" "${variant[@]}" || say "tscale run failed" ) & run_tscale=$!
  wait "$run_gpt2" "$run_tscale"  # a bare wait would also wait for the log's tee
  python $bench/architecture.py report "${report[@]}" | tee "$out/architecture.md"
elif [ "$part" = screen ]; then
  IFS=';' read -ra screen <<< "${ISSUE3_SCREEN:?screen: set ISSUE3_SCREEN, e.g. \"base=;nosink=model.sink=false\"}"
  names=()
  for entry in "${screen[@]}"; do
    name=${entry%%=*}
    [[ "$name" =~ ^[A-Za-z0-9_-]+$ && "$entry" == *=* ]] \
      || { echo "issue3_gpu.sh: ISSUE3_SCREEN entry '$entry' must be NAME=SETTINGS (NAME of letters, digits, _ and -)" >&2; exit 2; }
    names+=(--name "screen-$name")
  done
  target=(--target-record docs/bench/architecture.json)
  [ "$tiny" = "--tiny" ] && target=()  # tiny: no recorded target; train gpt2 first, as part 1 does
  as_tscale_sets "${screen[0]#*=}"
  say "warm-up of the first variant beside tokenizing"
  TORCHINDUCTOR_COMPILE_THREADS=8 python $bench/architecture.py warmup --arch tscale "${common[@]}" "${sets[@]}" \
    > "$work/logs/warm-tscale.log" 2>&1 & warm_tscale=$!
  tokenize
  wait "$warm_tscale" || say "warm-up failed (see $work/logs/warm-tscale.log): the first variant compiles cold"
  if [ "$tiny" = "--tiny" ]; then
    bounded python $bench/architecture.py convergence --arch gpt2 "${common[@]}" || say "gpt2 run failed"
  fi
  for entry in "${screen[@]}"; do
    name=${entry%%=*}
    as_tscale_sets "${entry#*=}"
    say "variant $name: ${entry#*=}"
    bounded python $bench/architecture.py convergence --arch tscale --name "screen-$name" "${target[@]}" \
      "${common[@]}" "${sets[@]}" || say "variant $name failed"
  done
  python $bench/architecture.py screen --work "$work" "${target[@]}" "${names[@]}" "${flags[@]}" "${seq_len[@]}" | tee "$out/screen.md"
  cp "$work/screen.json" "$out/" 2>/dev/null || true
elif [ "$part" = 2 ]; then
  say "attention compile warm-up beside tokenizing"
  TORCHINDUCTOR_COMPILE_THREADS=8 python $bench/architecture.py attention --warm "${common[@]}" \
    > "$work/logs/warm-attention.log" 2>&1 & warm_attention=$!
  tokenize
  while kill -0 "$warm_attention" 2>/dev/null && [ $(( $(date +%s) - start )) -lt 180 ]; do sleep 1; done
  if kill -0 "$warm_attention" 2>/dev/null; then kill "$warm_attention"; say "attention warm-up stopped at +180 s"
  else wait "$warm_attention" || say "attention warm-up failed (see $work/logs/warm-attention.log)"; fi
  cat "$work/logs/warm-attention.log" || true
  say "attention cost"
  bounded python $bench/architecture.py attention "${common[@]}" || say "attention benchmark failed"
  say "attention cost through FlashAttention-2 (train.attention = fa2)"
  bounded python $bench/architecture.py attention --attention fa2 "${common[@]}" || say "fa2 attention benchmark failed"
  say "ablation runs"
  bounded python $bench/ablation.py run --work "$work" --deadline "$deadline" "${flags[@]}" "${ablation_flags[@]}" \
    || say "ablation runner failed"
  python $bench/ablation.py report "${report[@]}" | tee "$out/ablation.md"
  python $bench/architecture.py report "${report[@]}" | tee "$out/architecture.md"
else
  echo "issue3_gpu.sh: PART must be 1, 1x2, screen or 2 (got $part)" >&2
  exit 2
fi
say "finished in $(( $(date +%s) - start )) s"
