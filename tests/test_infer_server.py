"""tscale infer --serve: OpenAI-compatible completions over HTTP, streamed or whole; refusals; the shared secret."""

import json
import threading
import urllib.error
import urllib.request
from functools import partial

import pytest
from click.testing import CliRunner
from helpers_ckpt import make_checkpoint, make_tokenizer
from helpers_cli import assert_one_line_error

from tscale.cli.main import main
from tscale.errors import UserError
from tscale.infer import Engine, GenerationParams, SamplingParams
from tscale.infer.server import CompletionServer, parse_request

one_line_error = partial(assert_one_line_error, command="infer")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    return make_checkpoint(root / "run", make_tokenizer(root / "tok"), seq_len=48)


@pytest.fixture(scope="module")
def engine(ckpt):
    return Engine.from_checkpoint(ckpt, "cpu")


def _serve(engine, api_key=None):
    server = CompletionServer(engine, "tiny", "127.0.0.1", 0, api_key)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def server(engine):
    s = _serve(engine)
    yield s
    s.shutdown()
    s.server_close()


def call(server, path, body=None, key=None, raw: bytes | None = None):
    """(status, headers, body bytes) of one request."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method="GET" if data is None else "POST")
    req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_completion_is_the_engines_text(server, engine):
    status, _, body = call(server, "/v1/completions", {"prompt": "The tide", "max_tokens": 12, "temperature": 0})
    assert status == 200
    r = json.loads(body)
    want = engine.generate("The tide", GenerationParams(12, SamplingParams(0.0)))
    assert r["object"] == "text_completion" and r["model"] == "tiny"
    assert r["choices"][0]["text"] == want.text and r["choices"][0]["index"] == 0
    assert r["choices"][0]["finish_reason"] == ("length" if want.finish_reason == "length" else "stop")
    prompt_tokens = len(engine.encode_prompt("The tide"))
    assert r["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": want.tokens,
                          "total_tokens": prompt_tokens + want.tokens}


def test_stream_pieces_join_to_the_whole_completion(server):
    body = {"prompt": ["A kettle"], "max_tokens": 20, "temperature": 0.9, "top_k": 20, "seed": 7}
    whole = json.loads(call(server, "/v1/completions", body)[2])
    status, headers, raw = call(server, "/v1/completions", {**body, "stream": True})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"] == whole["usage"]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"] != whole["id"]  # one id per completion


def test_models_lists_the_one_model(server):
    status, _, body = call(server, "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["tiny"]


@pytest.mark.parametrize("body, status, param", [
    ({"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ({"prompt": "x", "n": 2}, 400, "n"),
    ({"prompt": "x", "logprobs": 5}, 400, "logprobs"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "stop": ["", "y"]}, 400, "stop"),
    ({"prompt": "word " * 100}, 400, "prompt"),  # longer than the model's context
])
def test_bad_requests_are_refused_with_the_field(server, body, status, param):
    code, _, raw = call(server, "/v1/completions", body)
    err = json.loads(raw)["error"]
    assert code == status and err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert param in err["message"]  # as the request spells it: max_tokens, not the engine's max_new_tokens


def test_bad_json_and_unknown_paths(server):
    code, _, raw = call(server, "/v1/completions", raw=b"{not json")
    assert code == 400 and "not valid JSON" in json.loads(raw)["error"]["message"]
    assert call(server, "/v1/chat/completions", {"messages": []})[0] == 404
    assert call(server, "/v2/models")[0] == 404
    assert call(server, "/v1/completions", {"prompt": "ok", "max_tokens": 2})[0] == 200  # still serving


def test_a_shared_secret_guards_every_request(engine):
    server = _serve(engine, api_key="s3cret")
    try:
        assert call(server, "/v1/models")[0] == 401
        assert call(server, "/v1/completions", {"prompt": "x", "max_tokens": 1}, key="wrong")[0] == 401
        assert call(server, "/v1/completions", {"prompt": "x", "max_tokens": 1}, key="s3cret")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(UserError, match="TSCALE_API_KEY"):
        CompletionServer(engine, "tiny", "0.0.0.0", 0, None)  # other hosts could reach it: a secret is required


def test_parse_request_defaults_follow_openai():
    prompt, params, stream = parse_request({"prompt": "hi"})
    assert (prompt, params.max_new_tokens, params.sampling.temperature, params.stop, stream) == ("hi", 16, 1.0, (), False)
    _, params, _ = parse_request({"prompt": "hi", "stop": "\n", "seed": 3, "model": "anything", "n": 1})
    assert params.stop == ("\n",) and params.seed == 3


def test_cli_serve_options(ckpt, monkeypatch):
    one_line_error(CliRunner().invoke(main, ["infer", str(ckpt), "--serve", "--prompt", "x"]), "--serve")
    monkeypatch.delenv("TSCALE_API_KEY", raising=False)
    one_line_error(CliRunner().invoke(main, ["infer", str(ckpt), "--serve", "--host", "0.0.0.0"]), "TSCALE_API_KEY")


def test_concurrent_requests_are_all_answered(server):
    results = []

    def ask(seed):
        results.append(call(server, "/v1/completions", {"prompt": "Numbers", "max_tokens": 10, "seed": seed}))

    threads = [threading.Thread(target=ask, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(r[0] for r in results) == [200] * 4
    assert len({json.loads(r[2])["choices"][0]["text"] for r in results}) > 1  # each its own seed, generated apart


@pytest.mark.parametrize("length, status", [("-5", 400), ("many", 400), (str(1 << 21), 413)])
def test_bad_content_length_is_refused_not_waited_on(server, length, status):
    import socket

    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
        head = sock.recv(4096).decode()
    assert head.startswith(f"HTTP/1.1 {status} "), head
