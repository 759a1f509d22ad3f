"""The architecture benchmark's curve arithmetic: loss crossings, training time from metrics records, merging; attention timing."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
import attention_cost  # noqa: E402
import curves  # noqa: E402
import report_architecture  # noqa: E402
from common import write_record  # noqa: E402
from helpers_attention_runs import tiny_step_benchmark_inputs  # noqa: E402


def test_crossing_interpolates_between_the_evaluations_around_the_target():
    curve = [(10.0, 5.0), (20.0, 4.0), (30.0, 3.0), (40.0, 2.5)]
    assert curves.crossing(curve, 3.5) == pytest.approx(25.0)
    assert curves.crossing(curve, 3.0) == pytest.approx(30.0)  # reached exactly at an evaluation
    assert curves.crossing(curve, 2.75) == pytest.approx(35.0)
    assert curves.crossing(curve, 2.0) is None  # never reached
    assert curves.crossing(curve, 6.0) == 10.0  # already below at the first evaluation: its x, an upper bound


def test_crossing_takes_the_first_time_a_noisy_curve_gets_there():
    curve = [(1.0, 4.0), (2.0, 3.0), (3.0, 3.4), (4.0, 2.9)]  # dips to 3.0, rises, then falls below
    assert curves.crossing(curve, 3.2) == pytest.approx(1.8)


def _records(rates: list[float], per_step: int = 100, every: int = 10, vals: dict | None = None) -> list[dict]:
    """Log records every `every` steps at the given tokens/s, plus val records {step: loss}."""
    out = []
    for i, rate in enumerate(rates, start=1):
        out.append({"step": i * every, "loss": 5.0, "tokens": i * every * per_step, "tokens_per_s": rate,
                    "elapsed_s": 0.0})
        if vals and i * every in vals:
            out.append({"step": i * every, "val_loss": vals[i * every]})
    return out


def test_training_time_sums_each_interval_at_its_own_rate():
    records = _records([500.0, 1000.0, 1000.0])  # 1000 tokens per interval
    times = curves.train_time_curve(records)
    assert times == [(0.0, 0.0), (1000.0, 2.0), (2000.0, 3.0), (3000.0, 4.0)]
    assert curves.interpolate(times, 2500.0) == pytest.approx(3.5)
    assert curves.steady_tokens_per_s(records, skip_tokens=1000) == pytest.approx(1000.0)
    assert curves.steady_tokens_per_s(records) == pytest.approx(750.0)  # 3000 tokens in 4 s
    with pytest.raises(ValueError):
        curves.interpolate(times, 3500.0)


def test_training_time_can_count_the_compile_interval_at_the_next_rate():
    records = _records([100.0, 1000.0, 500.0])  # the first interval compiled: 10 s for 1000 tokens
    assert curves.train_time_curve(records, compile_in_first=True) == [(0.0, 0.0), (1000.0, 1.0), (2000.0, 2.0),
                                                                       (3000.0, 4.0)]
    assert curves.train_time_curve(records)[1] == (1000.0, 10.0)


def test_val_curve_counts_tokens_from_the_step():
    records = _records([1000.0] * 4, vals={20: 4.0, 40: 3.0})
    assert curves.val_curve(records) == [(2000, 4.0), (4000, 3.0)]
    assert curves.tokens_per_step(records) == 100


def _run(tmp_path: Path, name: str, records: list[dict], steps: int, planned: int) -> dict:
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {"run": str(run), "config": f"configs/{name}.toml", "overrides": ["optim.warmup_steps=2"],
            "ended": "end", "steps": steps, "planned_steps": planned, "wall_s": 10.0, "params": 3,
            "block_params": 2, "matmul_params": 2}


def test_report_measures_the_crossing_against_gpt2s_final_loss(tmp_path):
    # gpt2: 8 log intervals of 1000 tokens at 1000 tok/s (8 s), final val loss 3.0 at 8000 tokens.
    gpt2 = _run(tmp_path, "gpt2", _records([1000.0] * 8, vals={40: 3.5, 80: 3.0}), 80, 80)
    gpt2["final_val_loss"] = 3.0
    # tscale: twice as fast; val 3.2 at 2000 tokens, 2.8 at 3000: crosses 3.0 at 2500 tokens, 1.25 s.
    tscale = _run(tmp_path, "tscale", _records([2000.0] * 3, vals={10: 4.0, 20: 3.2, 30: 2.8}), 30, 40)
    metrics, notes = report_architecture.convergence_part({"gpt2": gpt2, "tscale": tscale})
    assert metrics["convergence_tokens_ratio"] == pytest.approx(2500 / 8000, abs=1e-4)
    assert metrics["convergence_time_ratio"] == pytest.approx(1.25 / 8.0, abs=1e-4)
    assert metrics["throughput_ratio"] == pytest.approx(2.0)
    assert "tscale reached it" in notes["convergence"]

    tscale["final_val_loss"] = None
    slow = _run(tmp_path, "slow", _records([2000.0] * 3, vals={30: 3.1}), 30, 40)
    metrics, notes = report_architecture.convergence_part({"gpt2": gpt2, "tscale": slow})
    assert "convergence_tokens_ratio" not in metrics and "did NOT reach it" in notes["convergence"]


def test_report_says_which_run_ties_its_embedding_to_the_head(tmp_path):
    """The parameter counts tell: an untied input table is a head-sized block outside the matrix products."""
    gpt2 = _run(tmp_path, "gpt2", _records([1000.0] * 8, vals={80: 3.0}), 80, 80)
    gpt2.update(final_val_loss=3.0, params=125_000_000, block_params=85_000_000, matmul_params=124_000_000)
    tscale = _run(tmp_path, "tscale", _records([2000.0] * 3, vals={30: 2.8}), 30, 40)
    tscale.update(params=163_000_000, block_params=85_000_000, matmul_params=124_000_000)  # + a 39M table
    _, notes = report_architecture.convergence_part({"gpt2": gpt2, "tscale": tscale})
    assert "125.00M (embedding tied to the head) vs 163.00M (untied" in notes["convergence"]
    tscale["params"] = 124_000_000
    _, notes = report_architecture.convergence_part({"gpt2": gpt2, "tscale": tscale})
    assert "untied" not in notes["convergence"]
    assert notes["convergence"].count("(embedding tied to the head)") == 2


def test_a_tscale_variant_changes_only_the_tscale_run_and_is_named_in_the_report(tmp_path):
    """architecture.py --tscale-set: the settings go last in tscale's run (they win), never into gpt2's, and the
    report's convergence paragraph names them beside the preset."""
    import architecture

    variant = ("model.sink=false", "optim.muon_lr=0.03")
    tscale_set = architecture.run_overrides(architecture.TINY, "tscale", tmp_path, 1.0, variant)
    assert tscale_set[-2:] == list(variant)
    assert not set(variant) & set(architecture.run_overrides(architecture.TINY, "gpt2", tmp_path, 1.0))
    gpt2 = _run(tmp_path, "gpt2", _records([1000.0] * 8, vals={40: 3.5, 80: 3.0}), 80, 80)
    gpt2["final_val_loss"] = 3.0
    tscale = _run(tmp_path, "tscale", _records([2000.0] * 3, vals={10: 4.0, 20: 3.2, 30: 2.8}), 30, 40)
    tscale["overrides"] = tscale_set
    tscale["variant"] = list(variant)
    _, notes = report_architecture.convergence_part({"gpt2": gpt2, "tscale": tscale})
    assert ("tscale (configs/tscale.toml + --set optim.warmup_steps=2 + --set optim.head_lr=0.01 + --set "
            "optim.embed_lr=0.075 + --set model.sink=false + --set optim.muon_lr=0.03, schedule") in notes["convergence"]


