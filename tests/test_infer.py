"""tscale.infer: sampling filters, KV-cache decoding, streaming, stop strings, and `tscale infer`."""

import json
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner
from helpers_cli import assert_one_line_error
from helpers_ckpt import make_checkpoint, make_tokenizer

from tscale.cli.main import main
from tscale.data.tokenizer import train_tokenizer
from tscale.infer import Engine, GenerationParams, SamplingParams, filter_top_k, filter_top_p, make_generator

one_line_error = partial(assert_one_line_error, command="infer")

SEQ_LEN = 32


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("infer")
    return make_checkpoint(root / "run", make_tokenizer(root / "tok"), seq_len=SEQ_LEN)


@pytest.fixture(scope="module")
def engine(ckpt):
    return Engine.from_checkpoint(ckpt, "cpu")


def sampled(temperature=1.0, top_k=0, top_p=1.0, **kw) -> GenerationParams:
    return GenerationParams(sampling=SamplingParams(temperature, top_k, top_p), **kw)


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result


# ---- sampling filters -------------------------------------------------------------------------

def test_top_p_keeps_minimal_nucleus():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3], [0.25, 0.25, 0.25, 0.25]])
    logits = probs.log()
    kept = lambda p: (filter_top_p(logits, p) > float("-inf")).tolist()  # noqa: E731
    assert kept(0.3)[0] == [False, True, False, False]  # 0.5 alone reaches 0.3
    assert kept(0.79)[0] == [False, True, False, True]  # 0.5 + 0.3
    assert kept(0.81)[0] == [False, True, True, True]  # needs 0.15 too
    assert kept(0.99)[0] == [True, True, True, True]
    assert sum(kept(0.6)[1]) == 3  # uniform row: 3 x 0.25 is the least reaching 0.6
    assert torch.equal(filter_top_p(logits, 1.0), logits)
    assert torch.equal(filter_top_p(logits, 1e-6)[0] > float("-inf"), torch.tensor([False, True, False, False]))


def test_top_k_filter():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert (filter_top_k(logits, 2) > float("-inf")).tolist() == [[False, True, True, False]]
    assert torch.equal(filter_top_k(logits, 0), logits)
    assert torch.equal(filter_top_k(logits, 10), logits)


def test_bad_sampling_values_are_user_errors():
    from tscale.errors import UserError

    for bad in (SamplingParams(-1.0), SamplingParams(1.0, -2), SamplingParams(1.0, 0, 0.0), SamplingParams(1.0, 0, 1.5)):
        with pytest.raises(UserError):
            bad.check()


# ---- decoding on a tiny random model ------------------------------------------------------------

@torch.no_grad()
def greedy_without_cache(model, ids: list[int], steps: int) -> list[int]:
    """Reference: recompute the full forward pass for every new token."""
    ids, out = list(ids), []
    while len(out) < steps and len(ids) <= model.cfg.seq_len:
        tok = int(model(torch.tensor([ids]))[0, -1].argmax())
        out.append(tok)
        ids.append(tok)
    return out


def test_kv_cache_decoding_equals_full_recompute(engine):
    prompt = engine.encode_prompt("The tide came in")
    got = list(engine.token_stream(prompt, 100, SamplingParams(temperature=0.0), None))
    assert len(got) == SEQ_LEN - len(prompt) + 1  # ran to the end of the context
    assert got == greedy_without_cache(engine.model, prompt, 100)


def test_top_k_1_equals_greedy(engine):
    prompt = engine.encode_prompt("A kettle")
    greedy = list(engine.token_stream(prompt, 12, SamplingParams(temperature=0.0), None))
    top1 = list(engine.token_stream(prompt, 12, SamplingParams(temperature=1.3, top_k=1), make_generator(5)))
    assert top1 == greedy


def test_seed_reproducible(engine):
    a = engine.generate("Numbers", sampled(seed=3, max_new_tokens=20))
    b = engine.generate("Numbers", sampled(seed=3, max_new_tokens=20))
    c = engine.generate("Numbers", sampled(seed=4, max_new_tokens=20))
    assert a == b
    assert a.text != c.text


