"""QuantScheme: the complete description of a quantized linear layer's numerics (data, no code paths).

Full string form (what ``str(scheme)`` prints and ``QuantScheme.parse`` reads)::

    weight=<elem>,scale=<scale dtype>:<granularity>[+global],zero=<none|int|float>,act=<none|<act spec>>

* weight granularity: ``tensor`` | ``channel`` | ``g<K>`` (group of K along the input dim) |
  ``b<N>x<K>`` (2-D block).  ``+global`` adds an fp32 per-tensor scale multiplied on top (NVFP4).
* act spec: ``<elem>/<scale dtype>:<token|tensor|g<K>>[+global][:static]``; ``none`` means 16-bit activations.

Examples: ``weight=int4,scale=fp16:g128,zero=none,act=none`` (= preset ``w4a16``);
``weight=e2m1,scale=e4m3fn:g16+global,zero=none,act=e2m1/e4m3fn:g16+global`` (= ``w4a4-nvfp4``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .dtypes import ElementType, IntType, ScaleType, WideFloat, parse_element_type, parse_scale_type

__all__ = ["ScaleSpec", "ActQuant", "QuantScheme", "PRESETS"]

ZERO_KINDS = ("none", "int", "float")


def _gran_str(block_n: int, block_k: int) -> str:
    if block_n == 0 and block_k == 0:
        return "tensor"
    if block_n == 1 and block_k == 0:
        return "channel"
    if block_n == 1:
        return f"g{block_k}"
    return f"b{block_n}x{block_k}"


def _parse_gran(text: str, *, act: bool) -> tuple[int, int]:
    """-> (block_n, block_k); for activations block_n means 'rows per scale' (1 = per token)."""
    if text == "tensor":
        return 0, 0
    if text == ("token" if act else "channel"):
        return 1, 0
    m = re.fullmatch(r"g(\d+)", text)
    if m and int(m.group(1)) > 0:
        return 1, int(m.group(1))
    m = re.fullmatch(r"b(\d+)x(\d+)", text)
    if m and not act and int(m.group(1)) > 0 and int(m.group(2)) > 0:
        return int(m.group(1)), int(m.group(2))
    allowed = "token | tensor | g<K>" if act else "tensor | channel | g<K> | b<N>x<K>"
    raise ValueError(f"bad {'activation' if act else 'weight'} scale granularity {text!r}; expected {allowed}")


@dataclass(frozen=True)
class ScaleSpec:
    """Weight scales: one scale per ``block_n x block_k`` tile of the ``[N, K]`` weight (0 = the whole axis)."""

    dtype: ScaleType
    block_n: int = 1
    block_k: int = 128
    global_scale: bool = False

    @property
    def granularity(self) -> str:
        return _gran_str(self.block_n, self.block_k)

    def __str__(self) -> str:
        return f"{self.dtype}:{self.granularity}{'+global' if self.global_scale else ''}"

    @staticmethod
    def parse(text: str) -> "ScaleSpec":
        body, glob = (text[:-7], True) if text.endswith("+global") else (text, False)
        if ":" not in body:
            raise ValueError(f"bad scale spec {text!r}; expected <dtype>:<granularity>[+global], e.g. fp16:g128")
        dt, gran = body.split(":", 1)
        bn, bk = _parse_gran(gran, act=False)
        return ScaleSpec(parse_scale_type(dt), bn, bk, glob)


@dataclass(frozen=True)
class ActQuant:
    """Activation quantization: element type, scale dtype, group along K (0 = whole row), per token or per
    tensor, optional fp32 global scale (NV), dynamic (computed per call) or static (calibrated input_scale)."""

    dtype: ElementType
    scale_dtype: ScaleType
    per_token: bool = True
    group_k: int = 0
    global_scale: bool = False
    static: bool = False

    def __str__(self) -> str:
        gran = "token" if self.per_token and self.group_k == 0 else ("tensor" if not self.per_token else f"g{self.group_k}")
        return (f"{self.dtype}/{self.scale_dtype}:{gran}{'+global' if self.global_scale else ''}"
                f"{':static' if self.static else ''}")

    def shape_error(self, k: int) -> str | None:
        """Why activations with ``k`` columns cannot be quantized this way (None if they can): a group must
        divide K (a partial last group has no agreed scale rule; the reference and every kernel refuse it)."""
        if self.group_k and k % self.group_k:
            return f"activation group size {self.group_k} does not divide K={k}"
        return None

    @staticmethod
    def parse(text: str) -> "ActQuant | None":
        if text in ("none", "16", "bf16", "fp16"):
            return None
        static = text.endswith(":static")
        body = text[: -len(":static")] if static else text
        glob = body.endswith("+global")
        body = body[: -len("+global")] if glob else body
        m = re.fullmatch(r"([a-z0-9]+)/([a-z0-9]+):([a-z0-9]+)", body)
        if not m:
            raise ValueError(f"bad activation spec {text!r}; expected none or <elem>/<scale dtype>:<token|tensor|g<K>>"
                             "[+global][:static], e.g. e4m3fn/fp32:token")
        elem, sdt, gran = m.groups()
        bn, bk = _parse_gran(gran, act=True)
        return ActQuant(parse_element_type(elem), parse_scale_type(sdt), per_token=bn == 1, group_k=bk,
                        global_scale=glob, static=static)


@dataclass(frozen=True)
class QuantScheme:
    weight: ElementType
    scale: ScaleSpec
    zero: str = "none"
    act: ActQuant | None = None

    def __post_init__(self):
        if self.zero not in ZERO_KINDS:
            raise ValueError(f"zero point must be one of {ZERO_KINDS}, got {self.zero!r}")
        if self.zero != "none" and not (isinstance(self.weight, IntType) and not self.weight.signed):
            raise ValueError(f"a zero point needs an unsigned integer weight type, got {self.weight} with zero={self.zero}")
        if self.scale.global_scale and isinstance(self.scale.dtype, WideFloat):
            raise ValueError("a global scale is only meaningful with low-precision (e4m3/e8m0) block scales")
        if self.act is not None and self.act.dtype.bits > 8:
            raise ValueError("quantized activations must be at most 8 bits")

    # --- text ------------------------------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"weight={self.weight},scale={self.scale},zero={self.zero},act={self.act or 'none'}"

    @property
    def name(self) -> str:
        """The preset name when this scheme is a preset, else the full string."""
        return _PRESET_BY_STR.get(str(self), str(self))

    @staticmethod
    def parse(text: "str | QuantScheme") -> "QuantScheme":
        if isinstance(text, QuantScheme):
            return text
        key = str(text).strip().lower()
        if key in PRESETS:
            return PRESETS[key]
        if "=" not in key:
            raise ValueError(f"unknown quantization preset {text!r}; presets: {', '.join(sorted(PRESETS))} "
                             "(or a full string like 'weight=int4,scale=fp16:g128,zero=none,act=none')")
        fields: dict[str, str] = {}
        for part in key.split(","):
            k, sep, v = part.partition("=")
            if not sep or k.strip() not in ("weight", "scale", "zero", "act"):
                raise ValueError(f"bad scheme field {part!r} in {text!r}; fields are weight, scale, zero, act")
            fields[k.strip()] = v.strip()
        if "weight" not in fields or "scale" not in fields:
            raise ValueError(f"scheme {text!r} needs at least weight= and scale=")
        return QuantScheme(parse_element_type(fields["weight"]), ScaleSpec.parse(fields["scale"]),
                           fields.get("zero", "none"), ActQuant.parse(fields.get("act", "none")))

    # --- facts kernels and dispatch need ----------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.weight.bits

    @property
    def weight_only(self) -> bool:
        return self.act is None

    def group_k(self, k: int) -> int:
        """Effective K extent of one scale (the whole K for channel/tensor scales)."""
        return self.scale.block_k or k

    def group_n(self, n: int) -> int:
        return self.scale.block_n or n

    def shape_error(self, n: int, k: int) -> str | None:
        """Why an ``[N, K]`` weight cannot take this scheme (None if it can) -- the one shape rule that
        ``quantize_weight`` applies when quantizing and the reference / kernels apply to every call: a group of K
        (``g<K>``, one row per scale) must divide K, and so must the activation group.  2-D blocks (``b<N>x<K>``)
        may be partial at the edges."""
        bk = self.scale.block_k
        if bk and self.scale.block_n == 1 and k % bk:
            return f"group size {bk} does not divide K={k}"
        if self.act is not None:
            return self.act.shape_error(k)
        return None


_PRESET_STRINGS = {
    "w4a16": "weight=int4,scale=fp16:g128",
    "w4a16-asym": "weight=uint4,scale=fp16:g128,zero=int",
    "w8a16": "weight=int8,scale=fp16:channel",
    "w8a16-asym": "weight=uint8,scale=fp16:channel,zero=int",
    "w3a16": "weight=uint3,scale=fp16:g128,zero=int",
    "w2a16": "weight=uint2,scale=fp16:g128,zero=int",
    "w1a16": "weight=uint1,scale=fp16:g128,zero=float",
    "mxfp4": "weight=e2m1,scale=e8m0:g32",
    "mxint4": "weight=int4,scale=e8m0:g32",
    "nvfp4": "weight=e2m1,scale=e4m3fn:g16+global",
    "w6a16-fp6": "weight=e3m2,scale=fp16:g128",
    "w8a16-fp8": "weight=e4m3fn,scale=fp32:channel",
    "w8a16-fp8-block": "weight=e4m3fn,scale=fp32:b128x128",
    "w8a8-fp8": "weight=e4m3fn,scale=fp32:channel,act=e4m3fn/fp32:token",
    "w8a8-fp8-block": "weight=e4m3fn,scale=fp32:b128x128,act=e4m3fn/fp32:g128",
    "w8a8-int8": "weight=int8,scale=fp32:channel,act=int8/fp32:token",
    "w4a8-fp8": "weight=int4,scale=fp16:g128,act=e4m3fn/fp32:token",
    "w4a8-int8": "weight=int4,scale=fp16:g128,act=int8/fp32:token",
    "w4a8-mxfp4": "weight=e2m1,scale=e8m0:g32,act=e4m3fn/fp32:token",
    "w4a4-nvfp4": "weight=e2m1,scale=e4m3fn:g16+global,act=e2m1/e4m3fn:g16+global",
    "w4a4-mxfp4": "weight=e2m1,scale=e8m0:g32,act=e2m1/e8m0:g32",
    "w4a8-mx": "weight=e2m1,scale=e8m0:g32,act=e4m3fn/e8m0:g32",
    "w8a8-mxfp8": "weight=e4m3fn,scale=e8m0:g32,act=e4m3fn/e8m0:g32",
}
PRESETS: dict[str, QuantScheme] = {}
for _name, _text in _PRESET_STRINGS.items():
    PRESETS[_name] = QuantScheme.parse(_text)
_PRESET_BY_STR = {str(s): n for n, s in PRESETS.items()}
WEIGHT_ONLY_PRESETS = tuple(n for n, s in PRESETS.items() if s.act is None)
