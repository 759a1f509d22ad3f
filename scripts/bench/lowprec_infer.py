"""Perplexity of one checkpoint in each low-precision inference mode against the checkpoint as trained.

    python scripts/bench/lowprec_infer.py CKPT TOKENS [--max-tokens N] [--device auto] [--label NAME]
                                          [--out-dir docs/bench] [--with-head]

Scores the val split of TOKENS with `tscale eval`'s own function (tscale.eval.evaluate_checkpoint)
once per mode of `--precision`: bf16 (as trained: bf16 autocast on a GPU, fp32 on the CPU), int8-w
and fp8-w (weights only), int8 and fp8 (weights and activations), the same tokens each time; with
--with-head each low-precision mode again with the head converted (mode+head, metric suffix _head).
Merges into docs/bench/lowprec.json (part "inference <label>"): infer_<label>_ppl_<mode> and
infer_<label>_ppl_rel_diff_<mode> = ppl_mode / ppl_bf16 - 1.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402
from precision_modes import metric_key, modes_to_run, precision_of  # noqa: E402

from tscale.devices import resolve_device  # noqa: E402
from tscale.eval.perplexity import evaluate_checkpoint  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", type=Path, help="checkpoint folder, or a run folder for its newest checkpoint")
    ap.add_argument("tokens", type=Path, help="token folder whose val split is scored")
    ap.add_argument("--max-tokens", type=int, help="score at most this many val tokens")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--label", default="ckpt", help="name of this checkpoint in the metric names")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    ap.add_argument("--with-head", action="store_true",
                    help="also score each low-precision mode with the head converted (--quantize-head): mode+head")
    args = ap.parse_args()
    device = resolve_device(args.device)
    metrics, rows = {}, []
    for mode in modes_to_run(with_head=args.with_head):
        t0 = time.time()
        precision, quantize_head = precision_of(mode)
        record = evaluate_checkpoint(args.ckpt, args.tokens, device, max_tokens=args.max_tokens,
                                     precision=precision, quantize_head=quantize_head)
        metrics[f"infer_{args.label}_ppl_{metric_key(mode)}"] = round(record["perplexity"], 4)
        rows.append((mode, record["val_loss"], record["perplexity"], time.time() - t0))
        print(f"{mode:11s} loss {record['val_loss']:.5f}  ppl {record['perplexity']:.3f}  ({time.time() - t0:.0f} s)",
              flush=True)
    base = rows[0][2]
    for mode, _, ppl, _ in rows[1:]:
        metrics[f"infer_{args.label}_ppl_rel_diff_{metric_key(mode)}"] = round(ppl / base - 1, 6)
    note = (f"inference {args.label} (lowprec_infer.py): checkpoint {args.ckpt} (step {record['step']}), val split of "
            f"{args.tokens.name}, {record['val_tokens']:,} tokens, device {device}; perplexity per inference mode "
            f"(the same tokens each), rel_diff = ppl / ppl of bf16 (as trained) - 1")
    print(f"-> {merge_metrics('lowprec', metrics, note, args.out_dir)}")


if __name__ == "__main__":
    main()
