"""Low-precision ops: fused quantize (amax + scale + cast, optionally transposed) and fp8 / int8 matrix products.

quantize(x (M, K) float, dtype, axis=None, transpose=False)
    dtype: torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8
    axis None: one scale for the tensor, scale ()
    axis -1 (or 1): one scale per row, scale (M, 1)
    axis 0: one scale per column, scale (1, K)
    -> (q (M, K) dtype, scale float32), plus q_t (K, M) = q.t() contiguous when transpose is set.
    x ~= q * scale (broadcast), scale = max(amax, AMAX_FLOOR) / QMAX[dtype], q = cast(x * (QMAX / amax)):
    fp8 saturates to +-QMAX and rounds to nearest even; int8 rounds to nearest even and clamps to +-127.
quantize_delayed(x (M, K) float, dtype, state, transpose=False)
    one scale per tensor from the amax of the tensor's earlier calls (delayed scaling), kept in `state`
    (int32 (history + 2,), zeros at first; quantize_delayed_reference has the rules): the cast reads x once.
fp8_mm(a (M, K) fp8, b (K, N) fp8, scale_a () | (M, 1), scale_b () | (1, N), out_dtype, fast_accum=False) -> (M, N)
    fast_accum: the hardware's fp8 fast accumulation (fewer promotions of partial sums to fp32) where
    the path has it (ours, torch._scaled_mm); the reference is exact either way.
int8_mm(a (M, K) int8, b (K, N) int8, scale_a, scale_b, out_dtype) -> (M, N)
    out = (a @ b) * scale_a * scale_b: the scales are applied to the exact (int32 / fp32) sums.
    b is typically the transpose of a row-major (N, K) weight (column-major), as cuBLAS wants it.
scaled_mm_rows(a (M, K), b (N, K), scale_a (M, 1), scale_b (N, 1), out_dtype, fast_accum=False) -> (M, N)
    a @ b^T with both operands scaled per row; the torch custom op tscale::scaled_mm_rows.

References are plain torch (dequantise-and-matmul in fp32). quantize runs the tscale._C kernel
(csrc/fp8) when built. The products try these paths in order and take the first whose rules hold:
  cutlass    int8 only: tscale._C_cutlass's CUTLASS kernels (csrc/cutlass; TMA + wgmma on compute
             capability 9.0, mma.sync on 8.x; a bf16 result, K a multiple of 16, N of 8), the scales
             applied in their epilogue
  cublaslt   tscale._C's cuBLASLt kernels (csrc/fp8/gemm_cublaslt.cu; CUDA, K and N multiples of 16,
             fp8 on compute capability >= 8.9, int8 on >= 7.5): autotuned algorithms, fp8 scales in
             cuBLASLt's epilogue, int8 as exact int32 sums plus one fused scaling pass
  torch      torch._scaled_mm (CUDA, all dims multiples of 16; rowwise needs e4m3 and a bf16 result) /
             torch._int_mm (CUDA with M > 16 and K, N multiples of 8; and the CPU) with the scales after
  reference  the fp32 product of the quantised values, then the scales (the CPU's fp8)
The environment variable TSCALE_LOWPREC_GEMM picks the paths (for benchmarks and debugging):
  auto (default): cutlass, cublaslt, then torch, then the reference; cutlass / cublaslt / torch: only
  that one, then the reference; reference: always the reference. It is read at every call. A path
  that raises for a problem (shapes and dtypes) is logged once and skipped for that problem from
  then on.
"""

import functools
import logging
import os

import torch

from tscale.ops.backend import kernels_usable_on, op_defined

log = logging.getLogger("tscale.ops")

QMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0, torch.int8: 127.0}
AMAX_FLOOR = 1e-12  # an all-zero tensor or row gets a tiny scale and q = 0, never a division by zero
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _check_quantize_args(x: torch.Tensor, dtype: torch.dtype, axis: int | None) -> None:
    if x.dim() != 2:
        raise ValueError(f"quantize: x must be 2-D (M, K), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"quantize: x must be a float tensor, got {x.dtype}")
    if dtype not in QMAX:
        raise ValueError(f"quantize: dtype must be one of {list(QMAX)}, got {dtype}")
    if axis not in (None, 0, 1, -1):
        raise ValueError(f"quantize: axis must be None, 0, 1 or -1, got {axis}")


def quantize_reference(x: torch.Tensor, dtype: torch.dtype, axis: int | None = None,
                       transpose: bool = False) -> tuple[torch.Tensor, ...]:
    _check_quantize_args(x, dtype, axis)
    xf = x.float()  # (M, K)
    amax = xf.abs().amax() if axis is None else xf.abs().amax(dim=axis, keepdim=True)  # () | (M, 1) | (1, K)
    return _cast_reference(xf, amax, dtype, transpose)


def _cast_reference(xf: torch.Tensor, amax: torch.Tensor, dtype: torch.dtype, transpose: bool) -> tuple[torch.Tensor, ...]:
    """(q, scale[, q_t]) of xf (M, K) float32 for the given amax (broadcastable): values beyond it saturate."""
    qmax = QMAX[dtype]
    amax = amax.clamp(min=AMAX_FLOOR)
    qmax_t = torch.full_like(amax, qmax)  # tensor / tensor is one IEEE division (scalar / tensor is not)
    scale = amax / qmax_t
    y = xf * (qmax_t / amax)  # (M, K), within [-qmax, qmax] up to rounding
    if dtype == torch.int8:
        q = torch.round(y).clamp(-qmax, qmax).to(torch.int8)
    else:
        q = y.clamp(-qmax, qmax).to(dtype)
    if transpose:
        return q, scale, q.t().contiguous()
    return q, scale


def quantize_delayed_reference(x: torch.Tensor, dtype: torch.dtype, state: torch.Tensor,
                               transpose: bool = False) -> tuple[torch.Tensor, ...]:
    """The twin of tscale::quantize_delayed (one scale per tensor from earlier calls' amax); updates `state`.

    state: int32 (history + 2,), zeros at first; its first `history` entries are the bits of the amax
    (float32) of the last calls on this tensor, newest first, and the last two stay zero between calls.
    The scale is max(history) / QMAX, or x's own amax / QMAX while the history is empty (the first call);
    values beyond it saturate. Afterwards x's amax is shifted into the history. -> (q, scale[, q_t])
    """
    _check_quantize_args(x, dtype, None)
    _check_delayed_state(state, x)
    history = state.numel() - 2
    amaxes = state.view(torch.float32)  # (history + 2,): the history's float bits, then the two zeros
    xf = x.float()  # (M, K)
    fresh = xf.abs().amax()  # ()
    known = amaxes[:history].max()
    out = _cast_reference(xf, torch.where(known > 0, known, fresh), dtype, transpose)
    amaxes[:history].copy_(torch.cat([fresh.reshape(1), amaxes[:history - 1]]))
    state[history:].zero_()
    return out


def _check_delayed_state(state: torch.Tensor, x: torch.Tensor) -> None:
    if state.dtype != torch.int32 or state.dim() != 1 or not 3 <= state.numel() <= 258 or state.device != x.device:
        raise ValueError(f"quantize_delayed: state must be int32 (history + 2,) with history 1..256 on {x.device}, "
                         f"got {state.dtype} {tuple(state.shape)} on {state.device}")


@functools.cache
def _quantize_kernel_on(device_type: str, op: str = "quantize") -> bool:
    """Whether tscale._C has a kernel of tscale::`op` for this device type (an older build may lack the op)."""
    if not kernels_usable_on(device_type):
        return False
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"tscale::{op}", device_type.upper())
    except RuntimeError:  # the build predates the op
        return False


def quantize_delayed(x: torch.Tensor, dtype: torch.dtype, state: torch.Tensor,
                     transpose: bool = False) -> tuple[torch.Tensor, ...]:
    """(q, scale[, q_t]) with delayed scaling, `state` updated in place; see quantize_delayed_reference."""
    if _quantize_kernel_on(x.device.type, "quantize_delayed"):
        _check_quantize_args(x, dtype, None)
        q, scale, q_t = torch.ops.tscale.quantize_delayed(x, dtype, state, transpose)
        return (q, scale, q_t) if transpose else (q, scale)
    return quantize_delayed_reference(x, dtype, state, transpose)


def quantize(x: torch.Tensor, dtype: torch.dtype, axis: int | None = None,
             transpose: bool = False) -> tuple[torch.Tensor, ...]:
    """(q, scale), or (q, scale, q_t) with transpose; see the module docstring."""
    if _quantize_kernel_on(x.device.type):
        _check_quantize_args(x, dtype, axis)
        q, scale, q_t = torch.ops.tscale.quantize(x, dtype, axis, transpose)
        return (q, scale, q_t) if transpose else (q, scale)
    return quantize_reference(x, dtype, axis, transpose)


