"""The token index inside models: loader features, training with inputs / mixer, eval --index, infer --index."""

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from click.testing import CliRunner
from helpers_cli import assert_one_line_error

from tscale.cli.main import main
from tscale.config import IndexConfig, ModelConfig, load_config
from tscale.data.loader import TrainLoader, WindowFeatures, val_batches
from tscale.data.shards import TokenFolder
from tscale.data.tokenize import tokenize_corpus
from tscale.errors import UserError
from tscale.eval import evaluate_checkpoint
from tscale.index import Index, build_index
from tscale.index.distribution import FeatureLookup
from tscale.index.features import FEATURE_MAX_LEN, StoredFeatures, doc_batches
from tscale.index.mixing import IndexFeatures, IndexMixer, bucket_labels
from tscale.infer import Engine, GenerationParams, SamplingParams
from tscale.infer.draft import DraftStats
from tscale.model import build_model
from tscale.ops.backend import kernels_available
from tscale.train.loop import train_run

pytestmark = pytest.mark.skipif(not kernels_available(), reason="tscale._C not built")

WORDS = ("harbour ferry lemon crate bicycle mail island lighthouse keeper pencil ink fog bay bread letter council road "
         "river quarry bridge winter rain window school cafe quay chair tourist archive box family year name north south "
         "stone salt boat net fish gull tide wind cliff path field sheep wall gate door key lamp oil rope sail mast").split()
SEQ_LEN = 16
TINY = ["model.n_layer=2", "model.n_head=2", "model.d_model=32", f"model.seq_len={SEQ_LEN}", "train.batch_size=4",
        "train.eval_every=0", "train.ckpt_every=0", "train.log_every=1", "optim.warmup_steps=2", "optim.lr=3e-3",
        "model.arch=\"gpt2\""]


def _corpus(path: Path, seed: int = 0) -> Path:
    """Random word documents; every third one also copies a 20-word span of an earlier one (long matches)."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(90):
        w = list(rng.choice(WORDS, int(rng.integers(25, 70))))
        if i > 5 and i % 3 == 0:
            src = docs[int(rng.integers(0, i))].split()
            a = int(rng.integers(0, max(1, len(src) - 20)))
            w[5:5] = src[a:a + 20]
        docs.append(" ".join(w))
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"source": "notes" if i % 2 else "news", "doc": f"d{i}", "text": text}) + "\n")
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Token folder (several shards per split), a raw index with features, a decontaminated one, a raw one without."""
    root = tmp_path_factory.mktemp("index_model")
    tokens = root / "tokens"
    tokenize_corpus([_corpus(root / "c.jsonl")], tokens, vocab_size=300, val_modulus=4, shard_tokens=1500, quiet=True)
    raw = root / "raw"
    build_index(tokens, raw, features=True, quiet=True)
    dec = build_index(tokens, root / "dec", decontaminate=13, quiet=True)
    assert 0 < dec["decontamination"]["dropped_docs"] < TokenFolder(tokens).manifest["splits"]["train"]["docs"]
    build_index(tokens, root / "plain", quiet=True)
    return root, tokens, raw, root / "dec", root / "plain"


def _cfg(tokens, index: Path | None = None, *extra):
    sets = [*TINY, f'data.tokens="{tokens}"']
    if index is not None:
        sets.append(f'index.path="{index}"')
    return load_config(None, [*sets, *extra])


@pytest.fixture(scope="module")
def runs(world):
    """A gpt2 trained with the index's inputs and mixer, and the same model without the index."""
    root, tokens, raw, _, _ = world
    steps = ["train.steps=6", "train.eval_every=3", "train.eval_batches=2"]
    with_index = train_run(_cfg(tokens, raw, "index.inputs=true", "index.mixer=true", *steps), root / "run_index", quiet=True)
    without = train_run(_cfg(tokens, None, *steps), root / "run_base", quiet=True)
    assert with_index.val_loss is not None and without.val_loss is not None
    return root / "run_index", root / "run_base"


