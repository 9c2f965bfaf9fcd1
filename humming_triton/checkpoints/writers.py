"""Per-layer writers for ``save_quantized``: one 2-D ``QuantWeight`` -> the producer's tensors + config entry.

Each writer is the exact inverse of its importer (gptq.py, compressed_tensors.py): it writes the bits the
importer reads back into the same dequantized values, and refuses (``ExportError``) any scheme the format cannot
carry instead of re-quantizing.  Why exact inverses rather than "what a producer would write": a checkpoint we
write must reload bit-for-bit, so the importers are the specification.  Facts used:

* our canonical stream (formats/packing.py) *is* GPTQ's ``qweight`` transposed and compressed-tensors'
  ``weight_packed`` (dense LSB-first along K, 3/5/6/7-bit crossing words), so packing is a transpose at most;
* both formats store unsigned codes: a signed two's complement code ``c`` is written as ``c + 2**(bits-1)``,
  which is ``c ^ 2**(bits-1)`` on the packed words (one XOR, no unpacking);
* act-order (``k_perm``) is written back as the producer's ``g_idx`` over the logical K order;
* compressed-tensors NVFP4 stores the *reciprocal* of our (multiplying) global scale; the importer computes
  ``fp32(1 / stored)``.  Not every float32 is such a reciprocal (about 13% are not), so the writer searches
  for a stored value whose reciprocal is exactly ours and reports the layers where none exists.
"""
from __future__ import annotations

import torch

from ..formats.dtypes import FloatType, IntType, WideFloat
from ..formats.packing import pack_codes, unpack_codes
from ..formats.scheme import ActQuant
from ..formats.weight import QuantWeight
from . import compressed_tensors as ct
from ._common import Tensors

__all__ = ["ExportError", "gptq_layer", "ct_layer", "exact_reciprocal", "words_to_bytes"]


class ExportError(ValueError):
    """A (format, scheme) pair that the target checkpoint format cannot express exactly."""


# --- shared bit helpers ---------------------------------------------------------------------------------------
def _flip(bits: int, k: int, device) -> torch.Tensor:
    """Packed words that XOR every code of a K-row with ``2**(bits-1)`` (signed <-> offset unsigned)."""
    return pack_codes(torch.full((1, k), 1 << (bits - 1), dtype=torch.int32, device=device), bits)


def _unsigned_words(qw: QuantWeight) -> torch.Tensor:
    """The stored codes as unsigned (offset) codes, still packed along K, in *stored* K order."""
    s = qw.scheme
    return qw.data ^ _flip(s.bits, qw.K, qw.data.device) if s.weight.signed else qw.data