def _measured(tscale_s: float, path: str, **extra) -> dict:
    """One attention measurement at T 1024 as `architecture.py attention` records it, SDPA taking 4 ms."""
    return {"1024": {"tscale_s": tscale_s, "sdpa_s": 0.004, "windows": {"128": 9, "0": 3}, "batch_size": 32,
                     "docs_per_row": 1.5, "shape": [32, 6, 1024, 128], "dtype": "bfloat16", "sink": True,
                     "path": path, **extra}}


def test_report_keeps_the_other_parts_metrics(tmp_path):
    previous = {"metrics": {"convergence_tokens_ratio": 0.4, "throughput_ratio": 1.3, "attention_time_ratio_1024": 0.9},
                "notes": "[convergence] old run\n[attention] old attention"}
    (tmp_path / "architecture.json").write_text(json.dumps(previous))
    attention = _measured(0.002, "FlexAttention")
    metrics, notes, table, _ = report_architecture.build_report({"attention": attention}, tmp_path, None)
    assert metrics["convergence_tokens_ratio"] == 0.4 and metrics["throughput_ratio"] == 1.3
    assert metrics["attention_time_ratio_1024"] == pytest.approx(0.5)
    assert "[convergence] old run" in notes and "old attention" not in notes
    assert "attention_kernel.json absent" in notes
    assert "| attention_time_ratio_1024 | 0.5 | <= 0.5 | yes |" in table


