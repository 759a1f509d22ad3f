"""The low-precision training benchmark's arithmetic and its merging into an existing record."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
import common  # noqa: E402
import lowprec_project  # noqa: E402
import lowprec_train  # noqa: E402
import merge_record  # noqa: E402


def test_rate_is_total_tokens_over_total_time_after_the_warmup():
    records = [{"step": 5, "tokens_per_s": 10.0}, {"step": 10, "tokens_per_s": 100.0},
               {"step": 15, "tokens_per_s": 300.0}, {"step": 15, "val_loss": 3.0}]
    assert lowprec_train.harmonic_rate(records, 5) == pytest.approx(2 / (1 / 100 + 1 / 300))
    with pytest.raises(SystemExit, match="raise --steps"):
        lowprec_train.harmonic_rate(records, 15)


def test_moved_check_names_the_parameters_a_timed_stretch_left_alone():
    """Snapshots at the first and last steps only; a parameter equal at both is reported."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    check = lowprec_train.MovedCheck(first=2, last=4)
    for step in range(1, 5):
        check(step, model)
        with torch.no_grad():
            model[1].weight.add_(0.1)  # trained; model[0] and model[1].bias stay where they are
    assert check.frozen == ["0.weight", "0.bias", "1.bias"]


def test_speedups_and_loss_differences_name_the_headline_recipes():
    rates = {"bf16": 1000.0, "fp8_tensorwise": 1400.0, "fp8_rowwise": 1300.0, "int8_switchback": 1250.0,
             "int8_rowwise": 1100.0}
    out = lowprec_train.speedups(rates, "1p5b")
    assert out["fp8_vs_bf16_train_speedup_1p5b"] == 1.4 and out["int8_vs_bf16_train_speedup_1p5b"] == 1.25
    assert out["train_tokens_per_s_fp8_rowwise_1p5b"] == 1300 and out["train_speedup_fp8_rowwise_1p5b"] == 1.3
    diffs = lowprec_train.quality_diffs({"bf16": 3.0, "fp8_tensorwise": 3.03, "int8_switchback": 2.97,
                                         "int8_rowwise": 2.97})
    assert diffs["fp8_val_loss_rel_diff"] == pytest.approx(0.01) and diffs["int8_val_loss_rel_diff"] == pytest.approx(-0.01)
    assert diffs["val_loss_rel_diff_int8_rowwise"] == pytest.approx(-0.01) and "val_loss_rel_diff_bf16" not in diffs
    assert "int8_vs_bf16_train_speedup_124m" not in lowprec_train.speedups({"int8_switchback": 5.0}, "124m")
    assert lowprec_train.speedups(rates, "1p5b")["train_speedup_int8_rowwise_1p5b"] == 1.1


def test_merge_keeps_other_metrics_and_replaces_its_own_paragraph(tmp_path):
    common.write_record("lp", {"gemm": 1.6}, "gemm part: products", tmp_path)
    common.merge_metrics("lp", {"speed": 1.1}, "speed (x): first", tmp_path)
    common.merge_metrics("lp", {"speed": 1.3}, "speed (x): second", tmp_path)
    record = json.loads((tmp_path / "lp.json").read_text())
    assert record["metrics"] == {"gemm": 1.6, "speed": 1.3}
    paragraphs = record["notes"].split("\n\n")
    assert paragraphs[0] == "gemm part: products" and len(paragraphs) == 2
    assert paragraphs[1].startswith("speed (x): (") and paragraphs[1].endswith("second")


def test_merge_drops_the_prefixes_it_is_told_to(tmp_path):
    common.write_record("ix", {"build": 6.4, "quality_a": 1.0, "ppl_reduction_raw": 0.1}, "build part: speed", tmp_path)
    common.merge_metrics("ix", {"ppl_reduction_raw": 0.3}, "quality (q): run", tmp_path,
                         drop_prefixes=("quality_", "ppl_reduction_"))
    assert json.loads((tmp_path / "ix.json").read_text())["metrics"] == {"build": 6.4, "ppl_reduction_raw": 0.3}



