"""The fp8 / int8 products' paths: which one fp8_mm / int8_mm takes (CPU), and the cuBLASLt kernels against float64 (CUDA)."""

import pytest
import torch

from tscale.ops import lowprec
from tscale.ops.backend import op_defined
from tscale.ops.lowprec import fp8_mm, int8_mm, product_paths, quantize

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
BF16_RTOL = 2.0 ** -8 + 2.0 ** -20  # one rounding to bf16 of a value already within a few fp32 ulps
MODEL_SHAPES = [(M, K, N) for M in (16, 256, 4096) for K, N in ((768, 2304), (1600, 6400), (6400, 1600))]


def rand(*shape, seed=0, device="cpu"):
    """Random values, never zero, with row magnitudes spread over two decades."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    x = torch.where(x.abs() < 1e-3, torch.full_like(x, 1e-3), x)
    rows = 10 ** (torch.rand(shape[0], 1, generator=g) * 2 - 1)  # (M, 1) in [0.1, 10]
    return (x * rows).to(device)


def operands(M, K, N, dtype, rowwise, seed=0, device="cpu", b_dtype=None):
    """a (M, K), b (K, N) column-major (the transpose of a (N, K) weight) and their scales, as the layers make them."""
    axis = -1 if rowwise else None
    qa, sa = quantize(rand(M, K, seed=seed, device=device), dtype, axis)  # (M, K), () | (M, 1)
    qw, sw = quantize(rand(N, K, seed=seed + 1, device=device) * 0.05, b_dtype or dtype, axis)  # (N, K), () | (N, 1)
    return qa, qw.t(), sa, (sw if sw.dim() == 0 else sw.t())


# ---- path selection (CPU) -----------------------------------------------------------------------------------


def test_path_setting_is_read_from_the_environment(monkeypatch):
    for value in lowprec.GEMM_PATHS:
        monkeypatch.setenv("TSCALE_LOWPREC_GEMM", value.upper())
        assert lowprec.gemm_path_setting() == value
    monkeypatch.delenv("TSCALE_LOWPREC_GEMM")
    assert lowprec.gemm_path_setting() == "auto"
    monkeypatch.setenv("TSCALE_LOWPREC_GEMM", "cutlas")
    with pytest.raises(ValueError, match="TSCALE_LOWPREC_GEMM"):
        int8_mm(*operands(4, 16, 16, INT8, True), torch.float32)


@pytest.mark.parametrize("setting, int8_paths, fp8_paths", [
    ("auto", ["torch", "reference"], ["reference"]),
    ("cutlass", ["reference"], ["reference"]),
    ("cublaslt", ["reference"], ["reference"]),
    ("torch", ["torch", "reference"], ["reference"]),
    ("reference", ["reference"], ["reference"]),
])
def test_cpu_paths_never_include_the_cuda_kernels(monkeypatch, setting, int8_paths, fp8_paths):
    monkeypatch.setenv("TSCALE_LOWPREC_GEMM", setting)
    assert not lowprec._cublaslt_ok("int8", *operands(32, 64, 48, INT8, True)[:2], torch.bfloat16)
    assert not lowprec._cutlass_ok("int8", *operands(32, 64, 48, INT8, True)[:2], torch.bfloat16)
    assert product_paths("int8", *operands(32, 64, 48, INT8, True), torch.bfloat16) == int8_paths
    assert product_paths("fp8", *operands(32, 64, 48, E4M3, True), torch.bfloat16) == fp8_paths


@pytest.mark.parametrize("setting", lowprec.GEMM_PATHS)
def test_every_setting_gives_the_same_products_on_cpu(monkeypatch, setting):
    monkeypatch.setenv("TSCALE_LOWPREC_GEMM", setting)
    for dtype, mm in ((INT8, int8_mm), (E4M3, fp8_mm)):
        for rowwise in (False, True):
            a, b, sa, sb = operands(24, 64, 40, dtype, rowwise, seed=3)
            want = (a.double() @ b.double()) * sa.double() * sb.double()
            torch.testing.assert_close(mm(a, b, sa, sb, torch.float32).double(), want, rtol=1e-5, atol=1e-5)


def test_a_path_that_raises_is_logged_once_and_skipped_from_then_on(monkeypatch, caplog):
    monkeypatch.delenv("TSCALE_LOWPREC_GEMM", raising=False)
    monkeypatch.setattr(lowprec, "_failed", set())
    monkeypatch.setattr(lowprec, "_fallbacks_said", set())
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("no algorithm\nsecond line")

    monkeypatch.setitem(lowprec._PATHS["int8"], "torch", broken)
    a, b, sa, sb = operands(32, 64, 48, INT8, True, seed=4)
    want = lowprec.int8_mm_reference(a, b, sa, sb, torch.float32)
    for _ in range(3):
        torch.testing.assert_close(int8_mm(a, b, sa, sb, torch.float32), want)
    assert len(calls) == 1
    assert product_paths("int8", a, b, sa, sb, torch.float32) == ["reference"]
    assert sum("no algorithm" in r.message for r in caplog.records) == 1


def _rows_operands(dtype, seed):
    """a (M, K), w (N, K) and their row scales (M, 1), (N, 1): scaled_mm_rows's operands."""
    qa, sa = quantize(rand(24, 64, seed=seed), dtype, -1)
    qw, sw = quantize(rand(40, 64, seed=seed + 1) * 0.05, dtype, -1)
    return qa, qw, sa, sw


