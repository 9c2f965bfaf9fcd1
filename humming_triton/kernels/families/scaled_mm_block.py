"""``scaled_mm_block`` (torch backend): cuBLASLt's block-scaled fp8 GEMM on Hopper (``F.scaled_mm`` with
``BlockWise1x128`` activations and ``BlockWise128x128`` or ``BlockWise1x128`` weights, fast accumulation off --
the project's fp8 standard) on our own e4m3 codes and fp32 scales.

Why: block-scaled weights (W8A8-FP8-block, DeepSeek's 128x128) and 128-group int4 weights with e4m3 activations
(W4A8-FP8) had no fp8 tensor-core path above M = 16 -- they dequantized both operands for a bf16 cuBLAS GEMM,
0.3-0.5x Humming at M = 256 / 4096.  cuBLASLt applies the 1x128 / 128x128 scales between its fp8 MMAs itself.

* W8A8-FP8-block: the weight's words viewed as bytes *are* the [N, K] e4m3 matrix; its [N/128, K/128] fp32 block
  scales are the 128x128 operand as stored (no copy).
* W4A8-FP8 (any weight whose values are all e4m3 values -- int4 is): the codes are widened to e4m3 once (exact;
  8 bits per weight, cached on the weight beside the packed int4) and the 128-group scales become the 1x128
  operand, fp32 [N, K/128] column-major (the layout cuBLASLt takes).
* Activations: our quantizer writes the e4m3 codes and the scales straight into the column-major [M, K/128]
  layout; per-token scales are repeated over the K blocks (exact: the same scale, 1x128 at a time).

cuBLASLt wants M a multiple of 4 (measured: M = 1, 6, 17 are refused, 4 and 256 run): other M is padded with zero
rows (their outputs are dropped).  The output is bf16 with no bias, written by cuBLASLt; any other output type or a
bias takes cuBLASLt's fp32 result and applies the bias in fp32 (no rounding through bf16).  SM 9.0 only: PyTorch
routes these recipes to cuBLASLt on Hopper and rejects them elsewhere."""
from __future__ import annotations

from functools import lru_cache

import torch

from ...calls import Call, KernelConfig
from . import Family, register

BLOCK = 128  # the K (and N, for 128x128 weights) extent of one scale block
_ROWS = 1024  # weight rows widened at a time: bounds the temporaries to 4 B x 1024 x K


def _e4m3_exact(element) -> bool:
    """Every finite value of the weight's element type is an e4m3 value (int4, e2m1, e4m3 itself)."""
    table = element.value_table().float()
    table = table[torch.isfinite(table)]
    if table.abs().max() > 448:
        return False
    return bool(torch.equal(table.to(torch.float8_e4m3fn).float(), table))


@lru_cache(maxsize=None)
def weight_kind(scheme) -> str | None:
    """"128x128" (e4m3 weights, fp32 128x128 block scales), "1x128" (e4m3-exact weights, float scales per 128 of
    K), or None when this family cannot take the weight."""
    s, sc = scheme, scheme.scale
    if s.zero != "none" or sc.global_scale or not str(sc.dtype).startswith(("fp", "bf")):
        return None
    if str(s.weight) == "e4m3fn" and str(sc.dtype) == "fp32" and sc.block_n == BLOCK and sc.block_k == BLOCK:
        return "128x128"
    if (sc.block_n or 0) == 1 and sc.block_k == BLOCK and _e4m3_exact(s.weight):
        return "1x128"
    return None


