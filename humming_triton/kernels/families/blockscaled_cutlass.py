"""``blockscaled_cutlass``: the sm_100a CUTLASS tcgen05 block-scaled GEMMs (``cutlass_ext/csrc_sm100``, issue 16)
for quant_linear -- W4A4 NVFP4 x NVFP4 (``w4a4-nvfp4``, kind 0), W4A4 MXFP4 x MXFP4 (``w4a4-mxfp4``, kind 1), W4A8
MXFP8 activations x MXFP4 weights (``w4a8-mx``, kind 2) and W8A8 MXFP8 x MXFP8 (``w8a8-mxfp8``, kind 3).  Backend
``cuda``.

Compiled, never run: no Blackwell GPU has executed these kernels (CI compiles them and checks their SASS,
tests/test_cutlass_sm100.py).  What is checked on CPU (tests/test_blockscaled_layout.py): the scale-factor layout
``cutlass_ext.blockscaled.to_sf_layout`` writes, against CUTLASS's own layout functions evaluated on the host,
and the data ``prepare`` hands the C function, read back through that layout and multiplied in torch, against
``reference_linear``.

Opt-in: ``auto`` takes a ``cuda`` candidate only from the device's measured table (dispatch.py), and no table has
one for this family (no Blackwell GPU has timed it); ``backend="cuda"`` runs it explicitly.  The triton backend's
heuristic never names it (it is not a triton family).

What one call does (``run``): the Triton activation quantizer (``triton_quantize_activation``, as the scheme
says: e2m1 codes + e4m3:g16 scales + a per-call fp32 global for NVFP4, e2m1 / e4m3 codes + e8m0:g32 scales for
MX); e2m1 codes packed two per byte (code 2j in the low nibble of byte j: CUTLASS's K-major e2m1 packing); the
activation scales rewritten into CUTLASS's layout (two device ops per call); the weight used as stored -- kpack32
int32 words read as bytes are exactly those packings (tests/test_dot_scaled.py asserts the byte orders) -- with its
scales converted once and cached in ``qw.cache["cuda"]`` (never serialized: QuantWeight.__getstate__ drops the
cache); NVFP4's two global scales multiplied on the device into the epilogue's ``alpha_ptr`` (no host sync); bias
(fp32) added per column in the epilogue.  The GEMM writes bf16; another ``out_dtype`` is one cast of that (so an
fp32 ``out_dtype`` still carries bf16 rounding).

``w4a8-mxfp4`` is refused: its activations are e4m3 with per-token fp32 scales, and kind 2 (MXFP8 x MXFP4) needs
MXFP8 activations (e8m0 scales per 32) -- quantizing them that way would compute something other than the scheme;
``w4a8-mx`` is that scheme.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ...calls import Call, KernelConfig
from . import Family, register
from .dot_scaled import scheme_kind

# dot_scaled's scheme kinds -> the C ABI's kind; w4a8-mxfp4 is not runnable (module docstring)
CUTLASS_KIND = {"nvfp4": "nvfp4", "mxfp4": "mxfp4", "w4a8-mx": "mxfp8_mxfp4", "mxfp8": "mxfp8"}
SCHEMES = ("w4a4-nvfp4", "w4a4-mxfp4", "w4a8-mx", "w8a8-mxfp8")
SM = (10, 0)  # sm_100a cubins (arch-specific "a" features: tcgen05) load on SM 10.0 only
K_ALIGN = 32  # TMA: 16-byte rows of e2m1 (32 codes) / e4m3 (16); whole scale groups (16 NV, 32 MX)
N_ALIGN = 8  # the bf16 output's 16-byte rows (AlignD = 8), which also covers the fp32 bias's 4-element vectors
TILE_K = {"nvfp4": 256, "mxfp4": 256, "mxfp8_mxfp4": 128, "mxfp8": 128}  # the CTA tiles compiled into blockscaled_gemm.cu


def cutlass_kind(scheme) -> str | None:
    return CUTLASS_KIND.get(scheme_kind(scheme))


def _scale_format(kind: str) -> str:
    return "e4m3fn" if kind == "nvfp4" else "e8m0"


@dataclass
class Prepared:
    """Everything ``ht_sm100_blockscaled_gemm`` is called with, as torch tensors (``prepare``)."""
    kind: str
    m: int
    n: int
    k: int
    a: torch.Tensor  # uint8 [M, K / 2] (e2m1 pairs, low nibble first) or [M, K] (e4m3 codes)
    sfa: torch.Tensor  # uint8, flat: the activation scales in CUTLASS's layout
    b: torch.Tensor  # uint8 [N, K / 2] or [N, K]: the weight's kpack32 words read as bytes
    sfb: torch.Tensor  # uint8, flat: the weight scales in CUTLASS's layout (cached on the weight)
    alpha: torch.Tensor | None  # fp32 [1] on the device (NVFP4: activation global x weight global); None: 1.0
    bias: torch.Tensor | None  # fp32 [N] or None


def weight_sf(qw, kind: str) -> torch.Tensor:
    """The weight's scales in CUTLASS's layout, made once per weight (re-made if its scales were replaced or edited
    in place) and cached in ``qw.cache["cuda"]``."""
    from cutlass_ext.blockscaled import PAD_CODE, VEC, to_sf_layout
    return qw.cached_view("cuda", ("blockscaled_cutlass", kind), lambda: to_sf_layout(
        qw.scales.contiguous(), qw.K, VEC[kind], PAD_CODE[_scale_format(kind)]))


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes ``[M, K]`` (one per byte) -> ``[M, K / 2]``: code 2j in the low nibble of byte j."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def prepare(x2: torch.Tensor, qw, bias: torch.Tensor | None) -> Prepared:
    """The arrays ``run`` passes to the C function -- no CUDA needed (the quantizer runs under the Triton
    interpreter on CPU), so tests/test_blockscaled_layout.py checks them by emulation."""
    from cutlass_ext.blockscaled import PAD_CODE, VEC, to_sf_layout
    from ..dense import check_act_group, triton_quantize_activation
    kind = cutlass_kind(qw.scheme)
    if kind is None:
        raise ValueError(f"blockscaled_cutlass does not run {qw.scheme.name}")
    act = qw.scheme.act
    m, n, k = x2.shape[0], qw.N, qw.K
    check_act_group(act, k)
    q = triton_quantize_activation(x2, act, qw.input_scale)
    a = q.codes if kind in ("mxfp8", "mxfp8_mxfp4") else pack_e2m1(q.codes)  # e4m3 codes as they are
    sfa = to_sf_layout(q.scales, k, VEC[kind], PAD_CODE[_scale_format(kind)])
    b = qw.data.contiguous().view(torch.uint8)
    alpha = None
    if kind == "nvfp4":  # both fp32 globals multiply the accumulator once, on the device
        alpha = (q.global_scale.float() * qw.global_scale.float()).reshape(1)
    return Prepared(kind, m, n, k, a.contiguous(), sfa, b, weight_sf(qw, kind), alpha,
                    None if bias is None else bias.float().contiguous())


class BlockScaledCutlass(Family):
    name = "blockscaled_cutlass"
    backend = "cuda"

    def reason(self, call: Call) -> str | None:
        if call.op != "quant_linear" or call.experts:
            return "blockscaled_cutlass runs dense quant_linear layers"
        kind = scheme_kind(call.scheme)
        if kind == "w4a8-mxfp4":
            return ("w4a8-mxfp4 quantizes activations to e4m3 with per-token fp32 scales; the CUTLASS W4A8 GEMM "
                    "(kind 2) takes MXFP8 activations (e8m0 scales per 32), which would change the scheme's numerics")
        if kind not in CUTLASS_KIND:
            return (f"{call.scheme.name}: blockscaled_cutlass runs {', '.join(SCHEMES)} (block-scaled weights and "
                    f"activations, no zero point)")
        if call.act_order:
            return "act-order weights"
        if call.k % K_ALIGN or call.k <= 0:
            return f"the CUTLASS GEMM needs K a multiple of {K_ALIGN} (got K={call.k})"
        if call.n % N_ALIGN:
            return f"the CUTLASS GEMM needs N a multiple of {N_ALIGN} (bf16 output rows of 16 bytes; got N={call.n})"
        if call.device_type != "cuda":
            return f"the CUTLASS GEMM needs CUDA tensors (x is on {call.device_type})"
        if call.facts is None:
            return "the device is not known (the sm_100a cubins run on SM 10.0 only)"
        if tuple(call.facts.sm) != SM:
            return (f"the sm_100a cubins run on SM 10.0 only; this GPU ({call.facts.name}) is SM "
                    f"{call.facts.sm[0]}.{call.facts.sm[1]}")
        from cutlass_ext.blockscaled import unavailable
        return unavailable()

    def mma(self, call: Call) -> str:
        return "block_scaled"

    def candidates(self, call: Call) -> list[KernelConfig]:
        # one: the kernel's tiles are compiled in (128 x 128 CTA, cluster 1x1); the config only names them
        kind = cutlass_kind(call.scheme) or "mxfp8"
        return [KernelConfig(self.name, 128, 128, TILE_K[kind], 1, 1, 4, 1)]

    def run(self, x, x2, qw, bias, out_dtype, cfg: KernelConfig, out):
        from cutlass_ext.blockscaled import gemm
        from ...capability import device_facts
        from ..dense import call_of
        call = replace(call_of(x2, qw), facts=device_facts(x2.device))
        why = self.reason(call)
        if why:
            raise ValueError(f"blockscaled_cutlass cannot run this call: {why}")
        m, n = x2.shape[0], qw.N
        y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x2.device)
        if not m:
            return y
        p = prepare(x2, qw, bias)
        direct = y.dtype == torch.bfloat16 and y.is_contiguous()
        d = gemm(p.kind, p.a, p.sfa, p.b, p.sfb, m, n, p.k, 1.0 if p.alpha is None else p.alpha, p.bias,
                 y if direct else None)
        if not direct:
            y.copy_(d)
        return y


register(BlockScaledCutlass())