@pytest.mark.parametrize("dtype", [INT8, E4M3])
def test_scaled_mm_rows_later_calls_take_the_first_calls_path(monkeypatch, dtype):
    """The first call of a problem chooses the path; later calls skip the choice and give the same product."""
    monkeypatch.delenv("TSCALE_LOWPREC_GEMM", raising=False)
    monkeypatch.setattr(lowprec, "_row_plans", {})
    a, w, sa, sw = _rows_operands(dtype, seed=6)
    want = (a.double() @ w.double().t()) * sa.double() * sw.double().t()  # (M, N)
    choices = []
    full = lowprec._product
    monkeypatch.setattr(lowprec, "_product", lambda *args: choices.append(1) or full(*args))
    for _ in range(3):
        torch.testing.assert_close(lowprec.scaled_mm_rows(a, w, sa, sw, torch.float32).double(), want,
                                   rtol=1e-5, atol=1e-5)
    assert len(choices) == 1 and len(lowprec._row_plans) == 1
    monkeypatch.setenv("TSCALE_LOWPREC_GEMM", "reference")  # another setting is another problem: chosen again
    torch.testing.assert_close(lowprec.scaled_mm_rows(a, w, sa, sw, torch.float32).double(), want, rtol=1e-5, atol=1e-5)
    assert len(choices) == 2 and len(lowprec._row_plans) == 2


def test_scaled_mm_rows_plan_that_raises_falls_back_for_good(monkeypatch):
    monkeypatch.delenv("TSCALE_LOWPREC_GEMM", raising=False)
    monkeypatch.setattr(lowprec, "_row_plans", {})
    a, w, sa, sw = _rows_operands(INT8, seed=8)
    want = lowprec.scaled_mm_rows(a, w, sa, sw, torch.float32)  # makes the plan
    (key,) = lowprec._row_plans
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("operands in a layout the kernel refuses")

    lowprec._row_plans[key] = broken
    for _ in range(3):
        torch.testing.assert_close(lowprec.scaled_mm_rows(a, w, sa, sw, torch.float32), want)
    assert len(calls) == 1 and lowprec._row_plans[key] is None


