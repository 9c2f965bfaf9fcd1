"""Tolerances, in one place, derived from the format and the arithmetic -- used by every test and benchmark.

* Quantization error (``weight_error_bound``): round-to-nearest can be off by at most half the gap between the
  two representable values around ``w / scale``, times the effective scale, plus whatever saturation clipped,
  plus the float32 rounding of the dequantized value.
* GEMM error (``linear_tolerance``): a kernel rounds each dequantized weight (and the activation, if it is not
  already in that dtype) to the MMA input dtype -- relative error ``u`` (2^-11 fp16, 2^-8 bf16) per product --
  then accumulates in fp32 and rounds the output once.  Independent rounding errors grow like a random walk,
  so per output element ``|y - y_ref| <= 6 u sqrt(sum_k (x_k w_k)^2) + 2 u_32 sqrt(K) sum_k |x_k w_k| +
  2 u_out |y_ref|`` (6 sigma; the middle term is fp32 accumulation).  A wrong
  nibble, group or scale produces errors of order ``|y|``, far above this.  A kernel that sums ``x * code *
  scale`` and subtracts ``x * zero * scale`` separately (the word-major GEMV) accumulates terms up to
  ``|w| + |zero * scale|``: pass that offset (``zero_offset``) and the fp32 term uses it.
"""
from __future__ import annotations

import torch

from .formats.dtypes import IntType
from .formats.quantize import expand_blocks
from .formats.weight import QuantWeight, decode_scales

__all__ = ["unit_roundoff", "linear_tolerance", "assert_linear_close", "weight_error_bound", "poison_like",
           "zero_offset", "examples", "HYPOTHESIS_BASE_EXAMPLES", "FP8_STANDARD_FACTOR", "FP8_MMA_ROUNDOFF"]

# The fp8 accuracy standard: an fp8 GEMM of ours is at most this factor less accurate (relative Frobenius error
# against float64 of the same codes) than torch._scaled_mm with fast accumulation off -- room for a different fp32
# summation order only (cuBLASLt's split of K is not ours).
FP8_STANDARD_FACTOR = 1.25
HYPOTHESIS_BASE_EXAMPLES = 100  # max_examples of the "ci" profile (tests/conftest.py); "nightly" has 10x


def examples(n: int) -> int:
    """``n`` hypothesis examples under the "ci" profile, scaled with the loaded profile (``HYPOTHESIS_PROFILE=nightly``
    runs 10x): tests that set their own count keep following the profile."""
    from hypothesis import settings
    return max(1, round(n * settings.default.max_examples / HYPOTHESIS_BASE_EXAMPLES))

# The fp8 tensor cores' sums: products of e4m3 codes are exact, but the accumulator keeps fewer bits than fp32
# between promotions -- cuBLASLt's fp8 GEMM (torch._scaled_mm, fast accumulation off, the project's fp8 standard)
# was measured on the H200 at up to 2^-10.3 of the products' spread sqrt(sum x^2 w^2) (K = 2048, session 9).  As an
# ``mma_dtype`` of ``linear_tolerance``, float8_e4m3fn stands for those sums (6 u = 3.6x that worst case).
FP8_MMA_ROUNDOFF = 2.0 ** -11
_U = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53,
      torch.float8_e4m3fn: FP8_MMA_ROUNDOFF}


def unit_roundoff(dtype: torch.dtype) -> float:
    return _U[dtype]


def model_drift_tolerance(scheme, gemms: int, act_dtype: torch.dtype = torch.bfloat16) -> float:
    """Relative norm error allowed between a whole quantized model run in ``act_dtype`` and the same model on the
    float32 reference: a few ``act_dtype`` ulps for weight-only schemes (0.05 over ~``gemms`` GEMMs), more where
    activations are quantized.  There the two runs' activations differ by an ulp of ``act_dtype`` (u), so about a
    u / s fraction of codes lands one code step s (relative) apart; each such flip moves its element by s, i.e.
    sqrt(u / s) * s = sqrt(u * s) of the GEMM's output norm, adding up over ``gemms`` GEMMs as a random walk:
    sqrt(gemms * u * s) (e4m3, s = 2^-3: 0.08 at 13 GEMMs in bf16).  A kernel bug is O(1) either way."""
    base = 0.05
    act = getattr(scheme, "act", None)
    if act is None:
        return base
    elem = act.dtype
    step = 1.0 / elem.qmax if isinstance(elem, IntType) else 2.0 ** -elem.man  # int: a step of the row's amax
    return max(base, (gemms * unit_roundoff(act_dtype) * step) ** 0.5)