def _lookups(index: Index, folder: TokenFolder, split: str, k: int, topk: int):
    """Fresh lookups of a whole shard, leave-one-out for training shards, as the features are made."""
    shard = folder.shards(split)[k]
    own = index.doc_ranges() if split == "train" else None
    parts = [index.lookup(shard.tokens[s:e], excl, max_len=FEATURE_MAX_LEN, topk=topk) for s, e, excl in
             doc_batches(shard, k, own)]
    return [np.concatenate(p) for p in zip(*parts)]


def test_loader_features_are_the_windows_lookups(world):
    _, tokens, raw, _, _ = world
    folder = TokenFolder(tokens)
    index = Index(raw)
    stored = StoredFeatures(raw, folder, topk=3)
    train = WindowFeatures(stored.shards("train"), 3, stored.none_token)
    loader = TrainLoader(folder, SEQ_LEN, batch_size=8, seed=5, features=train)
    picked = loader._order[:8]
    x, y, feats = loader.next_batch()
    assert feats.match_len.shape == x.shape and feats.next_tokens.shape == (*x.shape, 3) == feats.counts.shape
    fresh = {}
    for row, w in enumerate(picked):
        k, start = (int(v) for v in loader.windows[w])
        if k not in fresh:
            fresh[k] = _lookups(index, folder, "train", k, 3)
        lens, nxt, cnt = (a[start:start + SEQ_LEN] for a in fresh[k])
        assert np.array_equal(x[row].numpy(), folder.shards("train")[k].tokens[start:start + SEQ_LEN])
        assert np.array_equal(feats.match_len[row].numpy(), lens)
        assert np.array_equal(feats.next_tokens[row].numpy(), nxt)
        assert np.array_equal(feats.counts[row].numpy(), cnt)
    assert (feats.match_len > 0).float().mean() > 0.5
    val = WindowFeatures(stored.shards("val"), 3, stored.none_token)
    x, y, feats = next(val_batches(folder, SEQ_LEN, 4, 1, val))
    lens = _lookups(index, folder, "val", 0, 3)[0]
    assert np.array_equal(feats.match_len[0].numpy(), lens[:SEQ_LEN])


def test_mixed_log_probs_sum_to_one_and_training_nll_is_their_gather(world):
    _, tokens, _, _, _ = world
    cfg = ModelConfig(arch="tscale", n_layer=2, d_model=32, n_head=2, seq_len=SEQ_LEN, vocab_size=300, eos_id=0)
    model = build_model(cfg, IndexConfig(path="x", inputs=True, mixer=True, delta=1e-3, gate_stats=True))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 300, (3, SEQ_LEN), generator=g)
    y = torch.randint(0, 300, (3, SEQ_LEN), generator=g)
    nxt = torch.randint(-1, 300, (3, SEQ_LEN, 4), generator=g)
    nxt[0, :, 0] = y[0]  # some rows where the index is right
    feats = IndexFeatures(torch.randint(0, 40, (3, SEQ_LEN), generator=g), nxt,
                          torch.randint(0, 6, (3, SEQ_LEN, 4), generator=g) * (nxt >= 0))
    with torch.no_grad():
        model.index.mixer.gate_weight.normal_()
        for table in (model.index.mixer.share_bias, model.index.mixer.pair_bias, model.index.mixer.agree_bias):
            table.weight.normal_()  # the gate-stats terms, zero at the start
        model.lm_head.weight.normal_()  # it starts at zero
        logp = model(x, index=feats)
        nll = model(x, index=feats, targets=y)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(3, SEQ_LEN), atol=1e-5)
    assert torch.allclose(nll, -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1), atol=1e-5)
    no_match = IndexFeatures.empty(3, SEQ_LEN, 4)
    plain = build_model(cfg)
    plain.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():  # no match anywhere, and zero-initialised input embeddings: exactly the plain model
        assert torch.allclose(model(x, index=no_match), torch.log_softmax(plain(x), -1), atol=1e-5)
    mixer = IndexMixer(8, 300)
    assert torch.equal(mixer.nll(torch.randn(1, 2, 8), torch.zeros(1, 2, 300), torch.zeros(1, 2, dtype=torch.long),
                                 torch.full((1, 2, 1), 7), torch.ones(1, 2, 1, dtype=torch.long),
                                 torch.tensor([[7, 8]])), torch.full((1, 2), float(np.log(300))))


