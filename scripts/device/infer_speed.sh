#!/usr/bin/env bash
# Generation speed per `--precision` mode of a 124M gpt2 checkpoint on this GPU, after a script that built the tree.
#
#   bash scripts/device/infer_speed.sh OUT_DIR [SECONDS]     (repository root, on the GPU machine, extension built)
#
# Makes the checkpoint from one training step on .devdata/small (carried: Shakespeare and the GPT-2 BPE; speed does
# not depend on the weights' values), then
# runs scripts/bench/infer_speed.py on it (OUT_DIR/lowprec.json, OUT_DIR/infer_speed.log) and times the weight-only
# int8 product both ways at the model's decode shapes: the cast weight's product then the scales (QuantizedLinear),
# and torch's _weight_int8pack_mm (OUT_DIR/int8pack.log).
set -u
OUT=${1:?usage: infer_speed.sh OUT_DIR [SECONDS]}
source scripts/device/deadline.sh "${2:-240}"
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
tokens=/tmp/gen-tokens
[ -f $tokens/manifest.json ] || timeout "$(left)" python3 -m tscale tokenize .devdata/small/shakespeare.jsonl.xz \
  --tokenizer .devdata/small/gpt2-bpe -o $tokens --quiet > "$OUT/tokenize.log" 2>&1 || { tail -3 "$OUT/tokenize.log"; exit 1; }
rm -rf /tmp/gen-124m
timeout "$(left)" python3 -m tscale train configs/gpt2-124m.toml --tokens $tokens -o /tmp/gen-124m \
  --set train.steps=1 --set train.batch_size=1 --set train.compile=false --set train.eval_batches=1 \
  > "$OUT/train.log" 2>&1 || { tail -5 "$OUT/train.log"; exit 1; }
timeout "$(left)" python3 scripts/bench/infer_speed.py /tmp/gen-124m --label "${LABEL:-gpu_124m}" --out-dir "$OUT" \
  2>&1 | tee "$OUT/infer_speed.log" | tail -7
timeout "$(left)" python3 - > "$OUT/int8pack.log" 2>&1 <<'PY'
import torch, torch.nn.functional as F
dt = torch.bfloat16
for m in (1, 64):
    for n, k in ((2304, 768), (3072, 768), (768, 3072)):
        x = torch.randn(m, k, device="cuda", dtype=dt)
        q = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
        s = torch.rand(n, device="cuda", dtype=dt) / 127
        w = (q.to(dt) * s[:, None]).contiguous()
        forms = {"bf16": lambda: F.linear(x, w), "cast_then_scale": lambda: F.linear(x, q.to(dt)) * s,
                 "int8pack": lambda: torch.ops.aten._weight_int8pack_mm(x, q, s)}
        row = []
        for name, f in forms.items():
            try:
                for _ in range(10):
                    f()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(200):
                    f()
                b.record()
                torch.cuda.synchronize()
                row.append(f"{name} {a.elapsed_time(b) / 200 * 1e3:.1f} us")
            except Exception as e:  # an op without a CUDA kernel in this torch
                row.append(f"{name} unavailable ({type(e).__name__})")
        print(m, n, k, " | ".join(row), flush=True)
PY
cat "$OUT/int8pack.log"