def test_fa2_attention_is_reported_beside_the_headline_not_over_it(tmp_path):
    """A run of `architecture.py attention --attention fa2` adds attention_fa2_* and leaves attention_* alone."""
    previous = {"metrics": {"attention_time_ratio_1024": 0.9}, "notes": "[attention] the default op"}
    (tmp_path / "architecture.json").write_text(json.dumps(previous))
    fa2 = _measured(0.001, "FlashAttention-2")
    metrics, notes, table, _ = report_architecture.build_report({"attention_fa2": fa2}, tmp_path, None)
    assert metrics["attention_time_ratio_1024"] == 0.9 and metrics["attention_fa2_time_ratio_1024"] == pytest.approx(0.25)
    assert "[attention] the default op" in notes and "[attention_fa2]" in notes and "FlashAttention-2" in notes
    assert "| attention_fa2_time_ratio_1024 | 0.25 | | |" in table


def test_fa2_global_attention_and_fa2_attention_keep_each_others_metrics(tmp_path):
    """attention_fa2_global_* share attention_fa2_'s prefix: measuring either replaces only its own keys."""
    previous = {"metrics": {"attention_time_ratio_1024": 0.9, "attention_fa2_time_ratio_1024": 0.8}, "notes": ""}
    (tmp_path / "architecture.json").write_text(json.dumps(previous))
    mixed = _measured(0.003, "FlashAttention-2 in the global layers")
    metrics, notes, _, _ = report_architecture.build_report({"attention_fa2_global": mixed}, tmp_path, None)
    assert metrics["attention_fa2_time_ratio_1024"] == 0.8 and metrics["attention_time_ratio_1024"] == 0.9
    assert metrics["attention_fa2_global_time_ratio_1024"] == pytest.approx(0.75)
    assert "[attention_fa2_global]" in notes
    (tmp_path / "architecture.json").write_text(json.dumps({"metrics": metrics, "notes": notes}))
    mixed["1024"]["tscale_s"] = 0.002
    metrics, _, _, _ = report_architecture.build_report({"attention_fa2": mixed}, tmp_path, None)
    assert metrics["attention_fa2_global_time_ratio_1024"] == pytest.approx(0.75)
    assert metrics["attention_fa2_time_ratio_1024"] == pytest.approx(0.5)


def test_report_keeps_other_scripts_paragraphs_and_the_first_parts_header(tmp_path):
    """A report of attention alone keeps the paragraphs arch_speed.py / arch_profile.py merged into the record and
    the header (date, commit, GPU, torch) of its convergence part; the attention note carries its own stamp."""
    previous = {"date": "2026-01-02", "commit": "aaa111", "gpu": "H200", "torch": "2.11", "command": "python a.py",
                "metrics": {"x": 1},
                "notes": "[convergence] old run\n[run] how\n\narch speed (arch_speed.py): (stamp) rates\n\n"
                         "profile (arch_profile.py): (stamp) kernels"}
    (tmp_path / "architecture.json").write_text(json.dumps(previous))
    attention = _measured(0.002, "kernel", stamp="2026-02-03, H200, torch 2.11, commit bbb222")
    metrics, notes, _, header = report_architecture.build_report({"attention": attention}, tmp_path, None)
    assert header == {"date": "2026-01-02", "commit": "aaa111", "gpu": "H200", "torch": "2.11", "command": "python a.py"}
    assert notes.endswith("\n\narch speed (arch_speed.py): (stamp) rates\n\nprofile (arch_profile.py): (stamp) kernels")
    assert "[attention] (2026-02-03, H200, torch 2.11, commit bbb222) forward + backward" in notes
    assert "[convergence] old run" in notes and metrics["x"] == 1
    _, _, _, header = report_architecture.build_report({"convergence": {}, "attention": attention}, tmp_path, None)
    assert header == {"command": "python a.py"}  # this machine's date, commit, GPU and torch; earlier commands kept
    record = json.loads(write_record("architecture", metrics, notes, tmp_path, header=header).read_text())
    assert record["command"].startswith("python a.py; python ") and record["commit"] != "aaa111"


