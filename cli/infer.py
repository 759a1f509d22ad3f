"""`tscale infer`: checkpoint + prompt(s) -> completion on stdout, prompts JSONL -> completions JSONL, or an HTTP server."""

import os
import sys

import click

from tscale.devices import resolve_device
from tscale.errors import UserError
from tscale.infer import (Engine, GenerationParams, SamplingParams, check_new_output, flag_name, read_requests,
                          write_completions)
from tscale.infer.server import API_KEY_ENV, CompletionServer, require_secret
from tscale.precision import INFER_MODES
from tscale.terminal import console


@click.command("infer")
@click.argument("ckpt", type=click.Path())
@click.option("--prompt", help="Complete this text and stream the completion to stdout (\"\" starts from end-of-text).")
@click.option("--prompts", "prompts_file", type=click.Path(), help="JSONL file, one {\"prompt\": ...} per line (needs --out).")
@click.option("--out", type=click.Path(), help="JSONL file to create with one completion per prompt line.")
@click.option("--max-new-tokens", type=int, default=200, show_default=True, help="Most tokens to generate per prompt.")
@click.option("--temperature", type=float, default=0.8, show_default=True, help="Sampling temperature; 0 = greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="Sample among the k most likely tokens; 0 = off.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Sample from the smallest set with this much probability; 1 = off.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed; the same seed gives the same output.")
@click.option("--stop", multiple=True, help="Stop when the text contains this string (not included); repeatable.")
@click.option("--index", "index_dir", type=click.Path(),
              help="Index folder to look contexts up in; needed by (and only allowed for) a model trained with the token index.")
@click.option("--draft-index", type=click.Path(),
              help="Index folder (any index of the model's tokenizer) whose continuation of the context is proposed as "
              "draft tokens, checked by the model in the same forward pass: fewer passes, greedy output unchanged, "
              "sampled output equally distributed.")
@click.option("--draft-tokens", type=int, default=8, show_default=True, help="Most draft tokens per forward pass.")
@click.option("--draft-min-match", type=int, default=4, show_default=True,
              help="Draft only while the context matches at least this many tokens in the draft index.")
@click.option("--draft-dominance", type=float, default=4.0, show_default=True,
              help="Draft a token only if it followed the context at least this many times as often as the runner-up.")
@click.option("--serve", is_flag=True,
              help="Serve OpenAI-compatible completions over HTTP (POST /v1/completions, GET /v1/models) until "
              f"interrupted; requests carry their own sampling settings. Any --host but loopback needs {API_KEY_ENV}.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address --serve listens on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port --serve listens on (0: any free port).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--precision", type=click.Choice(INFER_MODES), default="bf16", show_default=True,
              help="Linear layers: as trained, int8/fp8 weights (-w), or int8/fp8 weights and activations. On a CPU "
              "int8 generates fastest and fp8 modes run about 4x slower (emulated).")
@click.option("--quantize-head", is_flag=True,
              help="Convert the head too (its own copy where it is tied to the embedding): int8 generation 1.7x "
              "faster at 124M on a 2-core CPU; weight-only modes slower there.")
def infer(ckpt, prompt, prompts_file, out, max_new_tokens, temperature, top_k, top_p, seed, stop, index_dir,
          draft_index, draft_tokens, draft_min_match, draft_dominance, serve, host, port, device, precision,
          quantize_head) -> None:
    """Generate text with the model of CKPT (a checkpoint folder, or a run folder for its newest checkpoint)."""
    if (prompt is not None) + (prompts_file is not None) + serve != 1:
        raise UserError("give exactly one of --prompt TEXT, --prompts FILE.jsonl and --serve")
    if prompts_file is not None and out is None:
        raise UserError("--prompts needs --out FILE.jsonl for the completions")
    if prompt is not None and out is not None:
        raise UserError("--out goes with --prompts; a single --prompt streams to stdout")
    params = GenerationParams(max_new_tokens, SamplingParams(temperature, top_k, top_p), tuple(stop), seed)
    params.check(spell=flag_name)
    err = console(stderr=True)

    def load() -> Engine:
        return Engine.from_checkpoint(ckpt, resolve_device(device, "--device"), precision, index_dir, draft_index,
                                      draft_tokens, draft_min_match, draft_dominance, quantize_head)

    def drafts(c) -> str:
        return f", {c.passes} passes, {c.accepted} of {c.drafted} draft tokens kept" if draft_index is not None else ""

    if serve:
        if out is not None:
            raise UserError("--out goes with --prompts, not --serve")
        key = os.environ.get(API_KEY_ENV) or None
        require_secret(host, key)  # before the model loads (CompletionServer checks it again for library callers)
        server = CompletionServer(load(), os.path.basename(os.path.normpath(ckpt)), host, port, key)
        err.print(f"serving {ckpt} at {server.url} (POST /v1/completions, GET /v1/models); Ctrl-C stops")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            err.print("stopped")
        finally:
            server.server_close()
        return
    if prompts_file is not None:
        requests = read_requests(prompts_file, params)
        check_new_output(out)
        engine = load()

        def report(i, c):
            err.print(f"[{i + 1}/{len(requests)}] {c.tokens} tokens, {c.finish_reason}{drafts(c)}")

        write_completions(engine, requests, out, on_done=report)
        err.print(f"{len(requests)} completion(s) -> {out}")
        return
    engine = load()
    stream = engine.stream(prompt, params)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    c = stream.completion
    err.print(f"[{c.tokens} tokens, finish: {c.finish_reason}{drafts(c)}]", style="dim")