def _logical_order(words: torch.Tensor, qw: QuantWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Act-order: stored column j is logical column k_perm[j].  Producers pack the logical K order and give the
    scale row of each logical column in ``g_idx``; returns ``(words in logical order, g_idx or None)``."""
    if qw.k_perm is None:
        return words, None
    if qw.k_perm.dim() != 1:
        raise ExportError("per-row k_perm (act-order MoE experts) cannot be exported")
    k, bits, kp = qw.K, qw.scheme.bits, qw.k_perm.long()
    stored = unpack_codes(words, bits, k)
    logical = torch.empty_like(stored)
    logical[:, kp] = stored
    g_idx = torch.empty(k, dtype=torch.int32, device=kp.device)
    g_idx[kp] = (torch.arange(k, device=kp.device) // qw.scheme.group_k(k)).to(torch.int32)
    return pack_codes(logical, bits), g_idx


def _int_zeros(qw: QuantWeight, fmt: str, prefix: str) -> torch.Tensor:
    """Per-scale-block unsigned integer zero points (int32), whatever the scheme's zero representation."""
    s = qw.scheme
    if s.weight.signed:
        return torch.full(qw.scales.shape, 1 << (s.bits - 1), dtype=torch.int32, device=qw.scales.device)
    if s.zero == "none":  # unsigned codes without zero: w = q * s, i.e. zero point 0
        return torch.zeros(qw.scales.shape, dtype=torch.int32, device=qw.scales.device)
    if s.zero == "float":
        raise ExportError(f"{fmt} stores integer zero points; layer {prefix} has float zeros (scheme {s.name})")
    z = qw.zeros.to(torch.int32)
    if z.numel() and int(z.max()) >= (1 << s.bits):
        raise ExportError(f"{fmt}: layer {prefix} has zero points up to {int(z.max())}, beyond {s.bits}-bit codes")
    return z


def words_to_bytes(words: torch.Tensor, nbytes: int) -> torch.Tensor:
    """int32 ``[..., W]`` -> uint8 ``[..., nbytes]``, little-endian by arithmetic (inverse of bytes_to_words)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    b = torch.stack([(w >> (8 * i)) & 0xFF for i in range(4)], dim=-1).reshape(*words.shape[:-1], -1)
    return b[..., :nbytes].to(torch.uint8).contiguous()


def exact_reciprocal(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A float32 ``r`` with ``fp32(1 / r) == x`` (how importers invert compressed-tensors' NVFP4 global
    scales), searched among the float32 neighbours of ``1/x``; ``(nearest, False)`` when none exists."""
    x = x.detach().float().reshape(()).cpu()
    r0 = (1.0 / x).float()
    best, best_err = r0, float("inf")
    for d in (0, -1, 1, -2, 2, -3, 3):
        r = (r0.view(torch.int32) + d).view(torch.float32)
        back = (1.0 / r).float()
        if torch.equal(back, x):
            return r, True
        err = abs(float(back) - float(x))
        if err < best_err:
            best, best_err = r, err
    return best, False


def _wide_scales(qw: QuantWeight, fmt: str, prefix: str) -> torch.Tensor:
    d = qw.scheme.scale.dtype
    if not isinstance(d, WideFloat) or qw.scheme.scale.global_scale:
        raise ExportError(f"{fmt} stores integer-weight scales as fp16/bf16/fp32; layer {prefix} has "
                          f"{qw.scheme.scale} scales (scheme {qw.scheme.name})")
    return qw.scales


# --- GPTQ (v2: true zeros) ------------------------------------------------------------------------------------
GPTQ_BITS = (2, 3, 4, 8)


def gptq_layer(qw: QuantWeight, prefix: str) -> tuple[dict[str, torch.Tensor], dict]:
    """-> (tensors, settings ``{bits, group_size, sym, desc_act}``).  v2 semantics: ``qzeros`` holds the true
    zero (v1's ``zero - 1`` cannot express zero 0, which asymmetric round-to-nearest produces)."""
    s, fmt = qw.scheme, "GPTQ"
    if not isinstance(s.weight, IntType) or s.bits not in GPTQ_BITS:
        raise ExportError(f"GPTQ holds {'/'.join(map(str, GPTQ_BITS))}-bit integer weights; layer {prefix} has "
                          f"scheme {s.name} (try format='compressed-tensors')")
    if s.act is not None:
        raise ExportError(f"GPTQ is weight-only; layer {prefix} quantizes activations ({s.act}), scheme {s.name}")
    if s.scale.block_n != 1:
        raise ExportError(f"GPTQ scales are per output channel (per group along K); layer {prefix} has "
                          f"{s.scale.granularity} scales (scheme {s.name})")
    scales = _wide_scales(qw, fmt, prefix)
    k, g = qw.K, s.group_k(qw.K)
    if k % g:
        raise ExportError(f"GPTQ: group size {g} does not divide K={k} in {prefix}")
    words, g_idx = _logical_order(_unsigned_words(qw), qw)
    if g_idx is None:
        g_idx = (torch.arange(k, device=words.device) // g).to(torch.int32)
    zeros = _int_zeros(qw, fmt, prefix)                                      # [N, K/G]
    t = {"qweight": words.t(), "qzeros": pack_codes(zeros.t().contiguous(), s.bits), "scales": scales.t(),
         "g_idx": g_idx}
    if qw.bias is not None:
        t["bias"] = qw.bias
    settings = {"bits": s.bits, "group_size": g if s.scale.block_k else -1, "sym": bool(s.weight.signed),
                "desc_act": qw.k_perm is not None}
    return {f"{prefix}.{name}": v.contiguous() for name, v in t.items()}, settings


# --- compressed-tensors ---------------------------------------------------------------------------------------
def _strategy(qw: QuantWeight) -> dict:
    sc = qw.scheme.scale
    if (sc.block_n, sc.block_k) == (0, 0):
        return {"strategy": "tensor"}
    if sc.block_n == 1 and sc.block_k == 0:
        return {"strategy": "channel"}
    if sc.block_n == 1:
        return {"strategy": "group", "group_size": sc.block_k}
    return {"strategy": "block", "block_structure": [sc.block_n, sc.block_k]}


def _act_type(e) -> dict:
    if isinstance(e, FloatType) and str(e) in ("e4m3fn", "e2m1"):
        return {"num_bits": e.bits, "type": "float"}
    if isinstance(e, IntType) and e.signed:
        return {"num_bits": e.bits, "type": "int"}
    raise ExportError(f"compressed-tensors has no activation type for {e}")


def _ct_act(act: ActQuant | None, input_scale, prefix: str) -> tuple[dict | None, dict]:
    """Our activation quantization -> ``input_activations`` (+ tensors), checked by running the importer's own
    parser on the result: whatever it reads back must be exactly ``act``."""
    if act is None:
        return None, {}
    cfg, tensors, exact = {**_act_type(act.dtype), "symmetric": True}, {}, True
    if act.global_scale:
        if input_scale is None:
            raise ExportError(f"compressed-tensors NVFP4 activations need a calibrated global scale; layer {prefix} "
                              f"has dynamic {act} (scheme act without :static)")
        r, exact = exact_reciprocal(input_scale)
        cfg.update(strategy="tensor_group", group_size=act.group_k, dynamic="local")
        tensors["input_global_scale"] = r.reshape(1)
    elif act.static:
        cfg.update(strategy="tensor", dynamic=False)
        if input_scale is None:
            raise ExportError(f"layer {prefix}: static activation quantization without an input_scale")
        tensors["input_scale"] = input_scale.detach().float().reshape(1)
    elif act.group_k:
        cfg.update(strategy="group", group_size=act.group_k, dynamic=True)
    else:
        cfg.update(strategy="token" if act.per_token else "tensor", dynamic=True)
    got, _ = ct._act({"input_activations": cfg}, Tensors({f"{prefix}.{k}": v for k, v in tensors.items()}), prefix)
    if got != act:
        raise ExportError(f"compressed-tensors cannot express activation quantization {act} of layer {prefix} "
                          f"(the nearest it has reads back as {got})")
    if not exact:
        raise ExportError(f"layer {prefix}: NVFP4 activation global scale {float(input_scale)!r} has no exact "
                          "float32 reciprocal (compressed-tensors stores 1/scale)")
    return cfg, tensors


def ct_layer(qw: QuantWeight, prefix: str,
             inexact: list[str]) -> tuple[dict[str, torch.Tensor], str, dict, dict | None]:
    """-> (tensors, format, ``weights`` config, ``input_activations`` config).  Layers whose NVFP4 global
    scale has no exact float32 reciprocal are appended to ``inexact`` (they reload 1 ulp off)."""
    s, fmt = qw.scheme, "compressed-tensors"
    act_cfg, t = _ct_act(s.act, qw.input_scale, prefix)
    et = s.weight
    if isinstance(et, IntType):
        scales = _wide_scales(qw, fmt, prefix)
        if s.zero == "float":
            raise ExportError(f"compressed-tensors stores integer zero points; layer {prefix} has float zeros "
                              f"(scheme {s.name})")
        words, g_idx = _logical_order(_unsigned_words(qw), qw)
        t.update(weight_packed=words, weight_scale=scales,
                 weight_shape=torch.tensor([qw.N, qw.K], dtype=torch.int64))
        sym = bool(et.signed)
        if not sym:  # zeros packed along N (dense), offset like the codes: the stored value is our uint zero
            z = _int_zeros(qw, fmt, prefix)
            if z.numel() == 1:  # the importer reads a one-element zero point as the unpacked signed value
                t["weight_zero_point"] = (z - (1 << (s.bits - 1))).to(torch.int8)
            else:
                t["weight_zero_point"] = pack_codes(z.t().contiguous(), s.bits).t()
        if g_idx is not None:
            t["weight_g_idx"] = g_idx
        wcfg = {"num_bits": s.bits, "type": "int", "symmetric": sym, "dynamic": False, **_strategy(qw),
                "actorder": "group" if g_idx is not None else None}
        form = "pack-quantized"
    elif str(et) in ("e4m3fn", "e5m2") and isinstance(s.scale.dtype, WideFloat) and not s.scale.global_scale:
        if qw.k_perm is not None:
            raise ExportError(f"compressed-tensors float-quantized layers carry no act-order; layer {prefix}")
        codes = unpack_codes(qw.data, 8, qw.K).to(torch.uint8)
        t.update(weight=codes.view(torch.float8_e4m3fn if str(et) == "e4m3fn" else torch.float8_e5m2),
                 weight_scale=qw.scales)
        wcfg = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, **_strategy(qw)}
        form = "float-quantized"
    elif str(et) == "e2m1" and s.scale.block_n == 1 and (str(s.scale.dtype), s.scale.block_k, s.scale.global_scale) \
            in (("e4m3fn", 16, True), ("e8m0", 32, False)):
        if qw.k_perm is not None:
            raise ExportError(f"compressed-tensors fp4 layers carry no act-order; layer {prefix}")
        nv = s.scale.global_scale
        t.update(weight_packed=words_to_bytes(qw.data, (qw.K + 1) // 2),
                 weight_scale=qw.scales.view(torch.float8_e4m3fn) if nv else qw.scales)
        if nv:
            r, exact = exact_reciprocal(qw.global_scale)
            if not exact:
                inexact.append(prefix)
            t["weight_global_scale"] = r.reshape(1)
            wcfg = {"num_bits": 4, "type": "float", "symmetric": True, "dynamic": False, "strategy": "tensor_group",
                    "group_size": 16}
        else:
            wcfg = {"num_bits": 4, "type": "float", "symmetric": True, "dynamic": False, "strategy": "group",
                    "group_size": 32, "scale_dtype": "e8m0"}
        form = "nvfp4-pack-quantized" if nv else "mxfp4-pack-quantized"
    else:
        raise ExportError(f"compressed-tensors cannot express scheme {s.name} (layer {prefix}): it has integer "
                          "weights with fp16/bf16/fp32 scales (pack-quantized), fp8 weights (float-quantized), "
                          "nvfp4 (e2m1 + e4m3:g16 + global) and mxfp4 (e2m1 + e8m0:g32)")
    if qw.bias is not None:
        t["bias"] = qw.bias
    return {f"{prefix}.{k}": v.contiguous() for k, v in t.items()}, form, wcfg, act_cfg
