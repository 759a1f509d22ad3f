"""tscale.eval: val loss / bits per byte against a direct computation, unigram baseline, plots, `tscale eval`."""

import json
import math
import shutil
from functools import partial

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers_cli import assert_one_line_error
from helpers_ckpt import make_checkpoint, make_token_folder, make_tokenizer, random_docs

from tscale.cli.main import main
from tscale.data.shards import TokenFolder
from tscale.eval import evaluate, plot_curves, unigram_log_probs, windows
from tscale.model.loss import token_losses
from tscale.train.checkpoint import load_model

one_line_error = partial(assert_one_line_error, command="eval")

SEQ_LEN = 16
SOURCES = ["news", "code", "empty-source"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(run dir, checkpoint, token folder): val split in several shards, two sources with val docs."""
    root = tmp_path_factory.mktemp("eval")
    tok = make_tokenizer(root / "tok")
    ckpt = make_checkpoint(root / "run", tok, seq_len=SEQ_LEN, step=7)
    rng = np.random.default_rng(0)
    from tscale.data.tokenizer import eos_id, load_tokenizer, vocab_size

    t = load_tokenizer(tok)
    vocab, eos = vocab_size(t), eos_id(t)
    splits = {"train": random_docs(rng, 30, 2, vocab, eos), "val": random_docs(rng, 12, 2, vocab, eos)}
    folder = make_token_folder(root / "tokens", tok, splits, SOURCES, shard_tokens=70)
    return root / "run", ckpt, folder


def direct(model, folder: TokenFolder):
    """Straightforward loop: every window alone, every target's source looked up doc by doc."""
    nats = {}
    count = {}
    with torch.no_grad():
        for shard in folder.shards("val"):
            toks = np.asarray(shard.tokens, dtype=np.int64)
            for s, e in windows(len(toks), SEQ_LEN):
                w = torch.from_numpy(toks[s:e])[None]
                losses = token_losses(model(w[:, :-1]), w[:, 1:].contiguous())[0].double().numpy()
                for j, loss in enumerate(losses):
                    pos = s + 1 + j
                    d = max(i for i in range(len(shard.docs)) if shard.docs[i, 0] <= pos)
                    src = folder.sources[int(shard.docs[d, 1])]
                    nats[src] = nats.get(src, 0.0) + loss
                    count[src] = count.get(src, 0) + 1
    return nats, count


def test_windows_cover_every_token_but_the_first():
    for n in (1, 2, 16, 17, 18, 40):
        covered = [p for s, e in windows(n, SEQ_LEN) for p in range(s + 1, e)]
        assert covered == list(range(1, n))
        assert all(e - s <= SEQ_LEN + 1 for s, e in windows(n, SEQ_LEN))


def test_val_loss_matches_direct_computation(setup):
    _, ckpt, folder_path = setup
    folder = TokenFolder(folder_path)
    assert len(folder.shards("val")) >= 3
    model, _ = load_model(ckpt, "cpu")
    r = evaluate(model, folder, "cpu", batch_size=3)
    nats, count = direct(model, folder)
    total = sum(len(s.tokens) - 1 for s in folder.shards("val"))
    assert r["val_tokens"] == total == sum(count.values())
    assert sum(s["tokens"] for s in r["by_source"].values()) == total
    assert set(r["by_source"]) == {"news", "code"}
    for src, s in r["by_source"].items():
        assert s["tokens"] == count[src]
        assert s["loss"] == pytest.approx(nats[src] / count[src], rel=1e-5)
        assert s["perplexity"] == pytest.approx(math.exp(s["loss"]))
    assert r["val_loss"] == pytest.approx(sum(nats.values()) / total, rel=1e-5)
    # bits per byte: total nats / ln 2 / all text bytes of the val docs
    val_bytes = folder.manifest["splits"]["val"]["text_bytes"]
    assert r["bits_per_byte"] == pytest.approx(sum(nats.values()) / math.log(2) / val_bytes, rel=1e-5)
    for i, src in enumerate(SOURCES[:2]):
        src_bytes = sum(int(d[2]) for sh in folder.shards("val") for d in sh.docs if d[1] == i)
        assert r["by_source"][src]["bits_per_byte"] == pytest.approx(nats[src] / math.log(2) / src_bytes, rel=1e-5)
    # batch size changes nothing
    assert evaluate(model, folder, "cpu", batch_size=1)["val_loss"] == pytest.approx(r["val_loss"], rel=1e-6)


def test_unigram_loss_equals_numpy(setup):
    _, ckpt, folder_path = setup
    folder = TokenFolder(folder_path)
    V = folder.vocab_size
    train = np.concatenate([np.asarray(s.tokens, dtype=np.int64) for s in folder.shards("train")])
    counts = np.bincount(train, minlength=V)
    p = (counts + 1) / (len(train) + V)
    targets = np.concatenate([np.asarray(s.tokens[1:], dtype=np.int64) for s in folder.shards("val")])
    want = float(np.mean(-np.log(p[targets])))
    assert np.allclose(np.exp(unigram_log_probs(folder)), p)
    model, _ = load_model(ckpt, "cpu")
    assert evaluate(model, folder, "cpu")["unigram_loss"] == pytest.approx(want, rel=1e-9)


def test_max_tokens_limits_the_scored_tokens(setup):
    _, ckpt, folder_path = setup
    model, _ = load_model(ckpt, "cpu")
    r = evaluate(model, TokenFolder(folder_path), "cpu", batch_size=2, max_tokens=23)
    assert r["val_tokens"] == 23 == sum(s["tokens"] for s in r["by_source"].values())
    assert 0 < r["text_bytes"] < TokenFolder(folder_path).manifest["splits"]["val"]["text_bytes"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_eval_writes_json_table_and_plot(setup, tmp_path):
    run, ckpt, folder = setup
    metrics = [{"step": s, "loss": 6.0 - s / 10, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 100.0} for s in range(1, 8)]
    metrics[4]["val_loss"] = 5.7
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    png = tmp_path / "curves.png"
    r = invoke("eval", run, "--tokens", folder, "--plot", png, "--device", "cpu", "--batch-size", 4)
    assert r.exit_code == 0, r.output
    out = json.loads((run / "eval.json").read_text())
    for key in ("checkpoint", "step", "tokens_dir", "val_tokens", "val_loss", "perplexity", "bits_per_byte",
                "unigram_loss", "by_source"):
        assert key in out
    assert out["step"] == 7 and out["checkpoint"] == str(ckpt)
    assert set(out["by_source"]["news"]) == {"tokens", "loss", "perplexity", "bits_per_byte"}
    assert "unigram" in r.stdout and "news" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a checkpoint folder as CKPT also finds the run folder; --out elsewhere
    r = invoke("eval", ckpt, "--tokens", folder, "--out", tmp_path / "e.json", "--max-tokens", 10, "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "e.json").read_text())["val_tokens"] == 10


def test_plot_tolerates_torn_last_line(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text('{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.5, "val_loss": 2.7}\n{"step": 3, "lo')
    png = plot_curves(m, tmp_path / "p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_eval_errors(setup, tmp_path):
    run, ckpt, folder = setup
    one_line_error(invoke("eval", tmp_path / "nope", "--tokens", folder), "nope")
    one_line_error(invoke("eval", ckpt, "--tokens", tmp_path / "no-tokens"), "no-tokens")
    # a token folder made with another tokenizer
    other_tok = make_tokenizer(tmp_path / "other", texts=["completely different words here, zebra quartz"])
    other = make_token_folder(tmp_path / "other-tokens", other_tok, {"val": [(0, [5, 6, 7], 3)]}, ["x"])
    one_line_error(invoke("eval", ckpt, "--tokens", other, "--out", tmp_path / "e.json"), "tokenizer")
    # no val tokens
    tok = ckpt / "tokenizer.json"
    no_val = make_token_folder(tmp_path / "no-val", tok, {"train": [(0, [5, 6, 7], 3)]}, ["x"])
    one_line_error(invoke("eval", ckpt, "--tokens", no_val, "--out", tmp_path / "e.json"), "no val tokens")
    # --plot without metrics / outside a run folder
    bare = tmp_path / "bare-ckpt"
    shutil.copytree(ckpt, bare)
    one_line_error(invoke("eval", bare, "--tokens", folder, "--plot", tmp_path / "p.png"), "run folder")
    assert not (tmp_path / "e.json").exists()


def test_eval_and_infer_on_a_tokenized_corpus(tiny_corpus, tmp_path, run_cli):
    """The real `tscale tokenize` output feeds eval; the checkpoint's tokenizer is the folder's."""
    tokens = tmp_path / "tokens"
    code, out = run_cli("tokenize", tiny_corpus, "--out", tokens, "--vocab-size", 300, "--val-modulus", 3, "-q")
    assert code == 0, out
    ckpt = make_checkpoint(tmp_path / "run", tokens / "tokenizer.json", seq_len=SEQ_LEN)
    code, out = run_cli("eval", ckpt, "--tokens", tokens, "--device", "cpu", "--max-tokens", 200)
    assert code == 0, out
    r = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert r["val_tokens"] == 200 and r["bits_per_byte"] > 0
    assert set(r["by_source"]) <= set(TokenFolder(tokens).sources)
    code, out = run_cli("infer", tmp_path / "run", "--prompt", "The ferry", "--max-new-tokens", 5, "--device", "cpu")
    assert code == 0, out
