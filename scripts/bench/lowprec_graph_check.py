"""Gradients of a low-precision gpt2 step replayed as CUDA graphs against the same step run eagerly, and both timed.

    python scripts/bench/lowprec_graph_check.py [--size 124m] [--recipes int8_rowwise int8_rowwise_bwd] [--replays 20]

For each recipe: the model of lowprec_train.py's size (random weights, a fixed batch of random
ids) computes loss and gradients (1) eagerly, (2) through torch.compile in reduce-overhead mode,
the call repeated until the graph is recorded and replayed. Printed per recipe: the largest
relative difference between the replayed and the eager gradients over all parameters (the
low-precision products are the same kernels in both, so it should be of the order of bf16
rounding), and the milliseconds of one eager and one replayed forward + backward, timed with
CUDA events. A replay that skipped work shows as stale gradients here and as an impossible rate
in lowprec_train.py speed.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO  # noqa: E402
from lowprec_train import RECIPES, SIZES, recipe_sets  # noqa: E402

import torch  # noqa: E402

from tscale.config import load_config  # noqa: E402
from tscale.model import build_model  # noqa: E402
from tscale.model.loss import mean_loss  # noqa: E402
from tscale.precision import convert_linears_as_configured  # noqa: E402


def grads_and_ms(model, fn, x, y, calls: int) -> tuple[list[torch.Tensor], float]:
    """Gradients after `calls` forward + backward passes of fn, and the milliseconds of the last calls // 2."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    timed = max(1, calls // 2)
    for i in range(calls):
        if i == calls - timed:
            start.record()
        model.zero_grad(set_to_none=True)
        torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(x, y)
        loss.backward()
    end.record()
    torch.cuda.synchronize()
    return [p.grad.detach().float().clone() for p in model.parameters()], start.elapsed_time(end) / timed


def check_recipe(size: str, recipe: str, replays: int) -> None:
    """One recipe's replayed gradients against eager ones, and both times; its model is freed on return."""
    spec = SIZES[size]
    cfg = load_config(REPO / spec["config"], [*spec["sets"], *recipe_sets(recipe)])
    cfg.model.vocab_size, cfg.model.eos_id = 50257, 50256
    torch.manual_seed(0)
    model = build_model(cfg.model).cuda()
    convert_linears_as_configured(model, cfg.precision)
    B, T = cfg.train.batch_size, cfg.model.seq_len
    x = torch.randint(0, 50257, (B, T), device="cuda")  # (B, T)
    y = torch.randint(0, 50257, (B, T), device="cuda")  # (B, T)

    def step(x, y):
        return mean_loss(model(x), y)

    eager, eager_ms = grads_and_ms(model, step, x, y, 6)
    graph, graph_ms = grads_and_ms(model, torch.compile(step, mode="reduce-overhead"), x, y, 6 + replays)
    worst, where = 0.0, ""
    for (name, _), e, g in zip(model.named_parameters(), eager, graph):
        rel = ((g - e).norm() / e.norm().clamp_min(1e-30)).item()
        if rel > worst:
            worst, where = rel, name
    print(f"{size} {recipe}: replayed vs eager gradients, worst relative difference {worst:.3g} ({where}); "
          f"eager {eager_ms:.2f} ms, replayed {graph_ms:.2f} ms per forward + backward "
          f"({B * T / graph_ms * 1e3:,.0f} tokens/s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="124m", choices=list(SIZES))
    ap.add_argument("--recipes", nargs="+", default=["bf16", "int8_rowwise", "int8_rowwise_bwd"], choices=RECIPES)
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("lowprec_graph_check.py: needs a CUDA GPU")
    for recipe in args.recipes:
        check_recipe(args.size, recipe, args.replays)
        torch.compiler.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
