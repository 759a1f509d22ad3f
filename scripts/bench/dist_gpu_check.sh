#!/usr/bin/env bash
# GPU checks for synchronous training: CUDA bit-packing kernels against their references,
# packing throughput, and `tscale train` under torchrun with NCCL, uncompressed and 1-bit.
#
#   scripts/bench/dist_gpu_check.sh CORPUS TOKENIZER OUT_DIR
#
# Needs 2 GPUs for the NCCL runs (NCCL refuses two ranks on one GPU); with one GPU it runs
# the kernel checks only.
set -euo pipefail
corpus=${1:?corpus}; tokenizer=${2:?tokenizer}; out=${3:?out dir}
python3 -m pytest -q tests/test_ops_bitpack.py ${PYTEST_ARGS:-}
python3 scripts/bench/bitpack_throughput.py --out-dir "$out"
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
[ "$ngpu" -ge 2 ] || { echo "one GPU: skipping the NCCL runs"; exit 0; }
tokens=/tmp/dist-tokens
[ -f $tokens/manifest.json ] || tscale tokenize "$corpus" --tokenizer "$tokenizer" -o $tokens --quiet
common=(--set 'model.arch="gpt2"' --set model.n_layer=8 --set model.d_model=512 --set model.n_head=8
        --set model.seq_len=512 --set train.batch_size=16 --set train.steps=400 --set optim.warmup_steps=40
        --set optim.lr=1e-3 --set train.eval_every=400 --set train.eval_batches=40 --set train.log_every=20
        --set train.compile=true --tokens $tokens --quiet)
for mode in none onebit; do
  torchrun --standalone --nproc-per-node 2 -m tscale train "${common[@]}" \
    --set "dist.compression=\"$mode\"" --set dist.onebit_warmup_steps=80 -o /tmp/dist-$mode
  cp /tmp/dist-$mode/metrics.jsonl "$out/dist-$mode-metrics.jsonl"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for mode in ("none", "onebit"):
    recs = [json.loads(l) for l in open(f"{out}/dist-{mode}-metrics.jsonl")]
    val = [r["val_loss"] for r in recs if "val_loss" in r][-1]
    tps = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r][2:]
    comm = [r for r in recs if "comm_bytes" in r][-1]
    print(f"{mode}: val loss {val:.4f}, median tokens/s {sorted(tps)[len(tps)//2]:,.0f}, "
          f"bytes/step {comm['comm_bytes']:,.0f} of fp32 {comm['comm_bytes_fp32']:,.0f}")
PY
