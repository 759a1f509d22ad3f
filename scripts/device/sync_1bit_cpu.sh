#!/usr/bin/env bash
# Issue 5's 1 Gbit/s benchmark on a GPU machine's CPUs, where each emulated host gets cores of its own.
#
#   bash scripts/device/sync_1bit_cpu.sh CORPUS TOKENIZER_JSON OUT_DIR    (repository root, extension built, root)
#
# CORPUS: ../shared/data/mix.jsonl.xz; TOKENIZER_JSON: the BPE-8192 tokenizer of the CPU runs
# (docs/BENCHMARKS.md), so the model and its 49.6M parameters are the same. Tokenizes, then runs
# `sync_1bit.py --skip-quality` (speed only: quality does not depend on the machine) with its
# record written under OUT_DIR, not over docs/bench/sync_1bit.json, whose quality part stays.
# Each process gets cores / processes / 2 intra-op threads (sync_1bit.py --threads). Where network
# namespaces cannot be made, it tries again inside a user namespace (unshare -Urnm); it stops, saying
# why, where that fails too or tc is missing; a machine without iproute2 can use the one
# scripts/device/bundle_iproute2.sh carries (its bin/ first on PATH). S1B_REPEATS: runs of each
# mode per world size (default 2).
set -u
CORPUS=${1:?usage: sync_1bit_cpu.sh CORPUS TOKENIZER_JSON OUT_DIR}
TOKENIZER=${2:?usage: sync_1bit_cpu.sh CORPUS TOKENIZER_JSON OUT_DIR}
OUT=${3:?usage: sync_1bit_cpu.sh CORPUS TOKENIZER_JSON OUT_DIR}
mkdir -p "$OUT"
for tool in ip tc; do
  command -v "$tool" > /dev/null || { echo "sync_1bit_cpu: no '$tool' on this machine; the benchmark needs iproute2"; exit 3; }
done
if ! ip netns add ts1b-probe 2> "$OUT/netns-probe.log"; then
  # Without the privilege to make network namespaces, a user namespace may still grant it inside itself
  # (unshare -U maps this user to root there; -n, -m: its own network and mounts, a tmpfs /run for ip netns).
  if [ -z "${S1B_IN_USERNS:-}" ] && command -v unshare > /dev/null && unshare -Urnm true 2> /dev/null; then
    echo "sync_1bit_cpu: no network namespaces here ($(head -1 "$OUT/netns-probe.log")); again inside a user namespace"
    exec unshare -Urnm env S1B_IN_USERNS=1 bash -c 'mount -t tmpfs tmpfs /run && exec bash "$0" "$@"' "$0" "$@"
  fi
  echo "sync_1bit_cpu: cannot create a network namespace here: $(head -1 "$OUT/netns-probe.log")"; exit 3
fi
ip netns delete ts1b-probe
echo "cores: $(nproc)"
if [ -f .cache/mix-bpe8192/manifest.json ]; then
  echo "tokens: reusing .cache/mix-bpe8192"
else
  python3 -m tscale tokenize "$CORPUS" --tokenizer "$TOKENIZER" -o .cache/mix-bpe8192 -q || exit 1
fi
python3 scripts/bench/sync_1bit.py --tokens .cache/mix-bpe8192 --worlds 2 4 --repeats "${S1B_REPEATS:-2}" --skip-quality \
  --out-dir "$OUT" --raw "$OUT/sync1bit-raw.json"