def _scaled_product_reference(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                              out_dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast(a.device.type, enabled=False):
        acc = a.float() @ b.float()  # (M, N) fp32 sums of the dequantised-free products
    return (acc * scale_a.float() * scale_b.float()).to(out_dtype)


def fp8_mm_reference(a, b, scale_a, scale_b, out_dtype):
    return _scaled_product_reference(a, b, scale_a, scale_b, out_dtype)


def int8_mm_reference(a, b, scale_a, scale_b, out_dtype):
    return _scaled_product_reference(a, b, scale_a, scale_b, out_dtype)


def _check_mm_args(name: str, a, b, scale_a, scale_b, dtypes) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"{name}: expected (M, K) @ (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype not in dtypes or b.dtype not in dtypes:
        raise ValueError(f"{name}: operands must be {dtypes}, got {a.dtype} and {b.dtype}")
    M, N = a.shape[0], b.shape[1]
    if scale_a.numel() != 1 and tuple(scale_a.shape) != (M, 1):
        raise ValueError(f"{name}: scale_a must be () or ({M}, 1), got {tuple(scale_a.shape)}")
    if scale_b.numel() != 1 and tuple(scale_b.shape) != (1, N):
        raise ValueError(f"{name}: scale_b must be () or (1, {N}), got {tuple(scale_b.shape)}")


GEMM_PATHS = ("auto", "cutlass", "cublaslt", "torch", "reference")
LT_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_fallbacks_said: set[str] = set()
_paths_said: set[tuple[str, str]] = set()
_failed: set[tuple] = set()  # (path, problem) pairs that raised once


def gemm_path_setting() -> str:
    """TSCALE_LOWPREC_GEMM: "auto" (default), "cutlass", "cublaslt", "torch" or "reference"."""
    value = os.environ.get("TSCALE_LOWPREC_GEMM", "").strip().lower() or "auto"
    if value not in GEMM_PATHS:
        raise ValueError(f"TSCALE_LOWPREC_GEMM={value!r}: expected one of {', '.join(GEMM_PATHS)}")
    return value


def _fallback(what: str, err: Exception) -> None:
    if what not in _fallbacks_said:
        _fallbacks_said.add(what)
        log.warning("ops: %s failed (%s); using the next path for it", what, str(err).splitlines()[0])


@functools.cache
def _gemm_kernel_on(device_type: str) -> bool:
    """Whether tscale._C has the cuBLASLt product kernels for this device type (built with CUDA and cuBLASLt)."""
    if device_type != "cuda" or not kernels_usable_on("cuda"):
        return False
    try:
        return all(torch._C._dispatch_has_kernel_for_dispatch_key(f"tscale::{op}", "CUDA")
                   for op in ("fp8_gemm", "int8_gemm"))
    except RuntimeError:  # the build predates the ops
        return False


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.cache
def _cutlass_kernels() -> bool:
    """Whether tscale._C_cutlass (int8 products with their scales in the epilogue) is built and loads."""
    if not kernels_usable_on("cuda"):
        return False
    try:
        import tscale._C_cutlass  # noqa: F401  (registers tscale::int8_scaled_mm_sm80 / _sm90)
    except ImportError:
        return False
    for op in ("int8_scaled_mm_sm80", "int8_scaled_mm_sm90"):
        @torch.library.register_fake(f"tscale::{op}")
        def _(a, b, scale_a, scale_b):
            return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16)
    return True


def _cutlass_op(device_index: int):
    """The CUTLASS int8 product for this GPU: the Hopper kernel on 9.0, the mma.sync one on other 8.0+."""
    major, minor = _capability(device_index)
    if (major, minor) == (9, 0):
        return torch.ops.tscale.int8_scaled_mm_sm90
    return torch.ops.tscale.int8_scaled_mm_sm80 if major >= 8 else None


def _cutlass_ok(kind: str, a, b, out_dtype) -> bool:
    """The rules of the CUTLASS int8 kernels: int8, CUDA on 8.0+, a bf16 result, K % 16 == 0, N % 8 == 0."""
    if kind != "int8" or a.device.type != "cuda" or out_dtype != torch.bfloat16 or not _cutlass_kernels():
        return False
    K, N = b.shape
    return K > 0 and K % 16 == 0 and N % 8 == 0 and _cutlass_op(a.device.index) is not None