@pytest.mark.skipif(not op_defined("fp8_gemm"), reason="tscale._C built without the GEMM op schemas")
def test_fake_implementations_give_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a8, b8 = torch.empty(48, 64, dtype=E4M3), torch.empty(32, 64, dtype=E4M3).t()
        ai, bi = torch.empty(48, 64, dtype=INT8), torch.empty(32, 64, dtype=INT8).t()
        sa, sb = torch.empty(48, 1), torch.empty(1, 32)
        out = torch.ops.tscale.fp8_gemm(a8, b8, sa, sb, torch.bfloat16)
        assert out.shape == (48, 32) and out.dtype == torch.bfloat16
        out = torch.ops.tscale.int8_gemm(ai, bi, sa, sb, torch.float32)
        assert out.shape == (48, 32) and out.dtype == torch.float32
        out = torch.ops.tscale.int8_gemm_i32(ai, bi)
        assert out.shape == (48, 32) and out.dtype == torch.int32


# ---- CUDA: our cuBLASLt kernels against float64 (run on the GPU machine) -------------------------------------


@pytest.fixture
def cuda_kernels():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert lowprec._gemm_kernel_on("cuda"), (
        "tscale._C was built without the cuBLASLt GEMMs (setup.py prints whether it found cuBLASLt)")


def exact(a, b, sa, sb):
    """float64 (a @ b) * sa * sb, and the float64 sum of the terms' magnitudes times the scales."""
    a64, b64 = a.double(), b.double()
    scale = sa.double() * sb.double()
    return (a64 @ b64) * scale, (a64.abs() @ b64.abs()) * scale


def assert_fp8_close(out, a, b, sa, sb, rtol=BF16_RTOL, accum=2.0 ** -10):
    """|out - exact| <= rtol |exact| + accum * sum|terms|: the output rounding plus fp32 accumulation, no more."""
    want, magnitude = exact(a, b, sa, sb)
    err = (out.double() - want).abs()
    bound = rtol * want.abs() + accum * magnitude
    assert (err <= bound).all(), f"worst excess {(err - bound).max().item():.3g}, max |err| {err.max().item():.3g}"


@pytest.mark.parametrize("M, K, N", MODEL_SHAPES)
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
@pytest.mark.parametrize("fuse", [True, False], ids=["epilogue", "scaling-pass"])
def test_fp8_gemm_matches_float64(cuda_kernels, M, K, N, rowwise, fuse):
    a, b, sa, sb = operands(M, K, N, E4M3, rowwise, seed=M + K, device="cuda")
    out = torch.ops.tscale.fp8_gemm(a, b, sa.contiguous(), sb.contiguous(), torch.bfloat16, fuse, False)
    assert out.shape == (M, N) and out.dtype == torch.bfloat16
    assert_fp8_close(out, a, b, sa, sb)


@pytest.mark.parametrize("a_dtype, b_dtype", [(E5M2, E4M3), (E4M3, E5M2)])
def test_fp8_gemm_mixes_e5m2_gradients_with_e4m3(cuda_kernels, a_dtype, b_dtype):
    a, b, sa, sb = operands(256, 1600, 768, a_dtype, False, seed=5, device="cuda", b_dtype=b_dtype)
    assert_fp8_close(torch.ops.tscale.fp8_gemm(a, b, sa, sb, torch.bfloat16), a, b, sa, sb)


@pytest.mark.parametrize("out_dtype, rtol", [(torch.float32, 2.0 ** -22), (torch.float16, 2.0 ** -11 + 2.0 ** -20)])
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_fp8_gemm_other_output_dtypes(cuda_kernels, out_dtype, rtol, rowwise):
    a, b, sa, sb = operands(256, 768, 2304, E4M3, rowwise, seed=6, device="cuda")
    out = torch.ops.tscale.fp8_gemm(a, b, sa.contiguous(), sb.contiguous(), out_dtype)
    assert out.dtype == out_dtype
    assert_fp8_close(out, a, b, sa, sb, rtol=rtol)


def test_fp8_gemm_one_scale_with_a_vector_and_fast_accumulation(cuda_kernels):
    a, b, _, sb = operands(256, 1600, 6400, E4M3, True, seed=7, device="cuda")
    sa = torch.tensor(0.037, device="cuda")
    assert_fp8_close(torch.ops.tscale.fp8_gemm(a, b, sa, sb.contiguous(), torch.bfloat16), a, b, sa, sb)
    fast = torch.ops.tscale.fp8_gemm(a, b, sa, sb.contiguous(), torch.bfloat16, True, True)
    assert_fp8_close(fast, a, b, sa, sb, rtol=2.0 ** -7, accum=2.0 ** -8)


