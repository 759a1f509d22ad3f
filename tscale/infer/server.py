"""The HTTP server of `tscale infer --serve`: OpenAI-compatible completions from one model.

Endpoints: `POST /v1/completions` (whole or streamed as server-sent events) and `GET /v1/models`.
Standard library only (http.server); requests are accepted concurrently and generate one at a
time (one model, one device), in arrival order. It binds 127.0.0.1 unless told otherwise; an
address other hosts can reach needs a shared secret (the TSCALE_API_KEY environment variable),
which every request must then send as `Authorization: Bearer <key>`.

Request body, as OpenAI's completions: `prompt` (a string, or a list holding one string),
`max_tokens` (default 16), `temperature` (default 1; 0 = greedy), `top_p`, `stop` (a string or a
list), `seed`, `stream`, and `top_k` (an extension; 0 = off). `model`, `user`, `stream_options`
are accepted and ignored; `n` and `best_of` must be 1, `logprobs` null, `echo` false, `suffix`
null, `presence_penalty` / `frequency_penalty` 0 and `logit_bias` empty: a request asking for
what this server does not do is refused (400) rather than answered differently, as is any
other field. Errors come as `{"error": {"message", "type", "param", "code"}}`.
"""

import hmac
import ipaddress
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tscale.errors import UserError
from tscale.infer.engine import Engine, GenerationParams
from tscale.infer.sampling import SamplingParams, SettingError

API_KEY_ENV = "TSCALE_API_KEY"
IGNORED = ("model", "user", "stream_options")
FIXED = {"n": (1, None), "best_of": (1, None), "logprobs": (None,), "echo": (False,), "suffix": (None,),
         "presence_penalty": (0, None), "frequency_penalty": (0, None), "logit_bias": (None, {})}
TUNED = ("prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream")
MAX_BODY = 1 << 20  # bytes


class RequestError(Exception):
    """A request this server refuses: HTTP status, message and the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def request_key(field: str) -> str:
    """A generation setting's name in a completions request: max_new_tokens is max_tokens there."""
    return "max_tokens" if field == "max_new_tokens" else field


def parse_request(body: dict) -> tuple[str, GenerationParams, bool]:
    """(prompt, generation parameters, stream) of a completions request; RequestError names a bad field."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    for key in body:
        if key not in (*TUNED, *IGNORED, *FIXED):
            raise RequestError(400, f"unrecognized request argument supplied: {key}", key)
    for key, allowed in FIXED.items():
        if key in body and body[key] not in allowed:
            raise RequestError(400, f"{key} = {body[key]!r} is not supported by this server "
                                    f"(allowed: {', '.join(map(repr, allowed))})", key)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError(400, "prompt must be a string or a list of one string", "prompt")
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not (isinstance(stop, (list, tuple)) and all(isinstance(s, str) and s for s in stop)):
        raise RequestError(400, "stop must be a non-empty string or a list of them", "stop")

    def number(key: str, default, kind=(int, float)):
        value = body.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, kind):
            raise RequestError(400, f"{key} must be a {'integer' if kind is int else 'number'}", key)
        return value

    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(400, "seed must be an integer", "seed")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "stream must be true or false", "stream")
    sampling = SamplingParams(float(number("temperature", 1.0)), number("top_k", 0, int), float(number("top_p", 1.0)))
    params = GenerationParams(number("max_tokens", 16, int), sampling, tuple(stop), seed)
    try:
        params.check(spell=request_key)
    except SettingError as e:
        raise RequestError(400, str(e), request_key(e.key)) from None
    return prompt, params, stream


def require_secret(host: str, api_key: str | None) -> None:
    """UserError unless `host` is a loopback address or a shared secret is set."""
    if not is_loopback(host) and not api_key:
        raise UserError(f"--host {host}: serving beyond this machine needs a shared secret; set {API_KEY_ENV} "
                        f"(clients send it as 'Authorization: Bearer <key>')")


class CompletionServer(ThreadingHTTPServer):
    """Serves `engine` at host:port (port 0: any free one) until shutdown(); one generation at a time."""

    daemon_threads = True

    def __init__(self, engine: Engine, model_id: str, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None):
        require_secret(host, api_key)
        self.engine, self.model_id, self.api_key = engine, model_id, api_key
        self.generating = threading.Lock()
        try:
            super().__init__((host, port), _Handler)
        except OSError as e:
            raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: CompletionServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.server.model_id, "object": "model",
                                                          "created": 0, "owned_by": "tscale"}]})
        else:
            self._error(RequestError(404, f"no such endpoint: GET {self.path}", kind="not_found_error"))

    def do_POST(self) -> None:
        if not self._authorized():
            return
        if self.path.rstrip("/") != "/v1/completions":
            self._error(RequestError(404, f"no such endpoint: POST {self.path} (this server has /v1/completions)",
                                     kind="not_found_error"))
            return
        try:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise RequestError(400, "Content-Length is not a number") from None
            if not 0 <= length <= MAX_BODY:
                raise RequestError(413 if length > 0 else 400, f"request body of {length} bytes; at most {MAX_BODY}")
            try:
                body = json.loads(self.rfile.read(length) or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(400, f"the request body is not valid JSON ({e})") from None
            prompt, params, stream = parse_request(body)
            try:
                ids = self.server.engine.encode_prompt(prompt)
            except UserError as e:
                raise RequestError(400, str(e), "prompt") from None
        except RequestError as e:
            self._error(e)
            return
        record = _Record(self.server.model_id, len(ids))
        with self.server.generating:
            if stream:
                self._stream(prompt, ids, params, record)
            else:
                c = self.server.engine.generate(prompt, params, ids)
                self._json(200, record(c.text, _finish(c.finish_reason), c.tokens))

    def _stream(self, prompt: str, ids: list[int], params: GenerationParams, record: "_Record") -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        stream = self.server.engine.stream(prompt, params, ids)
        try:
            for piece in _events(record, stream):
                self.wfile.write(piece)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client left: stop generating
            return

    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None:
            return True
        given = self.headers.get("Authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), key.encode()):
            return True
        self._error(RequestError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                                 kind="authentication_error"))
        return False

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status >= 400:  # the request's body may be unread: do not parse it as the next request
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _error(self, e: RequestError) -> None:
        self._json(e.status, {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": None}})


class _Record:
    """The response objects of one completion: the same id and time on every chunk of a stream."""

    def __init__(self, model_id: str, prompt_tokens: int):
        self.id, self.created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        self.model_id, self.prompt_tokens = model_id, prompt_tokens

    def __call__(self, text: str, finish: str | None, completion_tokens: int | None = None) -> dict:
        rec = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_id,
               "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
        if completion_tokens is not None:
            rec["usage"] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": self.prompt_tokens + completion_tokens}
        return rec


def _finish(reason: str) -> str:
    """The engine's finish reason as OpenAI names it: "eos" and "stop" are both "stop"."""
    return "length" if reason == "length" else "stop"


def _events(record: _Record, stream) -> Iterator[bytes]:
    """Server-sent events of a TextStream: a chunk per piece, one with the finish reason and usage, then [DONE]."""
    for piece in stream:
        yield b"data: " + json.dumps(record(piece, None), ensure_ascii=False).encode() + b"\n\n"
    c = stream.completion
    yield b"data: " + json.dumps(record("", _finish(c.finish_reason), c.tokens)).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


__all__ = ["API_KEY_ENV", "CompletionServer", "RequestError", "is_loopback", "parse_request", "require_secret"]