def test_report_names_the_per_call_sums_beside_the_step_headline(tmp_path):
    attention = _measured(0.002, "kernel", tscale_per_call_s=0.003, sdpa_per_call_s=0.004)
    metrics, notes, _, _ = report_architecture.build_report({"attention": attention}, tmp_path, None)
    assert metrics["attention_time_ratio_1024"] == pytest.approx(0.5)
    assert metrics["attention_per_call_time_ratio_1024"] == pytest.approx(0.75)
    assert metrics["attention_per_call_ms_tscale_1024"] == pytest.approx(3.0)
    assert "one backward through all of them" in notes


def test_step_timing_runs_every_forward_then_one_backward_through_all(monkeypatch):
    """time_step: each step calls the op once per recorded call, then autograd once, with every call's q, k, v."""
    g = torch.Generator().manual_seed(0)
    calls = [{"q": torch.randn(1, 2, 8, 4, generator=g), "k": torch.randn(1, 2, 8, 4, generator=g),
              "v": torch.randn(1, 2, 8, 4, generator=g), "doc_ids": None, "window": w, "sink": True, "scale": 0.5}
             for w in (4, 0, 4)]
    forwards, backwards = [], []

    def op(q, k, v, doc_ids, window, sink, scale):  # (B, T, H, D) leaves, like the real ops' first arguments
        forwards.append(window)
        return (q * k).sum(-1, keepdim=True) * v * scale

    real_grad = torch.autograd.grad

    def counting_grad(outputs, inputs, grad_outputs):
        backwards.append((len(outputs), len(inputs)))
        grads = real_grad(outputs, inputs, grad_outputs)
        assert all(g_ is not None and torch.isfinite(g_).all() and g_.abs().sum() > 0 for g_ in grads)
        return grads

    monkeypatch.setattr(attention_cost.torch.autograd, "grad", counting_grad)
    seconds = attention_cost.time_step(op, calls, torch.device("cpu"), repeats=2, warmup=1)
    assert seconds > 0
    assert forwards == [4, 0, 4] + [4, 0, 4] * 3  # one call each to make dO, then warm-up + 2 timed steps
    assert backwards == [(3, 9)] * 3


def test_step_cost_profiles_the_kernels_of_each_side_when_asked():
    """attention_step_cost(profile_steps=N): per side, the time of each op or kernel a profiled step runs (on the CPU
    the ops' own time), beside the timings; without it, no profile."""
    model, idx = tiny_step_benchmark_inputs()
    cost = attention_cost.attention_step_cost(model, idx, None, repeats=1, compile_ops=False, warmup=1, profile_steps=2)
    for side in ("tscale", "sdpa"):
        times = cost[f"{side}_kernels_ms"]
        assert times and all(ms >= 0 for ms in times.values()) and sum(times.values()) > 0
        assert list(times.values()) == sorted(times.values(), reverse=True)
    assert any("scaled_dot_product" in name for name in cost["sdpa_kernels_ms"])
    assert any("tscale::attention" in name for name in cost["tscale_kernels_ms"])
    plain = attention_cost.attention_step_cost(model, idx, None, repeats=1, compile_ops=False, warmup=1)
    assert "tscale_kernels_ms" not in plain and plain["tscale_s"] > 0


def test_every_benchmark_preset_loads_with_the_settings_its_name_promises():
    """arch_speed.py's presets: each config loads with its overrides; the name's parts are what the settings set."""
    import arch_speed

    for name in arch_speed.PRESETS:
        cfg = arch_speed.preset_config(name, ["model.seq_len=4096"])
        assert cfg.model.arch == ("gpt2" if name.startswith("gpt2") else "tscale")
        assert cfg.model.seq_len == 4096
        assert (cfg.train.attention == "cudnn") == ("_cudnn" in name and "cudnn_global" not in name)
        assert cfg.model.global_every == (6 if name.endswith("_g6") else 12 if name.endswith("_g12") else 4)
        assert cfg.model.window == (64 if "_w64" in name else 0 if name == "tscale_sdpa" else 128)
        assert cfg.model.sink == ("nosink" not in name and name != "tscale_sdpa")
        assert cfg.train.qkv_kernel == name.endswith("_qkv")
    assert set(arch_speed.ALSO) < set(arch_speed.PRESETS) and "gpt2" not in arch_speed.ALSO