@pytest.mark.parametrize("M, K, N", MODEL_SHAPES)
def test_int8_gemm_int32_sums_are_exact(cuda_kernels, M, K, N):
    a, b, _, _ = operands(M, K, N, INT8, True, seed=M + N, device="cuda")
    got = torch.ops.tscale.int8_gemm_i32(a, b)
    assert got.dtype == torch.int32 and got.shape == (M, N)
    assert torch.equal(got.long(), (a.double() @ b.double()).long())  # float64 sums of int8 products are exact


@pytest.mark.parametrize("M, K, N", MODEL_SHAPES)
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_int8_gemm_scales_the_exact_sums_once(cuda_kernels, M, K, N, rowwise):
    a, b, sa, sb = operands(M, K, N, INT8, rowwise, seed=M + K + N, device="cuda")
    want = exact(a, b, sa, sb)[0]
    out = torch.ops.tscale.int8_gemm(a, b, sa.contiguous(), sb.contiguous(), torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), want, rtol=BF16_RTOL, atol=0.0)
    out32 = torch.ops.tscale.int8_gemm(a, b, sa.contiguous(), sb.contiguous(), torch.float32)
    torch.testing.assert_close(out32.double(), want, rtol=4 * 2.0 ** -24, atol=0.0)


def test_int8_gemm_one_scale_with_a_vector(cuda_kernels):
    a, b, _, sb = operands(256, 768, 2304, INT8, True, seed=8, device="cuda")
    sa = torch.tensor(0.011, device="cuda")
    want = exact(a, b, sa, sb)[0]
    out = torch.ops.tscale.int8_gemm(a, b, sa, sb.contiguous(), torch.float16)
    # fp16: half an ulp relative, or half the subnormal spacing (2^-25) for the tiniest products
    torch.testing.assert_close(out.double(), want, rtol=2.0 ** -11 + 2.0 ** -20, atol=2.0 ** -25)


@pytest.mark.parametrize("M", [1, 5, 33])
def test_small_batches_are_right_or_refused_cleanly(cuda_kernels, M):
    """Decoding multiplies a few tokens at a time; cuBLASLt may have no algorithm, which must raise, not mislead."""
    for dtype in (E4M3, INT8):
        for rowwise in (False, True):
            a, b, sa, sb = operands(M, 768, 2304, dtype, rowwise, seed=9, device="cuda")
            mm = fp8_mm if dtype == E4M3 else int8_mm
            assert_fp8_close(mm(a, b, sa, sb, torch.float32), a, b, sa, sb, rtol=1e-6)  # whichever path ran
            op = torch.ops.tscale.fp8_gemm if dtype == E4M3 else torch.ops.tscale.int8_gemm
            try:
                out = op(a, b, sa.contiguous(), sb.contiguous(), torch.float32)
            except RuntimeError as e:
                assert "no" in str(e) and "algorithm" in str(e), str(e)
                continue
            assert_fp8_close(out, a, b, sa, sb, rtol=1e-6, accum=2.0 ** -10 if dtype == E4M3 else 1e-9)


def test_entry_checks_name_the_problem(cuda_kernels):
    a, b, sa, sb = operands(64, 768, 2304, E4M3, True, device="cuda")
    with pytest.raises(RuntimeError, match="column-major"):
        torch.ops.tscale.fp8_gemm(a, b.contiguous(), sa.contiguous(), sb.contiguous(), torch.bfloat16)
    with pytest.raises(RuntimeError, match="multiples of 16"):
        torch.ops.tscale.fp8_gemm(a[:, :760], b[:760], sa.contiguous(), sb.contiguous(), torch.bfloat16)
    with pytest.raises(RuntimeError, match="scale_b"):
        torch.ops.tscale.fp8_gemm(a, b, sa.contiguous(), sb[:, :10].contiguous(), torch.bfloat16)
    with pytest.raises(RuntimeError, match="e5m2 x e5m2"):
        torch.ops.tscale.fp8_gemm(a.view(E5M2), b.view(E5M2), sa.contiguous(), sb.contiguous(), torch.bfloat16)
    with pytest.raises(RuntimeError, match="int8"):
        torch.ops.tscale.int8_gemm_i32(a, b)