@pytest.mark.parametrize("joint", [False, True])
def test_mixture_loss_trains_the_network_only_when_joint(joint):
    cfg = ModelConfig(arch="gpt2", n_layer=2, d_model=32, n_head=2, seq_len=SEQ_LEN, vocab_size=300, eos_id=0)
    torch.manual_seed(0)
    model = build_model(cfg, IndexConfig(path="x", mixer=True, mixer_joint=joint, gate_stats=True))
    plain = build_model(cfg)
    plain.load_state_dict(model.state_dict(), strict=False)
    g = torch.Generator().manual_seed(2)
    x, y = (torch.randint(0, 300, (3, SEQ_LEN), generator=g) for _ in range(2))
    nxt = torch.where(torch.rand(3, SEQ_LEN, 4, generator=g) < 0.5, y.unsqueeze(-1), torch.randint(0, 300, (3, SEQ_LEN, 4), generator=g))
    feats = IndexFeatures(torch.randint(0, 40, (3, SEQ_LEN), generator=g), nxt, torch.randint(1, 6, (3, SEQ_LEN, 4), generator=g))
    with torch.no_grad():
        model.index.mixer.gate_weight.normal_()
        for table in (model.index.mixer.share_bias, model.index.mixer.pair_bias, model.index.mixer.agree_bias):
            table.weight.normal_()
    nll = model(x, index=feats, targets=y)  # (B, T)
    with torch.no_grad():
        mixed = -model(x, index=feats).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(nll, mixed, atol=1e-5)  # the value is the mixture's either way
    nll.mean().backward()
    torch.nn.functional.cross_entropy(plain(x).reshape(-1, 300), y.reshape(-1)).backward()
    same = [torch.allclose(p.grad, q.grad, atol=1e-6) for p, q in zip(model.blocks.parameters(), plain.blocks.parameters())]
    assert all(same) != joint  # detached: the network's gradient is exactly its own loss's
    mixer = model.index.mixer
    for p in (mixer.gate_weight, mixer.length_bias.weight, mixer.share_bias.weight, mixer.pair_bias.weight,
              mixer.agree_bias.weight):
        assert p.grad.abs().sum() > 0


GATE_TABLES = ("share_bias", "pair_bias", "agree_bias")


def _gate_table_names(names) -> list[str]:
    """The gate-stats tables' weight names among state-dict keys."""
    return sorted(k for k in names if k.startswith("index.mixer.") and k.split(".")[2] in GATE_TABLES)


def test_gate_stats_switch_adds_and_removes_the_tables():
    cfg = ModelConfig(arch="gpt2", n_layer=1, d_model=32, n_head=2, seq_len=SEQ_LEN, vocab_size=300, eos_id=0)
    on = build_model(cfg, IndexConfig(path="x", mixer=True, gate_stats=True))
    off = build_model(cfg, IndexConfig(path="x", mixer=True, gate_stats=False))
    assert _gate_table_names(on.state_dict()) == sorted(f"index.mixer.{t}.weight" for t in GATE_TABLES)
    assert _gate_table_names(off.state_dict()) == [] and len(off.state_dict()) == len(on.state_dict()) - 3
    assert not any(hasattr(off.index.mixer, t) for t in GATE_TABLES) and not off.index.mixer.gate_stats
    assert load_config(None, ['index.path="x"', "index.mixer=true", "index.gate_stats=true"]).index.gate_stats
    with pytest.raises(UserError, match="index.gate_stats"):
        load_config(None, ['index.path="x"', "index.mixer=true", 'index.gate_stats="maybe"'])