def test_benchmark_presets_run_only_when_a_flag_chooses_them():
    """arch_speed.py runs gpt2 and tscale always, any other preset only on its flag, and every preset has one."""
    import arch_speed

    def selected(*flags):
        return arch_speed.selected_presets(arch_speed.build_parser().parse_args(["TOKENS", *flags]))

    assert selected() == ["gpt2", "tscale"]
    assert selected("--fa2", "--attention", "cudnn", "--also", "tscale_cudnn_g12") == [
        "gpt2", "tscale", "tscale_fa2", "tscale_cudnn", "tscale_cudnn_g12"]
    assert selected("--logits-loss") == ["gpt2_logits_loss", "gpt2", "tscale_logits_loss", "tscale"]
    every = selected("--attention", *arch_speed.ALTERNATIVES, "--fused-loss", "--logits-loss", "--sdpa-baseline",
                     "--also", *arch_speed.ALSO)
    assert every == list(arch_speed.PRESETS)


def test_sdpa_baseline_preset_runs_the_tscale_model_through_causal_sdpa(monkeypatch):
    """arch_profile's baseline of the attention-cost target: the preset's settings and environment make every
    layer of a tscale model plain causal SDPA, and the environment is restored after."""
    import arch_profile
    import arch_speed

    import tscale.ops.attention as attention_module
    from tscale.config import load_config
    from tscale.model import build_model

    monkeypatch.delenv("TSCALE_ATTENTION", raising=False)
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "tscale-tiny-cpu.toml",
                      [*arch_speed.PRESETS["tscale_sdpa"].overrides, "model.vocab_size=64", "model.eos_id=0"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    idx = torch.randint(0, 64, (2, 32))
    paths = []
    real = attention_module.attention_sdpa
    monkeypatch.setattr(attention_module, "attention_sdpa",
                        lambda *a, **kw: paths.append(kw["window"]) or real(*a, **kw))
    with arch_speed.preset_env("tscale_sdpa"):
        model(idx).float().sum().backward()
    assert paths == [0] * cfg.model.n_layer  # every layer, none windowed
    assert "TSCALE_ATTENTION" not in os.environ
    for name in ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16",
                 "void cudnn::fusion::compute_dot_do_o_specialized<true, 128>",
                 "void cudnn::fusion::convert_dq_to_16bits<true>", "tscale::attn::doc_stats_kernel(int const*",
                 "void tscale::attn::attention_bwd_dq_kernel<128>", "flash_bwd_dot_do_o_kernel"):
        assert arch_profile.group_of(name) == "attention", name
    assert arch_profile.group_of("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == "matmul"


def test_profile_rounds_alternate_the_order_and_average_each_kernel():
    import arch_profile
    import common

    assert common.round_orders(["a", "b", "c"], 3) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]
    mean = arch_profile.mean_table([{"k1": 2.0, "k2": 1.0}, {"k1": 4.0}])
    assert mean == {"k1": 3.0, "k2": 0.5}  # a kernel a round did not launch counts 0 there