def test_stream_pieces_join_to_final_text(engine):
    for seed in range(6):
        params = sampled(seed=seed, max_new_tokens=25, top_p=0.95)
        stream = engine.stream("Café", params)
        pieces = list(stream)
        assert "".join(pieces) == stream.completion.text
        assert stream.completion == engine.generate("Café", params)
        assert stream.completion.finish_reason in ("eos", "length")


def test_stop_string_cuts_text(engine):
    full = engine.generate("The", sampled(seed=1, max_new_tokens=30))
    assert len(full.text) >= 8, full
    stop = full.text[4:7]
    want = full.text[: full.text.index(stop)]
    stream = engine.stream("The", sampled(seed=1, max_new_tokens=30, stop=("zzzz-never", stop)))
    pieces = list(stream)
    c = stream.completion
    assert (c.text, c.finish_reason) == (want, "stop")
    assert "".join(pieces) == want
    assert c.tokens <= full.tokens


def test_empty_prompt_and_long_prompt(engine):
    c = engine.generate("", sampled(seed=0, max_new_tokens=5))
    assert c.tokens >= 1
    from tscale.errors import UserError

    with pytest.raises(UserError, match="context"):
        engine.encode_prompt("x " * 200)
    assert engine.generate("The", sampled(max_new_tokens=0)).finish_reason == "length"


# ---- a scripted model: exact control over the emitted ids ----------------------------------------

class Scripted(nn.Module):
    """Emits `script` in order (one-hot logits), whatever the input; counts positions like the real cache."""

    def __init__(self, script: list[int], vocab: int, seq_len: int = 64):
        super().__init__()
        self.cfg = SimpleNamespace(seq_len=seq_len, vocab_size=vocab)
        self.script, self.vocab, self.i = script, vocab, 0

    def new_cache(self, batch, max_len, device, dtype):
        return SimpleNamespace(pos=0)

    def forward(self, idx, cache=None, last=0):
        B, T = idx.shape
        cache.pos += T
        logits = torch.full((B, T, self.vocab), -1e4)  # (B, T, V)
        logits[:, -1, self.script[self.i]] = 0.0
        self.i += 1
        return logits[:, -last:] if last else logits


@pytest.fixture(scope="module")
def byte_tok():
    return train_tokenizer(["abc"], 257)  # bytes + eos, no merges: one id per byte


def scripted_run(tok, text: str, extra: list[int] = (), seq_len: int = 64, **kw):
    ids = tok.encode(text).ids + list(extra)
    eng = Engine(Scripted(ids, tok.get_vocab_size(), seq_len), tok)
    stream = eng.stream("a", GenerationParams(sampling=SamplingParams(0.0), **kw))
    return list(stream), stream.completion


def test_multibyte_characters_never_split(byte_tok):
    pieces, c = scripted_run(byte_tok, "é—x😀y", max_new_tokens=11)
    assert c.text == "é—x😀y" and c.finish_reason == "length" and c.tokens == 11
    assert "".join(pieces) == c.text
    assert all("\ufffd" not in p for p in pieces)
    assert len(pieces) == 5  # one piece per completed character


def test_stop_string_across_tokens_and_eos(byte_tok):
    eos = byte_tok.token_to_id("<|endoftext|>")
    pieces, c = scripted_run(byte_tok, "ab END cd", [eos], max_new_tokens=50, stop=("END", "ZZ"))
    assert (c.text, c.finish_reason, c.tokens) == ("ab ", "stop", 6)
    assert "".join(pieces) == "ab "
    pieces, c = scripted_run(byte_tok, "ab EN", [eos], max_new_tokens=50, stop=("END",))
    assert (c.text, c.finish_reason, c.tokens) == ("ab EN", "eos", 6)  # held "EN" is released at the end
    assert pieces[-1] == "EN"


def test_context_full_finishes_with_length(byte_tok):
    # prompt "a" is 1 token; a context of 8 positions leaves room to feed 7 more, so 8 are sampled
    _, c = scripted_run(byte_tok, "abcdefghijklmnop", seq_len=8, max_new_tokens=100)
    assert (c.text, c.finish_reason, c.tokens) == ("abcdefgh", "length", 8)