def test_checkpoint_without_gate_stats_tables_loads_as_the_old_gate(tmp_path):
    """A checkpoint saved before index.gate_stats (no tables, no key in index.json) loads with them at zero."""
    from tscale.manifest import write_manifest
    from tscale.train.checkpoint import CKPT_FORMAT, CKPT_VERSION, load_model, load_weights, open_checkpoint, save_checkpoint

    cfg = ModelConfig(arch="gpt2", n_layer=2, d_model=32, n_head=2, seq_len=SEQ_LEN, vocab_size=300, eos_id=0)
    torch.manual_seed(0)
    old = build_model(cfg, IndexConfig(path="x", mixer=True, gate_stats=False)).eval()
    with torch.no_grad():
        for p in old.parameters():
            p.normal_(std=0.5)  # nothing left at its (often zero) start
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    ckpt = save_checkpoint(tmp_path / "run", 3, old, cfg, tokenizer, {}, keep_last=1,
                           index_cfg=IndexConfig(path="x", mixer=True))
    saved = json.loads((ckpt / "index.json").read_text())
    del saved["gate_stats"]  # as written before the key existed
    (ckpt / "index.json").write_text(json.dumps(saved))
    write_manifest(ckpt, CKPT_FORMAT, CKPT_VERSION, ["model.safetensors", "model.json", "tokenizer.json",
                                                     "train_state.pt", "index.json"], step=3)
    assert _gate_table_names(safetensors.torch.load_file(str(ckpt / "model.safetensors"))) == []

    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 300, (2, SEQ_LEN), generator=g) for _ in range(2))
    nxt = torch.where(torch.rand(2, SEQ_LEN, 4, generator=g) < 0.5, y.unsqueeze(-1), torch.randint(0, 300, (2, SEQ_LEN, 4), generator=g))
    feats = IndexFeatures(torch.randint(0, 40, (2, SEQ_LEN), generator=g), nxt,
                          torch.randint(1, 6, (2, SEQ_LEN, 4), generator=g).sort(-1, descending=True).values)
    for gate_stats in (False, True):  # as the config default says, and forced on: the old gate either way
        opened = open_checkpoint(ckpt)
        opened.index_cfg = opened.index_cfg.model_copy(update={"gate_stats": gate_stats})
        model = build_model(opened.model_cfg, opened.index_cfg)
        if gate_stats:
            with torch.no_grad():
                model.index.mixer.agree_bias.weight.normal_()  # whatever was there, loading zeroes it
        load_weights(model, opened)
        model.eval()
        assert model.index.mixer.gate_stats == gate_stats
        with torch.no_grad():
            assert torch.equal(model(x, index=feats), old(x, index=feats))
            assert torch.equal(model(x, index=feats, targets=y), old(x, index=feats, targets=y))
        if gate_stats:
            assert all(getattr(model.index.mixer, t).weight.abs().sum() == 0 for t in GATE_TABLES)
    loaded, _ = load_model(ckpt)  # what eval and infer do
    with torch.no_grad():
        assert torch.equal(loaded(x, index=feats), old(x, index=feats))


def test_feature_dropout_blanks_whole_windows_only():
    g = torch.Generator().manual_seed(1)
    nxt = torch.randint(0, 300, (64, 8, 4), generator=g)
    feats = IndexFeatures(torch.randint(1, 40, (64, 8), generator=g), nxt, torch.randint(1, 6, (64, 8, 4), generator=g))
    torch.manual_seed(0)
    dropped = feats.drop_windows(0.5)
    blank = dropped.match_len.eq(0).all(1)  # (B,)
    assert 10 < int(blank.sum()) < 54
    none = IndexFeatures.empty(64, 8, 4)
    for got, orig, empty in zip(dropped, feats, none):
        assert torch.equal(got[blank], empty[blank])  # a dropped window: "no match" at every position
        assert torch.equal(got[~blank], orig[~blank])  # the others untouched
    assert all(torch.equal(a, b) for a, b in zip(feats.drop_windows(0.0), feats))


