"""Speculative decoding with index drafts: lossless greedy output, the sampling rule's distribution, fewer passes, errors."""

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers_ckpt import make_checkpoint, make_token_folder, make_tokenizer
from helpers_cli import assert_one_line_error

from tscale.cli.main import main
from tscale.data.tokenizer import load_tokenizer, vocab_size
from tscale.index import Index, build_index
from tscale.infer import Engine, GenerationParams, SamplingParams, make_generator
from tscale.infer.draft import DraftStats, IndexDrafter, accept
from tscale.ops.backend import kernels_available

pytestmark = pytest.mark.skipif(not kernels_available(), reason="tscale._C not built")

SEQ_LEN = 64
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny random gpt2, its greedy continuation of a prompt, and two indexes of its tokenizer: one holding that
    continuation among random documents, one of random documents only."""
    root = tmp_path_factory.mktemp("draft")
    tok_path = make_tokenizer(root / "tok")
    ckpt = make_checkpoint(root / "run", tok_path, seq_len=SEQ_LEN, seed=3)
    plain = Engine.from_checkpoint(ckpt, "cpu")
    prompt = plain.encode_prompt("The tide came in over the flats")
    greedy = list(plain.token_stream(prompt, 200, GREEDY, None))
    vocab, eos = vocab_size(load_tokenizer(tok_path)), plain.eos
    rng = np.random.default_rng(0)
    noise = [(0, ids, 3 * len(ids)) for ids in (np.where(r == eos, 1, r) for r in rng.integers(0, vocab, (30, 40)))]
    upto_eos = greedy[:greedy.index(eos)] if eos in greedy else greedy
    folders = {
        "copy": make_token_folder(root / "t-copy", tok_path, {"train": [*noise[:10], (0, prompt + upto_eos, 99)]}, ["s"]),
        "noise": make_token_folder(root / "t-noise", tok_path, {"train": noise}, ["s"]),
    }
    for name, folder in folders.items():
        build_index(folder, root / f"i-{name}", quiet=True)
    return ckpt, prompt, greedy, root / "i-copy", root / "i-noise"


def drafted(ckpt, index, **kw) -> Engine:
    return Engine.from_checkpoint(ckpt, "cpu", draft_index=index, **kw)


def test_greedy_output_is_unchanged_and_takes_fewer_passes(world):
    ckpt, prompt, greedy, copy, _ = world
    assert len(greedy) == SEQ_LEN - len(prompt) + 1  # the plain run went to the end of the context
    stats = DraftStats()
    got = list(drafted(ckpt, copy).token_stream(prompt, 200, GREEDY, None, stats))
    assert got == greedy
    assert stats.accepted > 0 and stats.passes + stats.accepted == len(greedy)  # each pass: kept drafts + one token
    assert stats.passes < len(greedy) / 2  # the index holds this very continuation


def test_greedy_output_is_unchanged_when_drafts_are_wrong(world):
    ckpt, prompt, greedy, _, noise = world
    stats = DraftStats()
    got = list(drafted(ckpt, noise, draft_min_match=1, draft_dominance=1).token_stream(prompt, 200, GREEDY, None, stats))
    assert got == greedy
    assert stats.drafted > stats.accepted  # drafts were proposed and (mostly) refused
    assert stats.passes + stats.accepted == len(greedy)


@pytest.mark.parametrize("budget", [1, 2, 5, 17])
def test_token_budget_is_exact(world, budget):
    ckpt, prompt, greedy, copy, _ = world
    got = list(drafted(ckpt, copy).token_stream(prompt, budget, GREEDY, None))
    assert got == greedy[:budget]


def test_sampled_generation_runs_and_counts_its_drafts(world):
    ckpt, prompt, _, copy, _ = world
    c = drafted(ckpt, copy).generate("The tide came in over the flats",
                                      GenerationParams(max_new_tokens=30, sampling=SamplingParams(0.7), seed=1))
    assert c.tokens >= 1 and c.passes + c.accepted == c.tokens and c.accepted <= c.drafted
    again = drafted(ckpt, copy).generate("The tide came in over the flats",
                                         GenerationParams(max_new_tokens=30, sampling=SamplingParams(0.7), seed=1))
    assert again == c  # the same seed, the same text and drafts


def test_drafter_follows_the_corpus_and_stops_when_the_match_is_short(world):
    _, prompt, greedy, copy, noise = world
    index = Index(copy)
    ctx = prompt + greedy[:10]
    assert IndexDrafter(index, max_tokens=6).draft(ctx) == greedy[10:16]
    assert IndexDrafter(index, max_tokens=6).draft(ctx, limit=2) == greedy[10:12]
    assert IndexDrafter(Index(noise), max_tokens=6, min_match=4).draft(ctx) == []  # nothing matches 4 tokens there


def test_drafts_equal_those_of_whole_context_lookups(world):
    _, prompt, greedy, copy, noise = world

    def reference(index, ids, n, min_match, dominance):  # every draft token looked up with the context's last 64
        ctx, out = list(ids), []
        while len(out) < n:
            lens, nxt, cnt = index.lookup(np.asarray(ctx[-64:], dtype=np.int64), None, max_len=64, topk=2)
            if lens[-1] < min_match or nxt[-1, 0] < 0 or cnt[-1, 0] < dominance * cnt[-1, 1]:
                break
            out.append(int(nxt[-1, 0]))
            ctx.append(out[-1])
        return out

    for path in (copy, noise):
        index = Index(path)
        for cut in range(0, 40, 3):
            ctx = prompt + greedy[:cut]
            for m, r in ((1, 1), (3, 1), (1, 2)):
                got = IndexDrafter(index, max_tokens=10, min_match=m, dominance=r).draft(ctx)
                assert got == reference(index, ctx, 10, m, r)


def test_dominance_keeps_drafts_to_clear_continuations(tmp_path):
    tok = make_tokenizer(tmp_path / "tok")
    docs = [[5, 6, 7, 8, 9, 11]] * 3 + [[5, 6, 7, 8, 10, 12]] * 2  # after 5 6 7 8: 9 three times, 10 twice
    folder = make_token_folder(tmp_path / "t", tok, {"train": [(0, d, 12) for d in docs]}, ["s"])
    build_index(folder, tmp_path / "i", quiet=True)
    index = Index(tmp_path / "i")
    assert IndexDrafter(index, max_tokens=2, min_match=2, dominance=1).draft([5, 6, 7, 8]) == [9, 11]
    assert IndexDrafter(index, max_tokens=2, min_match=2, dominance=1.5).draft([5, 6, 7, 8]) == [9, 11]  # 3 >= 1.5 x 2
    assert IndexDrafter(index, max_tokens=2, min_match=2, dominance=2).draft([5, 6, 7, 8]) == []  # 3 < 2 x 2


def test_accept_greedy_keeps_the_agreeing_prefix():
    logits = torch.full((4, 5), -1.0)  # (n + 1, V): the model's choices are 2, 3, 1, 4
    for row, best in enumerate([2, 3, 1, 4]):
        logits[row, best] = 1.0
    assert accept(logits, [2, 3, 1], GREEDY, None) == (3, 4)
    assert accept(logits, [2, 0, 1], GREEDY, None) == (1, 3)
    assert accept(logits, [0, 3, 1], GREEDY, None) == (0, 2)
    assert accept(logits[:1], [], GREEDY, None) == (0, 2)


def test_accept_sampling_leaves_the_distribution_unchanged():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = p.log().expand(3, 4).clone()  # (n + 1, V): the same distribution at every position
    g = make_generator(0)
    for draft in ([0, 0], [3, 3], [1, 2]):
        first, second, n = torch.zeros(4), torch.zeros(4), 4000
        for _ in range(n):
            kept, tok = accept(logits, draft, SamplingParams(1.0), g)
            out = [*draft[:kept], tok]
            first[out[0]] += 1
            if len(out) > 1:
                second[out[1]] += 1
        for counts in (first, second):  # the second token: the runs that kept the first draft token
            tol = 4 * (0.25 / counts.sum()) ** 0.5  # four standard deviations of a share near 1/2
            assert torch.allclose(counts / counts.sum(), p, atol=float(tol)), (draft, counts)


def test_cli_drafts_print_the_same_text_and_refuse_bad_input(world, tmp_path):
    ckpt, _, _, copy, _ = world
    args = ["infer", str(ckpt), "--prompt", "The tide came in over the flats", "--temperature", "0",
            "--max-new-tokens", "20"]
    plain = CliRunner().invoke(main, args)
    with_drafts = CliRunner().invoke(main, [*args, "--draft-index", str(copy)])
    assert plain.exit_code == 0 and with_drafts.exit_code == 0, with_drafts.output
    assert with_drafts.stdout == plain.stdout
    assert "draft tokens kept" in with_drafts.stderr
    assert_one_line_error(CliRunner().invoke(main, [*args, "--draft-index", str(copy), "--draft-tokens", "0"]),
                          "--draft-tokens 0", command="infer")
    other_tok = make_tokenizer(tmp_path / "tok2", size=280, texts=["completely different words here"])
    other = make_token_folder(tmp_path / "t2", other_tok, {"train": [(0, [5, 6, 7, 8], 12)]}, ["s"])
    build_index(other, tmp_path / "i2", quiet=True)
    assert_one_line_error(CliRunner().invoke(main, [*args, "--draft-index", str(tmp_path / "i2")]),
                          "--draft-index", "another tokenizer", command="infer")