def _cublaslt_ok(kind: str, a, b, out_dtype) -> bool:
    """The rules of our cuBLASLt kernels: CUDA, K and N multiples of 16, fp8 on sm_89+, int8 on sm_75+."""
    if a.device.type != "cuda" or not _gemm_kernel_on("cuda"):
        return False
    K, N = b.shape
    if K == 0 or K % 16 or N % 16 or out_dtype not in LT_OUT_DTYPES:
        return False
    if kind == "fp8" and a.dtype == b.dtype == torch.float8_e5m2:
        return False
    return _capability(a.device.index) >= ((8, 9) if kind == "fp8" else (7, 5))


def _scaled_mm_ok(a, b, scale_a, scale_b, out_dtype) -> bool:
    """torch._scaled_mm's rules on CUDA: dims multiples of 16, not both e5m2, rowwise needs e4m3 and bf16 out."""
    if any(d % 16 for d in (*a.shape, b.shape[1])):
        return False
    if a.dtype == b.dtype == torch.float8_e5m2:
        return False
    tensorwise = scale_a.numel() == 1 and scale_b.numel() == 1
    if tensorwise:
        return True
    return a.dtype == b.dtype == torch.float8_e4m3fn and out_dtype == torch.bfloat16


def _torch_ok(kind: str, a, b, scale_a, scale_b, out_dtype) -> bool:
    if kind == "fp8":
        return a.device.type == "cuda" and _scaled_mm_ok(a, b, scale_a, scale_b, out_dtype)
    M, K = a.shape
    N = b.shape[1]
    return a.device.type == "cpu" or (a.device.type == "cuda" and M > 16 and K % 8 == 0 and N % 8 == 0)


def _problem(kind: str, a, b, scale_a, scale_b, out_dtype) -> tuple:
    return (kind, str(a.device), a.dtype, b.dtype, *a.shape, b.shape[1], scale_a.numel() == 1, scale_b.numel() == 1,
            out_dtype)


_paths_known: dict[tuple, tuple[str, ...]] = {}  # (setting, problem) -> the paths whose rules it meets


def product_paths(kind: str, a, b, scale_a, scale_b, out_dtype, problem: tuple | None = None) -> list[str]:
    """The paths fp8_mm (kind "fp8") or int8_mm ("int8") tries for these operands, in order; "reference" is last.

    Which rules a problem meets is worked out once per (setting, problem): a layer calls this
    three times a step with the same shapes, and on a GPU the host's time per call is the step's.
    """
    setting = gemm_path_setting()
    problem = problem or _problem(kind, a, b, scale_a, scale_b, out_dtype)
    paths = _paths_known.get((setting, problem))
    if paths is None:
        found = []
        if setting in ("auto", "cutlass") and _cutlass_ok(kind, a, b, out_dtype):
            found.append("cutlass")
        if setting in ("auto", "cublaslt") and _cublaslt_ok(kind, a, b, out_dtype):
            found.append("cublaslt")
        if setting in ("auto", "torch") and _torch_ok(kind, a, b, scale_a, scale_b, out_dtype):
            found.append("torch")
        paths = _paths_known[(setting, problem)] = tuple(found)
    return [p for p in paths if (p, problem) not in _failed] + ["reference"]


def _lt_operands(a, b, scale_a, scale_b):
    """a row-major, b column-major, both 16-byte aligned; float32 contiguous scales: what the kernels check."""
    a = a.contiguous()
    if a.data_ptr() % 16:
        a = a.clone()
    if not b.t().is_contiguous() or b.data_ptr() % 16:
        b = b.t().clone(memory_format=torch.contiguous_format).t()  # (K, N), column-major
    return a, b, scale_a.float().contiguous(), scale_b.float().contiguous()


def _fp8_cublaslt(a, b, scale_a, scale_b, out_dtype, fast_accum=False):
    return torch.ops.tscale.fp8_gemm(*_lt_operands(a, b, scale_a, scale_b), out_dtype, True, fast_accum)


def _int8_cublaslt(a, b, scale_a, scale_b, out_dtype):
    return torch.ops.tscale.int8_gemm(*_lt_operands(a, b, scale_a, scale_b), out_dtype)


