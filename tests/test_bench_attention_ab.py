"""attention_ab_summary.py: the per-tree summary of an attention_ab.sh call, from its profiles and model logs."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
import attention_ab_summary  # noqa: E402

FWD = "void tscale::attn::(anonymous namespace)::attention_fwd_kernel<128, 1, 3>(tscale::attn::(a"
BWD = "void tscale::attn::(anonymous namespace)::attention_bwd_kernel<128>(tscale::attn::(anonymo"
DQ = "void tscale::attn::(anonymous namespace)::attention_bwd_dq_kernel<128>(tscale::attn::(anon"


def _profile(out: Path, tree: str, round_: int, fwd: float, bwd: float, dq: float) -> None:
    """A profile-<tree>-<round>.json as attention_profile.py writes it (milliseconds per call, by kernel)."""
    calls = {"T1024_local": {FWD: fwd, BWD: bwd, DQ: dq}, "T1024_sdpa_causal": {"flash_fwd": 0.2, "flash_bwd": 0.3}}
    record = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "commit": "abc1234", "profiles": calls}
    (out / f"profile-{tree}-{round_}.json").write_text(json.dumps(record))


def test_summary_averages_rounds_per_tree_and_reads_the_model_ratios(tmp_path):
    (tmp_path / "model-new").mkdir()
    _profile(tmp_path, "new", 1, fwd=0.140, bwd=0.300, dq=0.080)
    _profile(tmp_path, "new", 2, fwd=0.144, bwd=0.310, dq=0.078)
    _profile(tmp_path, "attn-main", 1, fwd=0.150, bwd=0.320, dq=0.079)
    _profile(tmp_path, "attn-main", 2, fwd=0.150, bwd=0.330, dq=0.079)
    (tmp_path / "model-new" / "results.json").write_text(json.dumps({"attention": {
        "1024": {"tscale_s": 10.15e-3, "sdpa_s": 7.39e-3}, "4096": {"tscale_s": 18.23e-3, "sdpa_s": 19.50e-3}}}))
    summary = attention_ab_summary.summarize(tmp_path)
    assert summary["gpu"] == "NVIDIA H200" and set(summary["trees"]) == {"new", "attn-main"}
    new = summary["trees"]["new"]
    assert new["rounds"] == 2
    assert new["masks"]["T1024_local"] == {"call_us": pytest.approx(526.0), "fwd_us": pytest.approx(142.0),
                                           "bwd_us": pytest.approx(305.0)}
    assert new["masks"]["T1024_sdpa_causal"] == {"call_us": pytest.approx(500.0), "fwd_us": 0.0, "bwd_us": 0.0}
    assert new["model"] == {"attention_ratio_T1024": pytest.approx(1.373, abs=1e-3),
                            "attention_ratio_T4096": pytest.approx(0.935, abs=1e-3)}
    base = summary["trees"]["attn-main"]
    assert base["masks"]["T1024_local"]["bwd_us"] == pytest.approx(325.0)
    assert base["model"] == {}  # its model run left no results: no ratios rather than a guess


def test_summary_counts_the_hopper_kernels_as_main_kernels(tmp_path):
    ws = "void tscale::attn::(anonymous namespace)::attention_fwd_sm90_ws_kernel<128, 2, false>(tscale::attn"
    sm90 = "void tscale::attn::(anonymous namespace)::attention_bwd_sm90_kernel<1, 2, true, true>(tscale::attn::(a"
    calls = {"T4096_causal": {ws: 0.5, sm90: 1.5, DQ: 0.04}}
    (tmp_path / "profile-bwd-sm90-1-1-1-2.json").write_text(json.dumps({"profiles": calls}))
    masks = attention_ab_summary.summarize(tmp_path)["trees"]["bwd-sm90-1-1-1"]["masks"]
    assert masks["T4096_causal"] == {"call_us": pytest.approx(2040.0), "fwd_us": pytest.approx(500.0),
                                     "bwd_us": pytest.approx(1500.0)}


def test_summary_of_a_folder_without_profiles_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="attention_ab.sh"):
        attention_ab_summary.summarize(tmp_path)