def test_autotuner_tunes_once_then_hits_its_cache(cuda_kernels):
    a, b, sa, sb = operands(48, 112, 144, INT8, True, seed=10, device="cuda")  # a shape no other test uses
    entries, tuned, hits, untimed = torch.ops.tscale.lowprec_gemm_stats()[:4]
    torch.ops.tscale.int8_gemm(a, b, sa.contiguous(), sb.contiguous(), torch.bfloat16)
    after_first = torch.ops.tscale.lowprec_gemm_stats()
    assert after_first[0] == entries + 1 and after_first[1] + after_first[3] == tuned + untimed + 1
    for _ in range(2):
        torch.ops.tscale.int8_gemm(a, b, sa.contiguous(), sb.contiguous(), torch.bfloat16)
    after = torch.ops.tscale.lowprec_gemm_stats()
    assert after[0] == after_first[0] and after[1] == after_first[1] and after[2] == after_first[2] + 2


def test_rowwise_fp8_scales_run_in_the_epilogue_on_hopper(cuda_kernels):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the outer-vector scale mode is documented for compute capability 9.0")
    a, b, sa, sb = operands(4096, 1600, 6400, E4M3, True, seed=14, device="cuda")
    before = torch.ops.tscale.lowprec_gemm_stats()[4]
    assert_fp8_close(torch.ops.tscale.fp8_gemm(a, b, sa.contiguous(), sb.contiguous(), torch.bfloat16), a, b, sa, sb)
    assert torch.ops.tscale.lowprec_gemm_stats()[4] == before, (
        "cuBLASLt offered no outer-vector algorithm: rowwise fp8 took the scaling pass (right values, slower)")


def test_the_layers_products_take_our_kernels(cuda_kernels, monkeypatch):
    monkeypatch.delenv("TSCALE_LOWPREC_GEMM", raising=False)
    failed_before = set(lowprec._failed)
    for dtype, mm in ((E4M3, fp8_mm), (INT8, int8_mm)):
        for rowwise in (False, True):
            a, b, sa, sb = operands(4096, 1600, 6400, dtype, rowwise, seed=11, device="cuda")
            first = "cutlass" if dtype == INT8 and lowprec._cutlass_ok("int8", a, b, torch.bfloat16) else "cublaslt"
            assert product_paths("fp8" if dtype == E4M3 else "int8", a, b, sa, sb, torch.bfloat16)[0] == first
            out = mm(a, b, sa, sb, torch.bfloat16)
            want = exact(a, b, sa, sb)[0]
            assert ((out.double() - want).norm() / want.norm()).item() < 5e-3
    assert lowprec._failed == failed_before  # nothing fell back


def test_ops_trace_under_torch_compile(cuda_kernels):
    a, b, sa, sb = operands(256, 768, 2304, E4M3, True, seed=12, device="cuda")
    ai, bi, sai, sbi = operands(256, 768, 2304, INT8, True, seed=13, device="cuda")
    sa, sb, sai, sbi = (s.contiguous() for s in (sa, sb, sai, sbi))

    def f(a, b, sa, sb, ai, bi, sai, sbi):
        return (torch.ops.tscale.fp8_gemm(a, b, sa, sb, torch.bfloat16).float()
                + torch.ops.tscale.int8_gemm(ai, bi, sai, sbi, torch.bfloat16).float())

    args = (a, b, sa, sb, ai, bi, sai, sbi)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(*args), f(*args))


# ---- CUDA: the CUTLASS int8 products with their scales in the epilogue (tscale._C_cutlass) -------------------


@pytest.fixture
def cutlass_int8():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("needs a GPU of compute capability 8.0 or newer")
    if not lowprec._cutlass_kernels():
        pytest.skip("tscale._C_cutlass not built (setup.py builds it where CUTLASS is found: pip install nvidia-cutlass)")