def _int8_cutlass(a, b, scale_a, scale_b, out_dtype):
    a, b, scale_a, scale_b = _lt_operands(a, b, scale_a, scale_b)
    M, N = a.shape[0], b.shape[1]
    sa = scale_a.reshape(-1).expand(M).contiguous()  # (M,): a scalar scale becomes a vector of it
    sb = scale_b.reshape(-1).expand(N).contiguous()  # (N,)
    return _cutlass_op(a.device.index)(a, b, sa, sb)


def _fp8_torch(a, b, scale_a, scale_b, out_dtype, fast_accum=False):
    tensorwise = scale_a.numel() == 1 and scale_b.numel() == 1
    sa = scale_a.float().reshape(()) if tensorwise else scale_a.float().contiguous()
    sb = scale_b.float().reshape(()) if tensorwise else scale_b.float().contiguous()
    b_cm = b if b.t().is_contiguous() else b.t().contiguous().t()  # (K, N), column-major
    return torch._scaled_mm(a.contiguous(), b_cm, scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                            use_fast_accum=fast_accum)


def _int8_torch(a, b, scale_a, scale_b, out_dtype):
    acc = torch._int_mm(a.contiguous(), b)  # (M, N) int32, exact
    return (acc.float() * scale_a.float() * scale_b.float()).to(out_dtype)


_PATHS = {"fp8": {"cublaslt": _fp8_cublaslt, "torch": _fp8_torch},
          "int8": {"cutlass": _int8_cutlass, "cublaslt": _int8_cublaslt, "torch": _int8_torch}}


def _say(kind: str, path: str, device_type: str) -> None:
    if (kind, path) not in _paths_said:
        _paths_said.add((kind, path))
        log.info("ops: %s products via %s (first on %s)", kind, path, device_type)


def _product(kind: str, a, b, scale_a, scale_b, out_dtype, fast_accum: bool = False) -> tuple[torch.Tensor, str]:
    """fp8_mm's or int8_mm's (kind) argument checks, then the first path of product_paths that runs (the reference,
    always last, cannot fail): (the product, the name of its path)."""
    _check_mm_args(f"{kind}_mm", a, b, scale_a, scale_b, (torch.int8,) if kind == "int8" else FP8_DTYPES)
    problem = _problem(kind, a, b, scale_a, scale_b, out_dtype)
    for path in product_paths(kind, a, b, scale_a, scale_b, out_dtype, problem):
        if path == "reference":
            break
        try:
            extra = {"fast_accum": True} if fast_accum and kind == "fp8" else {}
            out = _PATHS[kind][path](a, b, scale_a, scale_b, out_dtype, **extra)
        except RuntimeError as e:
            _failed.add((path, problem))
            _fallback(f"{path} {kind} product {a.dtype} x {b.dtype} -> {out_dtype} at M={a.shape[0]} "
                      f"N={b.shape[1]} K={a.shape[1]} on {a.device.type}", e)
            continue
        _say(kind, path, a.device.type)
        return out, path
    _say(kind, "reference", a.device.type)
    return _scaled_product_reference(a, b, scale_a, scale_b, out_dtype), "reference"


def _kind(a: torch.Tensor) -> str:
    """The product kind of an operand: "int8" or "fp8"."""
    return "int8" if a.dtype == torch.int8 else "fp8"


def fp8_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
           out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    return _product("fp8", a, b, scale_a, scale_b, out_dtype, fast_accum)[0]


def int8_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
            out_dtype: torch.dtype) -> torch.Tensor:
    return _product("int8", a, b, scale_a, scale_b, out_dtype)[0]


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """fp8_mm or int8_mm, by the operands' dtype (fast_accum: fp8 only)."""
    return _product(_kind(a), a, b, scale_a, scale_b, out_dtype, fast_accum)[0]


# (path setting, operand dtypes and shapes, device, scale shapes and dtypes, out_dtype, fast_accum) -> the call
# that made the product of scaled_mm_rows for it the first time, or None where that call failed once since
_row_plans: dict[tuple, object] = {}