@pytest.mark.parametrize("mode,arch", [("inputs", "gpt2"), ("mixer", "tscale"), ("both", "tscale")])
def test_train_cli_with_index(world, tmp_path, mode, arch):
    root, tokens, raw, _, _ = world
    switches = {"inputs": ["index.inputs=true"], "mixer": ["index.mixer=true"],
                "both": ["index.inputs=true", "index.mixer=true", "index.dropout=0.5"]}[mode]
    args = [a for s in [*TINY, f'model.arch="{arch}"', "train.steps=4", "train.eval_every=2", "train.eval_batches=2",
                        f'index.path="{raw}"', *switches] for a in ("--set", s)]
    result = CliRunner().invoke(main, ["train", *args, "--tokens", str(tokens), "-o", str(tmp_path / "run"), "--quiet"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    assert all(np.isfinite(r.get("loss", r.get("val_loss"))) for r in records)
    assert sum("val_loss" in r for r in records) == 2
    ckpt = tmp_path / "run" / "ckpt" / "step-0000004"
    saved = json.loads((ckpt / "index.json").read_text())
    assert (saved["inputs"], saved["mixer"]) == (mode != "mixer", mode != "inputs")
    weights = safetensors.torch.load_file(str(ckpt / "model.safetensors"))
    assert any(k.startswith("index.inputs.") for k in weights) == (mode != "mixer")
    assert any(k.startswith("index.mixer.") for k in weights) == (mode != "inputs")
    if mode != "mixer":
        assert weights["index.inputs.next_token.weight"].abs().sum() > 0  # trained away from its zero start
    if mode != "inputs":
        assert weights["index.mixer.gate_weight"].abs().sum() > 0


def test_resumed_index_run_matches_straight_run(world, tmp_path):
    _, tokens, raw, _, _ = world
    sets = ("index.inputs=true", "index.mixer=true", "train.steps=6", "train.ckpt_every=3")
    train_run(_cfg(tokens, raw, *sets), tmp_path / "a", quiet=True)
    train_run(_cfg(tokens, raw, *sets[:2], "train.steps=3", "train.ckpt_every=3"), tmp_path / "b", quiet=True)
    resumed = load_config(tmp_path / "b" / "config.toml", ["train.steps=6"])
    train_run(resumed, tmp_path / "b", resume=True, quiet=True)

    def losses(run):
        return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]

    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_run_saved_before_gate_stats_resumes_without_them(world, tmp_path):
    _, tokens, raw, _, _ = world
    train_run(_cfg(tokens, raw, "index.mixer=true", "index.gate_stats=false", "train.steps=6", "train.ckpt_every=3"),
              tmp_path / "a", quiet=True)
    train_run(_cfg(tokens, raw, "index.mixer=true", "index.gate_stats=false", "train.steps=3", "train.ckpt_every=3"),
              tmp_path / "b", quiet=True)
    saved = tmp_path / "b" / "config.toml"
    saved.write_text("".join(line for line in saved.read_text().splitlines(keepends=True) if "gate_stats" not in line))
    resumed = load_config(saved, ["train.steps=6"])
    assert resumed.index.gate_stats  # the default now; the run itself had no such tables
    train_run(resumed, tmp_path / "b", resume=True, quiet=True)
    assert load_config(saved).index.gate_stats is False  # written back as the run was
    weights = safetensors.torch.load_file(str(tmp_path / "b" / "ckpt" / "step-0000006" / "model.safetensors"))
    assert _gate_table_names(weights) == []

    def losses(run):
        return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]

    assert losses(tmp_path / "a") == losses(tmp_path / "b") and len(losses(tmp_path / "a")) == 6