def zero_offset(qw: QuantWeight) -> torch.Tensor:
    """``|zero * scale|`` per weight element (2**(bits-1) for signed integer codes without zero points, which
    a kernel may treat as offset binary), 0 where the format has no offset."""
    s = qw.scheme
    n, k = qw.N, qw.K
    if s.zero != "none":
        zero = expand_blocks(qw.zeros.double(), s.group_n(n), s.group_k(k), n, k)
    elif isinstance(s.weight, IntType) and s.weight.signed:
        zero = torch.full((n, k), 2.0 ** (s.bits - 1), dtype=torch.float64)
    else:
        return torch.zeros(n, k, dtype=torch.float64)
    scale = expand_blocks(decode_scales(qw.scales, s).double(), s.group_n(n), s.group_k(k), n, k)
    if qw.global_scale is not None:
        scale = scale * qw.global_scale.double()
    return (zero * scale).abs()


def linear_tolerance(x: torch.Tensor, w_hat: torch.Tensor, y_ref: torch.Tensor, mma_dtype: torch.dtype,
                     out_dtype: torch.dtype, offset: torch.Tensor | None = None) -> torch.Tensor:
    """Per-element absolute tolerance of ``x @ w_hat.T`` computed with ``mma_dtype`` products, fp32 sums
    (of terms up to ``|w_hat| + offset``, see the module docstring)."""
    xd, wd = x.double().reshape(-1, x.shape[-1]), w_hat.double()
    spread = ((xd ** 2) @ (wd ** 2).T).sqrt().reshape(y_ref.shape)
    # fp32 accumulation: the partial sums' own rounding, random-walk over K terms
    terms = wd.abs() if offset is None else wd.abs() + offset.double().cpu()
    acc = 2 * unit_roundoff(torch.float32) * x.shape[-1] ** 0.5 * (xd.abs() @ terms.T).reshape(y_ref.shape)
    return 6 * unit_roundoff(mma_dtype) * spread + acc + 2 * unit_roundoff(out_dtype) * y_ref.double().abs() + 1e-30


def assert_linear_close(out: torch.Tensor, y_ref: torch.Tensor, x: torch.Tensor, w_hat: torch.Tensor,
                        mma_dtype: torch.dtype, what: str = "", offset: torch.Tensor | None = None) -> None:
    if out.shape != y_ref.shape:
        raise AssertionError(f"{what}: shape {list(out.shape)} != reference {list(y_ref.shape)}")
    o = out.double().cpu()
    if not bool(torch.isfinite(o).all()):
        raise AssertionError(f"{what}: output has {int((~torch.isfinite(o)).sum())} non-finite values (unwritten?)")
    tol = linear_tolerance(x.cpu(), w_hat.cpu(), y_ref.cpu(), mma_dtype, out.dtype, offset)
    err = (o - y_ref.double().cpu()).abs()
    bad = err > tol
    if bool(bad.any()):
        i = int(torch.argmax((err / tol).flatten()))
        raise AssertionError(f"{what}: {int(bad.sum())}/{bad.numel()} elements off; worst flat index {i}: "
                             f"got {o.flatten()[i]:.6g}, want {y_ref.double().flatten()[i]:.6g}, "
                             f"tolerance {tol.flatten()[i]:.3g}")


def _half_gap(table: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Half the distance between the representable values around v (v already inside [min, max])."""
    vals = torch.unique(table[torch.isfinite(table)].double())
    hi = torch.searchsorted(vals, v).clamp(1, len(vals) - 1)
    return (vals[hi] - vals[hi - 1]) / 2


def weight_error_bound(w: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """Per-element bound of ``|w - dequantize_weight(qw)|`` for round-to-nearest with qw's own scales."""
    s = qw.scheme
    n, k = qw.N, qw.K
    bn, bk = s.group_n(n), s.group_k(k)
    scale = expand_blocks(decode_scales(qw.scales, s).double(), bn, bk, n, k)
    if qw.global_scale is not None:
        scale = scale * qw.global_scale.double()[..., None, None]
    table = s.weight.value_table().double()
    fin = table[torch.isfinite(table)]
    lo, hi = float(fin.min()), float(fin.max())
    v = w.double() / scale
    if s.zero != "none":
        v = v + expand_blocks(qw.zeros.double(), bn, bk, n, k)
    clipped = (v - v.clamp(lo, hi)).abs() * scale
    # + the float32 rounding of dequantization itself (up to two multiplies: code x scale x global)
    return (_half_gap(table, v.clamp(lo, hi)) * scale + clipped) * (1 + 1e-6) + 2.0 ** -23 * w.double().abs() + 1e-12


def poison_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor of NaNs to pass as a kernel's output: an element the kernel fails to write stays NaN."""
    return torch.full_like(t, float("nan"))