def block_weight(qw) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [N, K], scale_b) as ``F.scaled_mm`` takes them for ``qw``: scale_b [K/128, N/128] for 128x128 (the
    transpose of the stored row-major scales), [N, K/128] column-major for 1x128 (measured on the H200, torch
    2.11: either other layout is refused)."""
    if weight_kind(qw.scheme) == "128x128":
        return qw.data.view(torch.uint8).view(torch.float8_e4m3fn), qw.scales.t()
    return qw.cached_view("torch", "block_e4m3", lambda: _widen(qw))


def _widen(qw) -> tuple[torch.Tensor, torch.Tensor]:
    from ...formats.packing import unpack_codes
    from ...formats.weight import decode_scales
    s, n, k = qw.scheme, qw.N, qw.K
    w = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=qw.device)
    for r0 in range(0, n, _ROWS):
        r1 = min(n, r0 + _ROWS)
        w[r0:r1] = s.weight.decode(unpack_codes(qw.data[r0:r1], s.bits, k)).to(torch.float8_e4m3fn)  # exact
    return w, decode_scales(qw.scales, s).float().t().contiguous().t()


class ScaledMMBlock(Family):
    name = "scaled_mm_block"
    backend = "torch"

    def reason(self, call: Call) -> str | None:
        s, a = call.scheme, call.scheme.act
        if call.device_type != "cuda":
            return "torch's block-scaled fp8 GEMM needs a CUDA GPU"
        if not hasattr(torch.nn.functional, "scaled_mm"):
            return f"torch {torch.__version__} has no F.scaled_mm (block-scaled fp8 recipes)"
        if call.facts is not None and tuple(call.facts.sm) != (9, 0):
            return f"cuBLASLt's 1x128 / 128x128 fp8 scaling runs on SM 9.0 (this GPU is SM {call.facts.sm})"
        if a is None or str(a.dtype) != "e4m3fn" or str(a.scale_dtype) != "fp32" or a.static or a.global_scale \
                or (a.group_k not in (None, 0, BLOCK)):
            return f"{s.name}: this family takes dynamic e4m3 activations, fp32 scales per token or per 128 of K"
        if weight_kind(s) is None:
            return (f"{s.name}: this family takes e4m3 weights with 128x128 fp32 block scales, or e4m3-exact "
                    f"weights with float scales per 128 of K")
        if call.act_order:
            return "act-order weights"
        if call.k % (4 * BLOCK) or call.n % BLOCK:
            return f"the block-scaled GEMM needs K a multiple of 512 and N of 128 (got N={call.n}, K={call.k})"
        return None

    def mma(self, call: Call) -> str:
        return "fp8"

    def candidates(self, call: Call) -> list[KernelConfig]:
        return [KernelConfig(self.name)]

    def run(self, x, x2, qw, bias, out_dtype, cfg, out):
        w, scale_b = block_weight(qw)
        a, scale_a, m = quantize_blocks(x2, qw.scheme.act)
        recipe_b = (torch.nn.functional.ScalingType.BlockWise128x128 if weight_kind(qw.scheme) == "128x128"
                    else torch.nn.functional.ScalingType.BlockWise1x128)
        direct = out_dtype == torch.bfloat16 and bias is None
        y = torch.nn.functional.scaled_mm(a, w.t(), scale_a, torch.nn.functional.ScalingType.BlockWise1x128,
                                          scale_b, recipe_b, output_dtype=torch.bfloat16 if direct else torch.float32,
                                          use_fast_accum=False)[:m]
        if bias is not None:
            y = y.add_(bias.float())
        return out.copy_(y) if out is not None else (y if y.dtype == out_dtype else y.to(out_dtype))


def quantize_blocks(x2: torch.Tensor, spec) -> tuple[torch.Tensor, torch.Tensor, int]:
    """x [M, K] -> (e4m3 codes [M4, K], fp32 scales [M4, K/128] column-major, M): M4 = M rounded up to 4, the
    pad rows zero codes with unit scales.  Per-token scales are written to column 0 and repeated."""
    from ..dense import triton_quantize_activation
    m, k = x2.shape
    m4, kb = -(-m // 4) * 4, k // BLOCK
    codes = torch.empty(m4, k, dtype=torch.uint8, device=x2.device)
    scales = torch.empty(kb, m4, dtype=torch.float32, device=x2.device).t()
    per_token = not spec.group_k
    triton_quantize_activation(x2, spec, codes=codes, scales=scales[:, :1] if per_token else scales)
    if m4 > m:
        codes[m:].zero_()
        scales[m:].fill_(1.0)
    if per_token:
        scales[:, 1:].copy_(scales[:, :1].expand(m4, kb - 1))
    return codes.view(torch.float8_e4m3fn), scales, m


register(ScaledMMBlock())