def test_train_refuses_an_index_of_other_tokens(world, tmp_path):
    root, tokens, raw, _, plain = world
    other = tmp_path / "other"
    tokenize_corpus([root / "c.jsonl"], other, tokenizer=tokens / "tokenizer.json", val_modulus=5, quiet=True)
    base = [a for s in [*TINY, "train.steps=2", "index.inputs=true"] for a in ("--set", s)]
    result = CliRunner().invoke(main, ["train", *base, "--set", f'index.path="{raw}"', "--tokens", str(other),
                                       "-o", str(tmp_path / "r1")])
    assert_one_line_error(result, str(raw), "built from token folder", command="train")
    result = CliRunner().invoke(main, ["train", *base, "--set", f'index.path="{plain}"', "--tokens", str(tokens),
                                       "-o", str(tmp_path / "r2")])
    assert_one_line_error(result, "no per-token features", "--features", command="train")
    result = CliRunner().invoke(main, ["train", *[a for s in TINY for a in ("--set", s)], "--set", "index.mixer=true",
                                       "--tokens", str(tokens), "-o", str(tmp_path / "r3")])
    assert_one_line_error(result, "index.path", command="train")


def test_eval_index_breaks_loss_down_by_match_length(world, runs, tmp_path):
    _, tokens, raw, dec, plain = world
    run_index, run_base = runs
    out = tmp_path / "eval.json"
    result = CliRunner().invoke(main, ["eval", str(run_index), "--tokens", str(tokens), "--index", str(raw),
                                       "--index", str(dec), "--out", str(out), "--device", "cpu"])  # as `fresh` below
    assert result.exit_code == 0, result.output
    r = json.loads(out.read_text())
    assert r["model_uses_index"] and [e["index"] for e in r["indexes"]] == [str(raw), str(dec)]
    assert [e["lookups"] for e in r["indexes"]] == ["stored features", "looked up now"]
    assert r["indexes"][1]["decontamination"]["ngram"] == 13 and r["indexes"][0]["decontamination"] is None
    assert r["indexes"][1]["decontaminated_against_this_split"] is True
    assert r["val_loss"] == r["indexes"][0]["val_loss"]
    for e in r["indexes"]:
        buckets = e["by_match_len"]
        assert list(buckets) == bucket_labels() == ["0", "1-3", "4-7", "8-15", "16-31", ">=32"]
        assert sum(b["tokens"] for b in buckets.values()) == e["val_tokens"]
        assert sum(b["nats"] for b in buckets.values()) == pytest.approx(e["val_loss"] * e["val_tokens"], rel=1e-9)
        short = sum(buckets[k]["tokens"] for k in ("0", "1-3", "4-7", "8-15"))
        assert e["below_16"]["tokens"] == short
    off = r["without_index"]  # the same model with its lookups switched off, in the first index's buckets
    assert off["lookups"] == "hidden" and off["index"] == str(raw) and off["val_tokens"] == r["val_tokens"]
    assert [b["tokens"] for b in off["by_match_len"].values()] == [b["tokens"] for b in r["by_match_len"].values()]
    assert off["val_loss"] != pytest.approx(r["val_loss"], rel=1e-4)  # the lookups reach the inputs and the mixture
    assert "lookups switched off (the network alone)" in result.output
    long_raw = sum(b["tokens"] for k, b in r["indexes"][0]["by_match_len"].items() if k in ("16-31", ">=32"))
    long_dec = sum(b["tokens"] for k, b in r["indexes"][1]["by_match_len"].items() if k in ("16-31", ">=32"))
    assert long_raw > long_dec  # the copied spans are what decontamination removes

    fresh = evaluate_checkpoint(run_index, tokens, indexes=[plain])  # same documents as raw, looked up now
    assert fresh["indexes"][0]["lookups"] == "looked up now"
    assert fresh["val_loss"] == pytest.approx(r["val_loss"], rel=1e-6)
    for label, b in r["by_match_len"].items():
        got = fresh["by_match_len"][label]
        assert got["tokens"] == b["tokens"] and got["nats"] == pytest.approx(b["nats"], rel=1e-6)

    base = evaluate_checkpoint(run_base, tokens, indexes=[raw, dec])
    assert not base["model_uses_index"] and "without_index" not in base  # its own numbers are without the index
    assert base["indexes"][0]["val_loss"] == base["indexes"][1]["val_loss"] == base["val_loss"]
    assert base["indexes"][0]["by_match_len"] != base["indexes"][1]["by_match_len"]

    result = CliRunner().invoke(main, ["eval", str(run_index), "--tokens", str(tokens), "--out", str(tmp_path / "x.json")])
    assert_one_line_error(result, "trained with the token index", "--index", command="eval")

    capped = tmp_path / "capped.json"  # a model without the index, its buckets from lookups capped at 6 tokens
    result = CliRunner().invoke(main, ["eval", str(run_base), "--tokens", str(tokens), "--index", str(raw),
                                       "--index-max-len", "6", "--out", str(capped), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    e = json.loads(capped.read_text())["indexes"][0]
    assert e["max_len"] == 6 and e["lookups"] == "looked up now"
    assert e["by_match_len"]["16-31"]["tokens"] == e["by_match_len"][">=32"]["tokens"] == 0
    assert e["by_match_len"]["4-7"]["tokens"] > base["indexes"][0]["by_match_len"]["4-7"]["tokens"]
    result = CliRunner().invoke(main, ["eval", str(run_index), "--tokens", str(tokens), "--index", str(raw),
                                       "--index-max-len", "6", "--out", str(tmp_path / "y.json"), "--device", "cpu"])
    assert_one_line_error(result, "--index-max-len 6", "index.max_len = 64", command="eval")


def test_infer_index_generates_and_refuses_mismatches(world, runs):
    _, tokens, raw, _, _ = world
    run_index, run_base = runs
    result = CliRunner().invoke(main, ["infer", str(run_index), "--index", str(raw), "--prompt", "harbour ferry lemon",
                                       "--max-new-tokens", "6", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert_one_line_error(CliRunner().invoke(main, ["infer", str(run_index), "--prompt", "harbour"]),
                          "trained with the token index", "--index", command="infer")
    assert_one_line_error(CliRunner().invoke(main, ["infer", str(run_base), "--index", str(raw), "--prompt", "harbour"]),
                          "trained without the token index", command="infer")

    engine = Engine.from_checkpoint(run_index, "cpu", index=raw)
    prompt = [int(t) for t in TokenFolder(tokens).shards("train")[0].tokens[:6]]
    params = GenerationParams(max_new_tokens=SEQ_LEN - len(prompt), sampling=SamplingParams(temperature=0.0))
    generated = list(engine.token_stream(prompt, params.max_new_tokens, params.sampling, None))
    ids = prompt + generated
    index = Index(raw)
    lens, nxt, cnt = index.lookup(ids, max_len=FEATURE_MAX_LEN, topk=4)  # the whole sequence at once
    feats = IndexFeatures(*(torch.from_numpy(a.astype(np.int64)).unsqueeze(0) for a in (lens, nxt, cnt)))
    with torch.no_grad():
        logp = engine.model(torch.tensor([ids]), index=feats)  # (1, T, V)
    assert len(generated) == SEQ_LEN - len(prompt) >= 2 and lens.max() >= len(prompt)
    assert generated == logp[0, len(prompt) - 1:-1].argmax(-1).tolist()

    drafting = Engine.from_checkpoint(run_index, "cpu", index=raw, draft_index=raw, draft_min_match=1)
    stats = DraftStats()
    assert list(drafting.token_stream(prompt, params.max_new_tokens, params.sampling, None, stats)) == generated
    assert stats.drafted > 0 and stats.passes + stats.accepted == len(generated)  # lookups fed at every draft position


def test_backoff_distribution_trains_evaluates_and_generates(world, tmp_path):
    """index.distribution = "backoff" end to end: stored features train the mixer, an evaluation against the same
    documents looked up now scores the same, generation feeds the same lookups as the whole sequence at once."""
    _, tokens, _, _, plain = world
    backoff = tmp_path / "backoff"
    build_index(tokens, backoff, features=True, features_distribution="backoff", quiet=True)
    sets = ("index.mixer=true", 'index.distribution="backoff"', "train.steps=4", "train.eval_every=2",
            "train.eval_batches=2")
    run = train_run(_cfg(tokens, backoff, *sets), tmp_path / "run", quiet=True)
    assert run.val_loss is not None and np.isfinite(run.val_loss)
    with pytest.raises(UserError, match="index.distribution 'counts'"):
        train_run(_cfg(tokens, backoff, "index.mixer=true", "train.steps=1"), tmp_path / "counts", quiet=True)

    stored, fresh = evaluate_checkpoint(tmp_path / "run", tokens, indexes=[backoff, plain])["indexes"]
    assert (stored["lookups"], fresh["lookups"]) == ("stored features", "looked up now")
    assert stored["distribution"] == fresh["distribution"] == "backoff"
    assert fresh["val_loss"] == pytest.approx(stored["val_loss"], rel=1e-6)
    result = CliRunner().invoke(main, ["eval", str(tmp_path / "run"), "--tokens", str(tokens), "--index", str(backoff),
                                       "--out", str(tmp_path / "eval.json"), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "stored features, backoff distribution" in " ".join(result.output.split())
    hidden = json.loads((tmp_path / "eval.json").read_text())["without_index"]
    assert hidden["val_loss"] != pytest.approx(stored["val_loss"], rel=1e-4)  # the mixture changes the loss

    engine = Engine.from_checkpoint(tmp_path / "run", "cpu", index=plain)
    prompt = [int(t) for t in TokenFolder(tokens).shards("train")[0].tokens[:6]]
    generated = list(engine.token_stream(prompt, SEQ_LEN - len(prompt), SamplingParams(temperature=0.0), None))
    ids = prompt + generated
    looked = FeatureLookup(4, FEATURE_MAX_LEN, "backoff")(Index(plain), np.asarray(ids))
    feats = IndexFeatures(*(torch.from_numpy(a.astype(np.int64)).unsqueeze(0) for a in looked))
    with torch.no_grad():
        logp = engine.model(torch.tensor([ids]), index=feats)  # (1, T, V)
    assert generated == logp[0, len(prompt) - 1:-1].argmax(-1).tolist()


@pytest.mark.parametrize("arch", ["gpt2", "tscale"])
@pytest.mark.parametrize("with_index", [False, True])
def test_logits_of_the_last_positions_are_those_of_the_whole_forward(arch, with_index):
    """model(..., last=n) (generation's prefill and drafts) gives the last n rows of the full forward, through the
    cache and the index's mixer, and runs the head on those rows only."""
    cfg = ModelConfig(arch=arch, n_layer=2, d_model=32, n_head=2, seq_len=SEQ_LEN, vocab_size=300, eos_id=0)
    torch.manual_seed(1)
    model = build_model(cfg, IndexConfig(path="x", inputs=True, mixer=True, gate_stats=True) if with_index else None)
    with torch.no_grad():
        model.lm_head.weight.normal_()  # tscale starts it at zero
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 300, (2, 12), generator=g)
    nxt = torch.randint(-1, 300, (2, 12, 4), generator=g)
    feats = IndexFeatures(torch.randint(0, 40, (2, 12), generator=g), nxt, torch.randint(1, 6, (2, 12, 4)) * (nxt >= 0))
    kw = (lambda lo, hi: {"index": IndexFeatures(*(t[:, lo:hi] for t in feats))}) if with_index else (lambda lo, hi: {})
    rows = []
    model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[1]))
    with torch.no_grad():
        whole = model(x, **kw(0, 12))  # (2, 12, V)
        cache = model.new_cache(2, SEQ_LEN, "cpu", torch.float32)
        prefill = model(x[:, :9], cache, last=1, **kw(0, 9))  # (2, 1, V)
        step = model(x[:, 9:], cache, last=2, **kw(9, 12))  # (2, 2, V)
    assert rows == [12, 1, 2] and prefill.shape == (2, 1, 300) and step.shape == (2, 2, 300)
    torch.testing.assert_close(prefill[:, 0], whole[:, 8], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(step, whole[:, 10:], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="last"):
        model(x, targets=x, last=1, **kw(0, 12))
