"""Training throughput of `tscale train` (gpt2 architecture, GPT-2 124M) vs a plain PyTorch GPT-2.

Both run in this process on the same GPU with the same batch: bf16 autocast, SDPA attention,
fused AdamW, torch.compile. Ours is the real training loop (tscale.train.loop.train_run) on a
token folder of random ids, read through the real loader; its tokens/s comes from its own
metrics.jsonl, after the compile warm-up. The baseline is a minimal GPT-2 written below,
fed random ids made on the GPU, timed with CUDA events after its warm-up.

Run: python scripts/bench/train_throughput.py [--batch-size 32] [--steps 60] [--tokens DIR]
Writes docs/bench/train_throughput.json (metrics tokens_per_s, baseline_tokens_per_s, ratio, mfu).
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_record  # noqa: E402

from tscale.config import load_config  # noqa: E402
from tscale.data.shards import TOKENS_FORMAT, TOKENS_VERSION, ShardWriter, token_dtype  # noqa: E402
from tscale.devices import peak_flops  # noqa: E402
from tscale.manifest import write_manifest  # noqa: E402
from tscale.train.loop import train_run  # noqa: E402

VOCAB = 50257


class PlainBlock(nn.Module):
    def __init__(self, c: int, h: int):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, 2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class PlainGPT2(nn.Module):
    def __init__(self, n_layer=12, n_head=12, c=768, seq_len=1024, vocab=50304):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(seq_len, c)
        self.blocks = nn.ModuleList(PlainBlock(c, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab, bias=False)
        self.head.weight = self.wte.weight
        for p in self.parameters():
            nn.init.normal_(p, std=0.02) if p.dim() == 2 else None

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def baseline_tokens_per_s(batch: int, seq_len: int, steps: int, warmup: int) -> float:
    model = PlainGPT2(seq_len=seq_len).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = torch.compile(model)
    data = [torch.randint(0, VOCAB, (batch, seq_len + 1), device="cuda") for _ in range(8)]

    def step(i):
        d = data[i % len(data)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(d[:, :-1], d[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(steps):
        step(i)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    return batch * seq_len * steps / seconds


def random_token_folder(path: Path, n_tokens: int) -> Path:
    """A token folder of uniformly random GPT-2 ids (throughput does not depend on the text)."""
    path.mkdir(parents=True)
    dtype = token_dtype(VOCAB)
    rng = np.random.default_rng(0)
    writers = {}
    for split, n in (("train", n_tokens), ("val", n_tokens // 50)):
        w = writers[split] = ShardWriter(path, split, dtype, shard_tokens=1 << 27)
        for _ in range(0, n, 4096):
            w.add(rng.integers(0, VOCAB - 1, 4096, dtype=np.int64), source=0, text_bytes=4096 * 4)
    splits = {s: w.close() for s, w in writers.items()}
    (path / "tokenizer.json").write_text("{}")
    write_manifest(path, TOKENS_FORMAT, TOKENS_VERSION, [f for w in writers.values() for f in w.files()] + ["tokenizer.json"],
                   vocab_size=VOCAB, eos_id=VOCAB - 1, dtype=dtype.str, tokenizer="tokenizer.json",
                   sources=["random"], splits=splits)
    return path


def ours_tokens_per_s(tokens: Path, batch: int, seq_len: int, steps: int, warmup: int) -> tuple[float, dict]:
    log_every = 10
    cfg = load_config(REPO / "configs" / "gpt2-124m.toml", [
        f"train.steps={warmup + steps}", f"train.batch_size={batch}", f"model.seq_len={seq_len}",
        "train.eval_every=0", "train.ckpt_every=0", f"train.log_every={log_every}", "train.compile=true",
        f'data.tokens="{tokens}"'])
    with tempfile.TemporaryDirectory() as run:
        train_run(cfg, Path(run) / "run", quiet=True)
        records = [json.loads(line) for line in (Path(run) / "run" / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if "tokens_per_s" in r and r["step"] > warmup]
    tps = len(timed) / sum(1 / r["tokens_per_s"] for r in timed)  # harmonic mean = total tokens / total time
    return tps, timed[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--tokens", type=Path, help="token folder to train on (default: random ids)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("train_throughput: needs a CUDA GPU")

    with tempfile.TemporaryDirectory() as tmp:
        tokens = args.tokens or random_token_folder(Path(tmp) / "tokens", (args.steps + args.warmup + 5) * args.batch_size * (args.seq_len + 1))
        ours, last = ours_tokens_per_s(tokens, args.batch_size, args.seq_len, args.steps, args.warmup)
    print(f"ours: {ours:,.0f} tokens/s", flush=True)
    base = baseline_tokens_per_s(args.batch_size, args.seq_len, args.steps, args.warmup)

    from tscale.config import ModelConfig
    from tscale.model import build_model

    model = build_model(ModelConfig(vocab_size=VOCAB, seq_len=args.seq_len))
    flops_tok = model.flops_per_token(args.seq_len)
    peak = peak_flops(torch.device("cuda"))
    metrics = {
        "tokens_per_s": round(ours), "baseline_tokens_per_s": round(base), "ratio": round(ours / base, 3),
        "mfu": round(ours * flops_tok / peak, 4) if peak else None,
        "baseline_mfu": round(base * flops_tok / peak, 4) if peak else None,
        "params": sum(p.numel() for p in model.parameters()), "batch_size": args.batch_size, "seq_len": args.seq_len,
        "peak_mem_gb": round(last["mem_gb"], 2),
    }
    note = (f"gpt2 124M, B={args.batch_size} T={args.seq_len}, bf16 autocast + compile + fused AdamW, "
            f"{args.steps} timed steps after {args.warmup} warm-up; MFU = (6N + 12LCT) x tok/s / dense bf16 peak "
            f"({peak and peak / 1e12:.0f} TFLOP/s)")
    path = write_record("train_throughput", metrics, note, args.out_dir)
    print(f"| ours | {ours:,.0f} tok/s | baseline | {base:,.0f} tok/s | ratio {ours / base:.3f} | MFU {metrics['mfu']} |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
