"""Dynamic / static activation quantization (the reference; fused GPU kernels must match it bit for bit
up to float rounding of the scale computation).

``QuantActivation.codes`` holds one raw code per element (uint8, ``[..., K]``); ``as_torch()`` reinterprets
fp8/int8 codes as torch's own dtypes for ``torch._scaled_mm``.  Scales: ``[..., 1]`` per token,
``[..., K/g]`` per group, ``[1]``-broadcast per tensor; fp32 as float32, e8m0/e4m3 as uint8 codes.

Scale rule (dynamic): ``s = amax / qmax`` (fp32), for e8m0 ``2**ceil(log2(amax/qmax))``, for NV
``global = amax(x) / (448 * qmax)`` and ``s = e4m3(amax_block / qmax / global)``.  Static: the calibrated
``input_scale`` is the per-tensor scale (NV: the global scale).

Non-finite inputs (one rule on every backend): a scale group (the row for per-token scales, the group of K for
``g<K>``, the row's share of a per-tensor scale) that holds a NaN or a +-inf gets a NaN scale -- fp32 NaN, e8m0
code 0xFF, e4m3fn code 0x7F (``nan_scale_code``) -- and all-zero codes, so it dequantizes to NaN and the GEMM's
output row is NaN: NaN stays NaN, and +-inf becomes NaN (no quantized activation type holds an infinity, and
``inf * w`` summed over a row of weights of both signs is NaN anyway).  Scales are computed from the finite
values only, so the other rows (and groups) are quantized exactly as without the bad values; in particular the
per-tensor NV global scale is the amax of the finite values (``global_act_scale``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .dtypes import WideFloat
from .quantize import positive_qmax, round_scale
from .scheme import ActQuant, QuantScheme

__all__ = ["QuantActivation", "quantize_activation", "dequantize_activation", "global_act_scale", "nan_scale_code"]


@dataclass
class QuantActivation:
    codes: torch.Tensor
    scales: torch.Tensor
    spec: ActQuant
    global_scale: torch.Tensor | None = None

    def values(self) -> torch.Tensor:
        """Element values before scaling (float32)."""
        return self.spec.dtype.decode(self.codes)

    def as_torch(self) -> torch.Tensor:
        name = str(self.spec.dtype)
        if name == "e4m3fn":
            return self.codes.view(torch.float8_e4m3fn)
        if name == "e5m2":
            return self.codes.view(torch.float8_e5m2)
        if name == "int8":
            return self.codes.view(torch.int8)
        raise ValueError(f"no torch dtype holds {name} activations; use .codes")


def _act_spec(scheme) -> ActQuant:
    if isinstance(scheme, ActQuant):
        return scheme
    s = QuantScheme.parse(scheme)
    if s.act is None:
        raise ValueError(f"scheme {s.name} has 16-bit activations; there is nothing to quantize")
    return s.act


def nan_scale_code(scale_dtype) -> int | None:
    """The code stored as the scale of a group holding NaN/Inf: e8m0 0xFF, e4m3fn 0x7F (None for fp32/fp16/bf16
    scales, which store a float NaN)."""
    if isinstance(scale_dtype, WideFloat):
        return None
    return int(torch.isnan(scale_dtype.value_table()).nonzero()[0])


def finite_amax(t: torch.Tensor, dim=None) -> torch.Tensor:
    """``|t|.amax(dim)`` over the finite values only (0 where there are none)."""
    a = t.abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype, device=a.device))
    if dim is None:
        return a.amax() if a.numel() else torch.zeros((), dtype=a.dtype, device=a.device)
    return a.amax(dim)


def global_act_scale(x: torch.Tensor, spec: ActQuant, input_scale=None) -> torch.Tensor | None:
    """The per-tensor (NV) global scale of ``x``: the calibrated ``input_scale``, or ``amax / (qmax * 448)`` over
    the finite values of ``x`` (float64 steps, fp32 result; at least 1e-30).  None when the spec has none."""
    if not spec.global_scale:
        return None
    if input_scale is not None:
        return torch.as_tensor(input_scale, dtype=torch.float32, device=x.device).reshape(())
    amax = finite_amax(x.detach()).double()
    return (amax / (positive_qmax(spec.dtype) * spec.scale_dtype.finite_max())).clamp(min=1e-30).float()


def quantize_activation(x: torch.Tensor, scheme, input_scale: torch.Tensor | float | None = None) -> QuantActivation:
    """Quantize ``x [..., K]`` with the scheme's activation quantization (dynamic, or static with input_scale)."""
    spec = _act_spec(scheme)
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"activations must be a float tensor, got {getattr(x, 'dtype', type(x))}")
    k = x.shape[-1]
    why = spec.shape_error(k)
    if why:
        raise ValueError(why)
    if spec.static and input_scale is None:
        raise ValueError("static activation quantization needs the calibrated input_scale")
    xd = x.detach().double()
    lead = xd.shape[:-1]
    qmax = positive_qmax(spec.dtype)
    g = spec.group_k or k
    xg = xd.reshape(*lead, k // g, g)
    finite = torch.isfinite(xg)
    bad = ~finite.all(-1)  # [*lead, groups]: groups holding a NaN or an Inf (see the module docstring)
    xg = torch.where(finite, xg, torch.zeros((), dtype=xg.dtype, device=xg.device))
    gscale = global_act_scale(x, spec, input_scale)
    if spec.static and not spec.global_scale:
        ideal = torch.as_tensor(input_scale, dtype=torch.float64, device=x.device).expand(*lead, k // g)
    else:
        amax = xg.abs().amax(-1) if spec.per_token else xg.abs().amax().expand(*lead, k // g)
        ideal = amax / qmax
        if gscale is not None:
            ideal = ideal / gscale.double()
        ideal = torch.where(ideal > 0, ideal, torch.ones_like(ideal))
    stored, sval = round_scale(ideal, spec.scale_dtype)
    eff = sval * (gscale.double() if gscale is not None else 1.0)
    xg = torch.where(bad[..., None], torch.zeros((), dtype=xg.dtype, device=xg.device), xg)
    codes = spec.dtype.encode(xg / eff[..., None]).reshape(*lead, k).to(torch.uint8)
    if isinstance(spec.scale_dtype, WideFloat):
        stored = stored.float() if spec.scale_dtype.name == "fp32" else stored
        stored = torch.where(bad, torch.full((), float("nan"), dtype=stored.dtype, device=stored.device), stored)
    else:
        stored = torch.where(bad, torch.full((), nan_scale_code(spec.scale_dtype), dtype=stored.dtype,
                                             device=stored.device), stored)
    return QuantActivation(codes, stored, spec, gscale)


def dequantize_activation(q: QuantActivation) -> torch.Tensor:
    """The float32 activation the quantized GEMM actually multiplies."""
    k = q.codes.shape[-1]
    sd = q.spec.scale_dtype
    s = q.scales.float() if isinstance(sd, WideFloat) else sd.decode(q.scales)
    g = q.spec.group_k or k
    s = s.repeat_interleave(g, dim=-1)[..., :k]  # the last group may be partial (K not a multiple of g)
    x = q.values() * s
    if q.global_scale is not None:
        x = x * q.global_scale
    return x