def test_merge_record_keeps_the_source_machine_and_commit(tmp_path):
    common.write_record("lp", {"gemm": 1.0, "speed": 0.5}, "gemm part: old products", tmp_path)
    src = tmp_path / "device" / "lp.json"
    src.parent.mkdir()
    src.write_text(json.dumps({"benchmark": "lp", "date": "2026-01-02", "commit": "abc1234", "gpu": "GPU X",
                               "torch": "9.9", "command": "python bench.py --out-dir /out", "notes": "gemm part: new",
                               "metrics": {"gemm": 2.0, "extra": 3.0}}))
    merge_record.merge_record(src, tmp_path, only=("gemm",), note="Beside another job.")
    record = json.loads((tmp_path / "lp.json").read_text())
    assert record["metrics"] == {"gemm": 2.0, "speed": 0.5}  # --only left "extra" out; "speed" kept
    assert record["notes"] == "gemm part: (2026-01-02, GPU X, torch 9.9, commit abc1234) new Beside another job."
    assert record["command"].endswith("; python bench.py --out-dir /out")
    fresh = tmp_path / "fresh"
    merge_record.merge_record(src, fresh)
    assert json.loads((fresh / "lp.json").read_text())["commit"] == "abc1234"
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a benchmark record"):
        merge_record.merge_record(tmp_path / "bad.json", tmp_path)

PROFILE = """
1p5b_qkv M=16384 K=1600 N=4800 bf16: 1.000 ms of kernels per step
     0.600 ms    1x  nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT
     0.300 ms    2x  void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>

1p5b_qkv M=16384 K=1600 N=4800 int8_rowwise: 0.900 ms of kernels per step
     0.200 ms    1x  sm90_xmma_gemm_i8i32_i8i32_i32_tn_n_tilesize64x256x128
     0.400 ms    1x  nvjet_sm90_tst_128x160_64x5_1x2_h_bz_NTT
     0.150 ms    1x  void tscale::(anonymous namespace)::scale_kernel<true, 1>(void const*
"""


def test_every_recipe_name_selects_a_valid_precision_config():
    from tscale.config import load_config

    for recipe in lowprec_train.RECIPES:
        cfg = load_config(None, lowprec_train.recipe_sets(recipe)).precision
        base = {lowprec_train.INT8_BACKWARD: "int8_rowwise", lowprec_train.FP8_FAST_ACCUM: "fp8_tensorwise",
                lowprec_train.FP8_IN_GRAPH: "fp8_tensorwise", lowprec_train.FP8_DELAYED: "fp8_tensorwise"}
        assert cfg.recipe == base.get(recipe, recipe)
        assert cfg.int8_backward == (recipe == lowprec_train.INT8_BACKWARD)
        assert cfg.fp8_fast_accum == (recipe == lowprec_train.FP8_FAST_ACCUM)
        assert cfg.quantize_in_graph == (recipe == lowprec_train.FP8_IN_GRAPH)
        assert (cfg.scaling == "delayed") == (recipe == lowprec_train.FP8_DELAYED)


def test_projection_scales_each_kernel_class_by_its_own_rate_ratio():
    times = lowprec_project.parse(PROFILE)
    assert times["bf16"] == pytest.approx({"bf16": 0.6, "fp8": 0.0, "int8": 0.0, "memory": 0.4})  # rows cut off: memory
    assert times["int8_rowwise"] == pytest.approx({"bf16": 0.4, "fp8": 0.0, "int8": 0.2, "memory": 0.3})
    h200, rtx = lowprec_project.RATES["H200"], lowprec_project.RATES["RTX 4090"]
    expected = (0.4 * h200["bf16"] / rtx["bf16"] + 0.2 * h200["int8"] / rtx["int8"]
                + 0.3 * h200["memory"] / rtx["memory"])
    assert lowprec_project.project(times["int8_rowwise"]) == pytest.approx(expected)
    assert lowprec_project.project(times["int8_rowwise"], "H200", "H200") == pytest.approx(0.9)
    assert lowprec_project.amdahl(2.0, 0.5) == pytest.approx(1 / 0.75)
    assert lowprec_project.kernel_class("nvjet_sm90_qqtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT") == "fp8"
    assert lowprec_project.kernel_class("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEE") == "int8"
    assert lowprec_project.kernel_class("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8") == "bf16"