def _row_plan(path: str, kind: str, out_dtype: torch.dtype, fast_accum: bool):
    """For the path that served a problem: a call (a (M, K), b (N, K), scale_a (M, 1), scale_b (N, 1)) -> (M, N)
    without the checks and the path choice, which hold for every later call with the same key."""
    if path == "cutlass":
        def cutlass(a, b, scale_a, scale_b):  # the kernel checks its operands' layout itself and raises
            return _cutlass_op(a.device.index)(a, b.t(), scale_a.reshape(-1), scale_b.reshape(-1))
        return cutlass
    if path == "reference":
        return lambda a, b, scale_a, scale_b: _scaled_product_reference(a, b.t(), scale_a, scale_b.t(), out_dtype)
    extra = {"fast_accum": True} if fast_accum and kind == "fp8" else {}
    fn = _PATHS[kind][path]
    return lambda a, b, scale_a, scale_b: fn(a, b.t(), scale_a, scale_b.t(), out_dtype, **extra)


# scaled_mm_rows is defined through a Library, not torch.library.custom_op: a step calls it twice per layer,
# and custom_op's wrappers cost ~6 us more per call on the host than the dispatcher's own call of the impl
_LIB = torch.library.Library("tscale", "FRAGMENT")
_LIB.define("scaled_mm_rows(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType out_dtype, "
            "bool fast_accum=False) -> Tensor")


def _scaled_mm_rows_impl(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                         out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """scaled_mm_rows's kernel: the first call of a problem chooses the path, later ones call it directly."""
    a, b = a.contiguous(), b.contiguous()
    key = (gemm_path_setting(), a.dtype, b.dtype, a.device, a.shape, b.shape, scale_a.shape, scale_b.shape,
           scale_a.dtype, scale_b.dtype, out_dtype, fast_accum)
    plan = _row_plans.get(key)
    if plan is not None:
        try:
            return plan(a, b, scale_a, scale_b)
        except RuntimeError:
            _row_plans[key] = None  # scaled_mm's own path choice and fallbacks from now on
    out, path = _product(_kind(a), a, b.t(), scale_a, scale_b.t(), out_dtype, fast_accum)
    if key not in _row_plans:
        _row_plans[key] = _row_plan(path, _kind(a), out_dtype, fast_accum)
    return out


_LIB.impl("scaled_mm_rows", _scaled_mm_rows_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("tscale::scaled_mm_rows")
def _(a, b, scale_a, scale_b, out_dtype, fast_accum=False):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def scaled_mm_rows(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """(M, N) = (a (M, K) @ b (N, K)^T) * scale_a (M, 1) * scale_b (N, 1)^T, a and b fp8 or int8, both row-major.

    scaled_mm with both operands quantised along their rows (the contracted dimension), as one
    opaque op (tscale::scaled_mm_rows): torch.compile keeps the path choice of scaled_mm out of the
    graph, and the graph around it can make a and b in the layout the fast paths read without a
    copy. Without CUDA graphs the host's time per call is a step's (two calls per layer); so the
    first call of a problem goes through scaled_mm and later ones straight to the call of the path
    that served it. No autograd: the recipes' autograd functions call it for each product.
    """
    return torch.ops.tscale.scaled_mm_rows(a, b, scale_a, scale_b, out_dtype, fast_accum)


def _register_fake() -> None:
    """Shapes of the tscale._C ops for torch.compile (only those the built extension defines)."""
    if not kernels_usable_on("cpu"):  # tscale._C not loaded: no op to describe
        return
    if op_defined("quantize"):
        @torch.library.register_fake("tscale::quantize")
        def _(x, dtype, axis, transpose):
            M, K = x.shape
            scale_shape = () if axis is None else ((1, K) if axis == 0 else (M, 1))
            q = x.new_empty((M, K), dtype=dtype)
            q_t = x.new_empty((K, M) if transpose else (0,), dtype=dtype)
            return q, x.new_empty(scale_shape, dtype=torch.float32), q_t

    if op_defined("quantize_delayed"):
        @torch.library.register_fake("tscale::quantize_delayed")
        def _(x, dtype, state, transpose):
            M, K = x.shape
            return (x.new_empty((M, K), dtype=dtype), x.new_empty((), dtype=torch.float32),
                    x.new_empty((K, M) if transpose else (0,), dtype=dtype))

    if op_defined("fp8_gemm"):
        @torch.library.register_fake("tscale::fp8_gemm")
        def _(a, b, scale_a, scale_b, out_dtype, fuse_scales=True, fast_accum=False):
            return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)

        @torch.library.register_fake("tscale::int8_gemm")
        def _(a, b, scale_a, scale_b, out_dtype):
            return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)

        @torch.library.register_fake("tscale::int8_gemm_i32")
        def _(a, b):
            return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.int32)


_register_fake()