CUTLASS_SHAPES = [*MODEL_SHAPES, (32, 768, 2304), (33, 768, 2304), (64, 768, 2304), (65, 768, 2304),
                  (1, 1600, 6400), (333, 784, 520)]


@pytest.mark.parametrize("op", ["int8_scaled_mm_sm80", "int8_scaled_mm_sm90"])
@pytest.mark.parametrize("M, K, N", CUTLASS_SHAPES)
@pytest.mark.parametrize("rowwise", [False, True], ids=["tensorwise", "rowwise"])
def test_cutlass_int8_products_scale_the_exact_sums_once(cutlass_int8, op, M, K, N, rowwise):
    """Each kernel's tile configurations (small and large M), partial tiles, one scale or a vector of them."""
    if op.endswith("sm90") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a kernel needs compute capability 9.0")
    a, b, sa, sb = operands(M, K, N, INT8, rowwise, seed=M + K + N + 1, device="cuda")
    want = exact(a, b, sa, sb)[0]
    sa_v = sa.reshape(-1).expand(M).contiguous()  # (M,)
    sb_v = sb.reshape(-1).expand(N).contiguous()  # (N,)
    out = getattr(torch.ops.tscale, op)(a, b, sa_v, sb_v)
    assert out.shape == (M, N) and out.dtype == torch.bfloat16
    # int32 sums exact; fp32 (sum * sa) * sb: two roundings of 2^-24; then one to bf16
    torch.testing.assert_close(out.double(), want, rtol=BF16_RTOL + 2 * 2.0 ** -24, atol=0.0)



@pytest.mark.parametrize("config", [1, 2, 3])
@pytest.mark.parametrize("M, K, N", [(16384, 1600, 4800), (333, 784, 520), (1, 1600, 6400)])
def test_cutlass_candidate_configurations_match_the_exact_sums(cutlass_int8, config, M, K, N):
    """The Hopper kernel's other configurations (TSCALE_CUTLASS_CANDIDATES=1 builds): the same result rules."""
    if torch.cuda.get_device_capability() != (9, 0) or not op_defined("int8_scaled_mm_sm90_candidate"):
        pytest.skip("needs compute capability 9.0 and a build with TSCALE_CUTLASS_CANDIDATES=1")
    a, b, sa, sb = operands(M, K, N, INT8, True, seed=M + config, device="cuda")
    out = torch.ops.tscale.int8_scaled_mm_sm90_candidate(a, b, sa.reshape(-1).contiguous(), sb.reshape(-1).contiguous(),
                                                         config)
    torch.testing.assert_close(out.double(), exact(a, b, sa, sb)[0], rtol=BF16_RTOL + 2 * 2.0 ** -24, atol=0.0)

def test_cutlass_int8_product_is_the_layers_path_and_refuses_bad_operands(cutlass_int8, monkeypatch):
    monkeypatch.delenv("TSCALE_LOWPREC_GEMM", raising=False)
    a, b, sa, sb = operands(256, 1600, 6400, INT8, True, seed=14, device="cuda")
    assert product_paths("int8", a, b, sa, sb, torch.bfloat16)[0] == "cutlass"
    assert product_paths("int8", a, b, sa, sb, torch.float32)[0] == "cublaslt"  # bf16 results only
    out = int8_mm(a, b, sa, sb, torch.bfloat16)
    torch.testing.assert_close(out.double(), exact(a, b, sa, sb)[0], rtol=BF16_RTOL + 2 * 2.0 ** -24, atol=0.0)
    with pytest.raises(RuntimeError, match="column-major"):
        torch.ops.tscale.int8_scaled_mm_sm80(a, b.contiguous(), sa.reshape(-1), sb.reshape(-1).contiguous())
    with pytest.raises(RuntimeError, match="scale_b"):
        torch.ops.tscale.int8_scaled_mm_sm80(a, b, sa.reshape(-1), sb.reshape(-1)[:-1].contiguous())