def test_profile_reports_each_tscale_presets_attention_against_sdpa_over_rounds(monkeypatch, tmp_path):
    """arch_profile.py's report with the profiles stood in for: every tscale preset's in-step ratio, each round kept."""
    import json
    import sys

    import arch_profile

    attention = {"tscale_sdpa": 8.0, "tscale_cudnn": 6.0, "tscale": 11.0}
    calls = []

    def table(arch, *args, **kw):
        calls.append(arch)
        return {"cudnn_generated_fort_native_sdpa_kernel": attention[arch] + len(calls) % 2, "nvjet_sm90_gemm": 40.0}

    monkeypatch.setattr(arch_profile, "kernel_table", table)
    monkeypatch.setattr(arch_profile, "optimizer_ms", lambda arch: 6.5)
    monkeypatch.setattr(arch_profile.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(arch_profile.torch.cuda, "empty_cache", lambda: None)
    out = tmp_path / "profile.json"
    monkeypatch.setattr(sys, "argv", ["arch_profile.py", str(tmp_path), "--archs", "tscale_sdpa", "tscale_cudnn", "tscale",
                                      "--rounds", "2", "--out", str(out)])
    arch_profile.main()
    report = json.loads(out.read_text())
    assert calls == ["tscale_sdpa", "tscale_cudnn", "tscale", "tscale", "tscale_cudnn", "tscale_sdpa"]
    assert report["tscale_cudnn"]["attention_ms_per_round"] == [6.0, 7.0]  # calls 2 and 5
    assert report["attention_in_step_ratio_cudnn"] == round(6.5 / 8.5, 4)  # means over the rounds
    assert report["attention_in_step_ratio"] == round(11.5 / 8.5, 4)


def test_speed_runs_at_other_lengths_keep_their_own_paragraph():
    """arch_speed.py's record paragraph is named by the window length, so a run at 4096 leaves the 1024 one."""
    import arch_speed

    args = arch_speed.build_parser().parse_args(["tok", "--attention", "cudnn", "--steps", "20", "--warmup", "15"])
    short = arch_speed.speed_note(args, 32)
    args.seq_len = 4096
    long = arch_speed.speed_note(args, 8)
    assert short.split(":", 1)[0] == "arch speed (arch_speed.py)"
    assert long.split(":", 1)[0] == "arch speed at T 4096 (arch_speed.py --seq-len 4096)"
    assert "batch 8 x 4096" in long and "train.attention = cudnn" in long


def test_product_table_keys_products_by_shape_and_layout():
    """arch_profile.product_table: one row per operator, operand shapes and strides (a transposed operand is its own
    row), with the calls per profiled step; bias and batch operands are read at their own positions."""
    import arch_profile
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 8, generator=g), torch.randn(4, 8, generator=g)
    bias, batch = torch.randn(4, generator=g), torch.randn(3, 16, 8, generator=g)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):  # two "steps"
            torch.mm(x, w.t())
            torch.mm(x, w.t().contiguous())
            torch.addmm(bias, x, w.t())
            torch.bmm(batch, batch.transpose(1, 2))
    rows = arch_profile.product_table(prof.events(), active=2)
    assert rows["aten::mm [[16, 8], [8, 4]] strides [[8, 1], [1, 8]]"][0] == 1
    assert rows["aten::mm [[16, 8], [8, 4]] strides [[8, 1], [4, 1]]"][0] == 1
    assert rows["aten::addmm [[16, 8], [8, 4]] strides [[8, 1], [1, 8]]"][0] == 1
    assert rows["aten::bmm [[3, 16, 8], [3, 8, 16]] strides [[128, 8, 1], [128, 1, 8]]"][0] == 1
    assert len(rows) == 4
    mean = arch_profile.mean_products([{"k": [1.0, 2.0, 10.0]}, {"k": [1.0, 4.0, 5.0]}])
    assert mean["k"] == [1.0, 3.0, pytest.approx((20 + 20) / 2 / 3, abs=0.1)]  # GFLOP 20 + 20 over 3 ms mean


def test_product_table_takes_strides_by_id_or_leaves_them_out():
    """Where the events carry no strides (torch 2.11's FunctionEvent), the table takes them from strides_by_id, or
    keys the products by shapes alone."""
    import arch_profile
    from types import SimpleNamespace

    cpu = torch.autograd.DeviceType.CPU
    events = [SimpleNamespace(name="aten::mm", device_type=cpu, input_shapes=[[4, 2], [2, 3]], id=i,
                              device_time_total=1000.0) for i in (1, 2)]
    rows = arch_profile.product_table(events, active=1, strides_by_id={1: [[2, 1], [1, 2]]})
    assert rows == {"aten::mm [[4, 2], [2, 3]] strides [[2, 1], [1, 2]]": [1, 1.0, pytest.approx(48 / 1e9, abs=1e-3)],
                    "aten::mm [[4, 2], [2, 3]]": [1, 1.0, pytest.approx(0.0, abs=1e-3)]}


def test_kernel_tables_leave_out_the_spans_around_kernels():
    """With CPU activity recorded (--products), the profiler mirrors record_function ranges on the GPU's timeline;
    their time is their kernels' time again, so the kernel tables leave them out."""
    import arch_profile

    assert arch_profile.is_annotation("## Call CompiledFxGraph f7o4f546 ##")
    assert arch_profile.is_annotation("Optimizer.step#Muon.step")
    assert arch_profile.is_annotation("ProfilerStep#9")
    assert not arch_profile.is_annotation("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN")
    assert not arch_profile.is_annotation("Memcpy DtoD (Device -> Device)")