def test_linear_share_of_a_step_moves_with_each_kinds_rate():
    """On the H200 the share is the profile's own; on a GPU whose bf16 rate falls more than its bandwidth, it grows."""
    kinds = {"matmul": 60.0, "attention": 10.0, "inductor": 20.0, "optimizer": 10.0}
    assert lowprec_project.linear_share(kinds, "H200", linear_fraction=1.0) == pytest.approx(0.6)
    h200, rtx = lowprec_project.RATES["H200"], lowprec_project.RATES["RTX 4090"]
    compute, memory = h200["bf16"] / rtx["bf16"], h200["memory"] / rtx["memory"]
    want = 60 * compute * 0.9 / (70 * compute + 30 * memory)
    assert lowprec_project.linear_share(kinds, "RTX 4090", linear_fraction=0.9) == pytest.approx(want)
    assert want > 0.6 * 0.9


def test_speed_run_stopped_part_way_keeps_the_recipes_it_measured(tmp_path, monkeypatch):
    """A time limit that stops the run during its second recipe leaves the first one's rate in the record."""
    real = lowprec_train.train_run
    calls = []

    def stopped_on_second(cfg, run_dir, **kw):
        calls.append(run_dir)
        if len(calls) == 2:
            raise KeyboardInterrupt("time limit")
        return real(cfg, run_dir, **kw)

    monkeypatch.setattr(lowprec_train, "train_run", stopped_on_second)
    args = type("Args", (), dict(tiny=True, sizes=None, steps=2, warmup=1, compile_mode="default",
                                 compile_block_once=False, grad_accum=1, recipes=["bf16", "int8_rowwise"]))()
    with pytest.raises(KeyboardInterrupt):
        lowprec_train.speed(args, tmp_path)
    record = json.loads((tmp_path / "lowprec.json").read_text())
    assert set(record["metrics"]) == {"train_tokens_per_s_bf16_tiny", "run_s_bf16_tiny"}
    assert record["metrics"]["train_tokens_per_s_bf16_tiny"] > 0 and record["metrics"]["run_s_bf16_tiny"] > 0
    assert record["notes"].endswith("measured: tiny bf16")


def test_speed_run_with_gradient_accumulation_labels_its_rates(tmp_path, monkeypatch):
    """--grad-accum N: every run takes N micro-batches a step (tokens/s counts them all) under its own label."""
    real, accums = lowprec_train.train_run, []

    def recording(cfg, run_dir, **kw):
        accums.append(cfg.train.grad_accum)
        return real(cfg, run_dir, **kw)

    monkeypatch.setattr(lowprec_train, "train_run", recording)
    args = type("Args", (), dict(tiny=True, sizes=None, steps=2, warmup=1, compile_mode="default",
                                 compile_block_once=False, grad_accum=2, recipes=["bf16"]))()
    lowprec_train.speed(args, tmp_path)
    record = json.loads((tmp_path / "lowprec.json").read_text())
    assert accums == [2] and set(record["metrics"]) == {"train_tokens_per_s_bf16_tiny_accum2", "run_s_bf16_tiny_accum2"}
    assert "train.grad_accum = 2" in record["notes"]


def test_step_profile_sorts_kernels_into_kinds():
    import lowprec_step_profile as sp

    kinds = {name: sp.kind_of(name) for name in (
        "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", "nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_TNT",
        "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEE",
        "void tscale::fp8::(anonymous namespace)::cast_tiles_vec_kernel<float>(float const*)",
        "triton_per_fused_native_layer_norm_0", "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<>",
        "pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "void at::native::elementwise_kernel<128>")}
    assert list(kinds.values()) == ["matmul", "lowp_matmul", "lowp_matmul", "quantize", "inductor", "optimizer",
                                    "attention", "other"]
    table = sp.summary({"nvjet_sm90_tst_a": 6.0, "triton_poi_fused_b": 3.0, "elementwise_c": 1.0}, top=2)
    assert table["kernel_ms_per_step"] == 10.0 and table["product_share"] == 0.6
    assert [name for name, _ in table["top_kernels_ms_per_step"]] == ["nvjet_sm90_tst_a", "triton_poi_fused_b"]