# ---- the command --------------------------------------------------------------------------------

def test_cli_single_prompt_streams_completion(ckpt, engine):
    r = invoke("infer", ckpt, "--prompt", "The tide", "--max-new-tokens", 12, "--temperature", 0.7, "--seed", 9,
               "--device", "cpu")
    assert r.exit_code == 0, r.output
    want = engine.generate("The tide", sampled(0.7, seed=9, max_new_tokens=12))
    assert r.stdout == want.text + "\n"


def test_cli_batch_jsonl(ckpt, engine, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "The tide"}, {"prompt": "", "max_new_tokens": 4, "temperature": 0},
             {"prompt": "Café", "top_p": 0.9, "seed": 77, "stop": ["e", "a"]}]
    prompts.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + json.dumps(lines[2]) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["infer", ckpt, "--prompts", prompts, "--out", out, "--max-new-tokens", 10, "--seed", 5, "--temperature", 1.0]
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["prompt"] for g in got] == ["The tide", "", "Café"]
    assert all(set(g) == {"prompt", "completion", "finish_reason", "tokens"} for g in got)
    assert got[0]["completion"] == engine.generate("The tide", sampled(1.0, seed=5, max_new_tokens=10)).text
    assert got[1]["completion"] == engine.generate("", sampled(0.0, max_new_tokens=4)).text
    third = engine.generate("Café", sampled(1.0, top_p=0.9, seed=77, max_new_tokens=10, stop=("e", "a")))
    assert (got[2]["completion"], got[2]["finish_reason"], got[2]["tokens"]) == (third.text, third.finish_reason, third.tokens)
    assert "e" not in got[2]["completion"] and "a" not in got[2]["completion"]
    before = out.read_bytes()
    r = invoke(*args)  # refuses to overwrite
    assert r.exit_code == 2 and "already exists" in r.stderr
    assert out.read_bytes() == before


def test_cli_errors(ckpt, tmp_path):
    one_line_error(invoke("infer", tmp_path / "nope", "--prompt", "x"), "nope")
    one_line_error(invoke("infer", ckpt), "--prompt")
    one_line_error(invoke("infer", ckpt, "--prompts", tmp_path / "missing.jsonl", "--out", tmp_path / "o.jsonl"), "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": oops}\n')
    one_line_error(invoke("infer", ckpt, "--prompts", bad, "--out", tmp_path / "o.jsonl"), f"{bad}:2", "JSON")
    bad.write_text('{"prompt": "ok", "max_tokens": 3}\n')
    one_line_error(invoke("infer", ckpt, "--prompts", bad, "--out", tmp_path / "o.jsonl"), f"{bad}:1", "max_tokens")
    one_line_error(invoke("infer", ckpt, "--prompt", "x", "--top-p", 0), "--top-p 0")
    one_line_error(invoke("infer", ckpt, "--prompt", "x", "--max-new-tokens", -1), "--max-new-tokens -1")
    one_line_error(invoke("infer", ckpt, "--prompt", "x", "--stop", ""), "--stop", "empty")
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_engine_keeps_bf16_linears_and_generates_as_the_autocast_model(ckpt):
    """On a GPU the engine stores its linear weights in bf16: the logits autocast gives with float32 weights."""
    from tscale.train.checkpoint import load_model

    eng = Engine.from_checkpoint(ckpt, "cuda")
    assert all(m.weight.dtype == torch.bfloat16 for m in eng.model.modules() if type(m) is nn.Linear)
    model, _ = load_model(ckpt, "cuda")
    ids = eng.encode_prompt("The tide comes in")
    x = torch.tensor([ids], device="cuda")  # (1, P)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        want, got = model(x), eng.model(x)  # (1, P, V)
    assert torch.equal(got, want)
    made = list(eng.token_stream(ids, 4, SamplingParams(temperature=0.0), None))  # the cached path, bf16 weights
    assert len(made) == 4 and all(0 <= t < model.cfg.vocab_size for t in made)
