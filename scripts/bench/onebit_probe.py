"""Probe of 1-bit Adam on CPU: 2 Gloo processes, the largest per-step move of every parameter in units of lr.

    python scripts/bench/onebit_probe.py VARIANT OUT [--set-style overrides...]

VARIANT: "none" (fp32 allreduce), "onebit" (the 1-bit Adam of tscale/dist/onebit.py), "exact"
(the same frozen-variance step with the momentum averaged exactly, no sign code), "old" (1-bit
with the rule before the fix: m exchanged, no clamp; docs/distributed.md, "Why 1-bit Adam
diverged"). Writes the run to OUT and, per step, OUT.opt.jsonl: for each parameter shape the
largest |change| / lr, for the embedding the row that moved most and how many rows moved more
than 10 lr, and, for the first two frozen steps, where each tensor's largest move was and its
sqrt(v) relative to the tensor's median. The reproduction in the docs:

    python scripts/bench/onebit_probe.py old /tmp/p-old 'model.arch="gpt2"' model.n_layer=2 \\
      model.d_model=64 model.n_head=2 model.seq_len=64 train.batch_size=8 'data.tokens="TOKENS"' \\
      train.steps=150 optim.warmup_steps=10 optim.lr=1e-3 train.eval_every=150 train.eval_batches=10 \\
      train.ckpt_every=0 train.log_every=5 dist.onebit_warmup_steps=30
"""

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _old_rule(A, O) -> None:
    """Put back the exchange of m with no clamp (the code before the fix), for comparison."""

    def fold(optimizer, bucket):
        beta1 = optimizer.param_groups[0]["betas"][0]
        for p, g in zip(bucket.parameters(), bucket.gradients()):
            g.mul_(1 - beta1)
            m = optimizer.state[p].get("exp_avg")
            if m is not None:
                g.add_(m.view_as(g), alpha=beta1)

    @torch.no_grad()
    def step(self, closure=None):
        if self.freeze_variance_at is None or self.steps_taken() < self.freeze_variance_at:
            return torch.optim.AdamW.step(self, closure)
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            vc = 1 - beta2 ** self.freeze_variance_at
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                st["step"] += 1
                mc = 1 - beta1 ** float(st["step"])
                st["exp_avg"].copy_(p.grad).mul_(st["exp_avg_sq"] > 0)
                denom = (st["exp_avg_sq"] / vc).sqrt_().add_(eps)
                p.mul_(1 - lr * wd)
                p.addcdiv_(st["exp_avg"], denom, value=-lr / mc)

    O._fold_into_momentum = fold
    A.AdamW.step = step


def worker(rank: int, world: int, port: int, variant: str, out: str, overrides: list[str]) -> None:
    import tscale.dist.onebit as O
    import tscale.optim.adamw as A
    from tscale.config import load_config
    from tscale.train.loop import train_run

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if variant == "exact":
        def exact(state, index, buffer):
            dist.all_reduce(buffer)
            return O._done(buffer.div_(state.world))
        O.onebit_mean = exact
    elif variant == "old":
        _old_rule(A, O)
    log = []
    inner = A.AdamW.step

    def step(self, closure=None):
        before = [p.detach().clone() for g in self.param_groups for p in g["params"]]
        result = inner(self, closure)
        lr, t = self.param_groups[0]["lr"], self.steps_taken()
        frozen = self.freeze_variance_at is not None and t > self.freeze_variance_at
        rec = {"step": t, "frozen": frozen}
        params = [p for g in self.param_groups for p in g["params"]]
        for p, b in zip(params, before):
            d = (p.detach() - b).abs()
            key = str(tuple(p.shape))
            rec[key] = max(rec.get(key, 0.0), float(d.max() / lr))
            if p.dim() == 2 and p.shape[0] > 10000:  # the (tied) embedding
                rowmax = d.max(1).values
                rec["wte_row_max"], rec["wte_rows_gt_10lr"] = int(rowmax.argmax()), int((rowmax > 10 * lr).sum())
            if frozen and t <= self.freeze_variance_at + 2:
                sv = self.state[p]["exp_avg_sq"].sqrt().flatten()
                j = int(d.flatten().argmax())
                rec.setdefault("top", []).append(
                    {"shape": key, "index": j, "move_lr": float(d.flatten()[j] / lr),
                     "sqrt_v_vs_median": float(sv[j] / sv.median()),
                     "frac_gt_10lr": float((d.flatten() > 10 * lr).float().mean())})
        log.append(rec)
        return result

    A.AdamW.step = step
    cfg = load_config(None, overrides)
    try:
        train_run(cfg, out, quiet=True)
    except Exception as e:  # a NaN ends the run with a UserError: keep the log
        print(f"rank {rank} {variant}: {type(e).__name__}: {e}", flush=True)
    if rank == 0:
        Path(out + ".opt.jsonl").write_text("\n".join(json.dumps(r) for r in log) + "\n")


def main() -> None:
    variant, out, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    if variant not in ("none", "onebit", "exact", "old"):
        raise SystemExit(f"unknown variant {variant!r}")
    if variant != "none":
        overrides = [*overrides, 'dist.compression="onebit"', 'dist.onebit_what="momentum"']
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, variant, out, overrides), nprocs=2, join=True)


if __name__ == "__main__":
    main()