def test_screen_measures_variants_against_a_recorded_gpt2_run(tmp_path):
    """architecture.py screen: without a gpt2 run in the work folder the target is the record's; each variant's
    crossing is read from its own curve, and a variant that never gets there says so."""
    record = tmp_path / "architecture.json"
    record.write_text(json.dumps({"date": "2026-01-02", "commit": "abcdef012", "metrics": {
        "gpt2_final_val_loss": 3.0, "gpt2_train_s": 16.0, "gpt2_budget_tokens": 8000}}))
    target = report_architecture.screen_target({}, record)
    assert target["final_val_loss"] == 3.0 and "recorded" in target["source"]
    # 1000 tokens per log interval at 1000 tok/s; val 3.5 at 2000 tokens, 2.5 at 4000: crosses at 3000 (3 s)
    fast = _run(tmp_path, "fast", _records([1000.0] * 4, vals={20: 3.5, 40: 2.5}), 40, 40)
    fast["variant"] = ["model.sink=false"]
    slow = _run(tmp_path, "slow", _records([1000.0] * 4, vals={20: 3.8, 40: 3.2}), 40, 40)
    rows, table = report_architecture.screen_report({"screen-fast": fast, "screen-slow": slow}, target,
                                                    ["screen-fast", "screen-slow", "screen-missing"])
    assert rows[0]["crossing_tokens"] == 3000 and rows[0]["tokens_ratio"] == pytest.approx(3000 / 8000)
    assert rows[0]["crossing_train_s"] == pytest.approx(3.0) and rows[0]["time_ratio"] == pytest.approx(3 / 16)
    assert rows[1]["crossing_tokens"] is None and rows[1]["last_val_loss"] == 3.2
    assert rows[2]["ended"] == "no result"
    assert "model.sink=false" in table and "not reached" in table and "commit abcdef0" in table
    gpt2 = _run(tmp_path, "gpt2", _records([500.0] * 8, vals={80: 2.9}), 80, 80)
    gpt2["final_val_loss"] = 2.9
    own = report_architecture.screen_target({"gpt2": gpt2}, record)  # the work folder's own gpt2 run wins
    assert own["final_val_loss"] == 2.9 and own["budget_tokens"] == 8000 and own["train_s"] == pytest.approx(16.0)
    assert report_architecture.screen_target({}, tmp_path / "absent.json") is None


def test_a_screen_at_another_length_never_takes_a_target_of_1024(tmp_path):
    """--seq-len: the runs keep the tokens a step at the new length, the report records the length, and a screen's
    target is gpt2's run or record of that length only (a record without convergence_seq_len is of 1024)."""
    import architecture

    scale = dataclasses.replace(architecture.FULL, seq_len=4096, batch_size=8)
    overrides = architecture.run_overrides(scale, "gpt2", tmp_path, 0.5)
    assert "model.seq_len=4096" in overrides and "train.batch_size=8" in overrides
    record = tmp_path / "architecture.json"
    record.write_text(json.dumps({"date": "2026-01-02", "commit": "abcdef012", "metrics": {
        "gpt2_final_val_loss": 3.0, "gpt2_train_s": 16.0, "gpt2_budget_tokens": 8000}}))
    assert report_architecture.screen_target({}, record)["final_val_loss"] == 3.0
    assert report_architecture.screen_target({}, record, 4096) is None
    gpt2 = _run(tmp_path, "gpt2", _records([1000.0] * 8, vals={40: 3.5, 80: 3.0}), 80, 80)
    gpt2.update(final_val_loss=2.9, overrides=overrides)
    assert report_architecture.screen_target({"gpt2": gpt2}, record, 4096)["final_val_loss"] == 2.9
    assert report_architecture.screen_target({"gpt2": gpt2}, record)["final_val_loss"] == 3.0  # the T 1024 record
    tscale = _run(tmp_path, "tscale", _records([2000.0] * 3, vals={10: 4.0, 20: 3.2, 30: 2.8}), 30, 40)
    metrics, _ = report_architecture.convergence_part({"gpt2": gpt2, "tscale": tscale})
    assert metrics["convergence_seq_len"] == 4096


def test_seq_len_that_does_not_divide_the_step_is_refused(tmp_path):
    bench = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "architecture.py"
    done = subprocess.run([sys.executable, str(bench), "screen", "--tiny", "--work", str(tmp_path), "--name", "a",
                           "--seq-len", "48"], capture_output=True, text=True)
    assert done.returncode == 2 and "--seq-len 48: must divide the 128 tokens a step" in done.stderr
