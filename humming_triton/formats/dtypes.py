"""Element types: what the bits of one quantized value mean.

Two families cover every weight/activation element a scheme can name:

* ``IntType(bits, signed)`` -- two's complement (signed) or plain binary (unsigned), 1..8 bits.
* ``FloatType(exp, man, signed, special)`` -- ExMy minifloats of at most 8 bits.  ``special`` is the
  finite/NaN/Inf convention: ``"finite"`` (every code is a number: OCP FP4/FP6), ``"fn"`` (only the
  all-ones magnitude is NaN: e4m3fn), ``"ieee"`` (max exponent holds Inf/NaN: e5m2), ``"e8m0"`` (exponent
  only, no zero, 0xFF is NaN: the OCP MX scale).

A *code* is always the raw bit pattern as an unsigned integer in ``[0, 2**bits)``; ``decode`` maps codes to
float values, ``encode`` rounds float values to the nearest code (ties to even code).  Scale types add the
wide float dtypes fp32 / fp16 / bf16, which are stored as torch tensors of that dtype.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch

__all__ = [
    "ElementType", "IntType", "FloatType", "ScaleType", "WideFloat", "parse_element_type", "parse_scale_type",
    "ELEMENT_TYPE_NAMES",
]


class ElementType:
    """Common interface of IntType and FloatType (pure data, hashable)."""

    bits: int
    name: str

    @property
    def num_codes(self) -> int:
        return 1 << self.bits

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (any integer dtype) -> float32 values (exact)."""
        return _on_device(self, "table", codes.device)[codes.long()]

    def value_table(self) -> torch.Tensor:
        """float32 tensor of length 2**bits: the value of every code (NaN/Inf where the convention says)."""
        return _value_table(self)

    def finite_max(self) -> float:
        t = self.value_table()
        return float(t[torch.isfinite(t)].max())

    def finite_min(self) -> float:
        t = self.value_table()
        return float(t[torch.isfinite(t)].min())

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        """Round float values to the nearest representable code (ties to even code), saturating at the
        finite range.  NaN input is an error (the quantizer checks it before calling)."""
        return _encode_nearest(self, values)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class IntType(ElementType):
    bits: int
    signed: bool

    def __post_init__(self):
        if not 1 <= self.bits <= 8:
            raise ValueError(f"integer element type must have 1..8 bits, got {self.bits}")

    @property
    def name(self) -> str:
        return f"{'int' if self.signed else 'uint'}{self.bits}"

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        # round half to even (torch.round), saturate, then two's complement code
        q = torch.round(values.double()).clamp(self.qmin, self.qmax).to(torch.int32)
        return (q & ((1 << self.bits) - 1)).to(torch.int32)


_SPECIALS = ("finite", "fn", "ieee", "e8m0")


@dataclass(frozen=True)
class FloatType(ElementType):
    exp: int
    man: int
    signed: bool = True
    special: str = "finite"
    bias: int | None = None  # default 2**(exp-1) - 1

    def __post_init__(self):
        if self.special not in _SPECIALS:
            raise ValueError(f"unknown float convention {self.special!r}; expected one of {_SPECIALS}")
        if self.exp < 1 or self.man < 0 or self.bits > 8:
            raise ValueError(f"float element type e{self.exp}m{self.man} must have exp >= 1 and at most 8 bits")
        if self.special == "e8m0" and (self.man != 0 or self.signed):
            raise ValueError("the e8m0 convention is for unsigned exponent-only types")

    @property
    def bits(self) -> int:  # type: ignore[override]
        return int(self.signed) + self.exp + self.man

    @property
    def exp_bias(self) -> int:
        return self.bias if self.bias is not None else (1 << (self.exp - 1)) - 1

    @property
    def name(self) -> str:
        for n, t in _NAMED_FLOATS.items():
            if t == self:
                return n
        base = f"{'' if self.signed else 'u'}e{self.exp}m{self.man}"
        suffix = {"finite": "", "fn": "fn", "ieee": "ieee", "e8m0": ""}[self.special]
        bias = "" if self.bias is None else f"b{self.bias}"
        if not suffix and (base in _ALIASES or base in _NAMED_FLOATS):  # plain "e4m3" means e4m3fn: spell out
            suffix = "finite"
        return base + suffix + bias


@dataclass(frozen=True)
class WideFloat:
    """A scale stored as a native torch float dtype (fp32 / fp16 / bf16)."""

    name: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.name]

    @property
    def bits(self) -> int:
        return torch.finfo(self.torch_dtype).bits

    def __str__(self) -> str:
        return self.name


ScaleType = WideFloat | FloatType


# --- names -------------------------------------------------------------------------------------------------
E2M1 = FloatType(2, 1)
_NAMED_FLOATS: dict[str, FloatType] = {
    "e2m1": E2M1,
    "e2m3": FloatType(2, 3),
    "e3m2": FloatType(3, 2),
    "e4m3fn": FloatType(4, 3, special="fn"),
    "e5m2": FloatType(5, 2, special="ieee"),
    "e8m0": FloatType(8, 0, signed=False, special="e8m0", bias=127),
}
_ALIASES = {"fp4": "e2m1", "fp6": "e2m3", "fp6e2m3": "e2m3", "fp6e3m2": "e3m2", "fp8": "e4m3fn",
            "e4m3": "e4m3fn", "fp8e4m3": "e4m3fn", "fp8e5m2": "e5m2", "ue8m0": "e8m0"}
ELEMENT_TYPE_NAMES = sorted(list(_NAMED_FLOATS) + list(_ALIASES)) + ["int1..int8", "uint1..uint8", "eXmY[fn|ieee]"]

_INT_RE = re.compile(r"^(u?)int([1-8])$")
_FLOAT_RE = re.compile(r"^(u?)e(\d)m(\d)(fn|ieee|finite)?(?:b(-?\d+))?$")


@functools.lru_cache(maxsize=None)
def parse_element_type(name: str) -> ElementType:
    """``int4``, ``uint3``, ``e2m1``/``fp4``, ``e4m3fn``/``fp8``, ``e5m2``, arbitrary ``e3m3``, ``e5m0``,
    ``e4m2fn``, ``ue4m3``, ``e8m0``..."""
    if isinstance(name, ElementType):
        return name
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key in _NAMED_FLOATS:
        return _NAMED_FLOATS[key]
    m = _INT_RE.match(key)
    if m:
        return IntType(int(m.group(2)), signed=not m.group(1))
    m = _FLOAT_RE.match(key)
    if m:
        unsigned, e, mm, special, bias = m.groups()
        t = FloatType(int(e), int(mm), signed=not unsigned, special=special or "finite",
                      bias=None if bias is None else int(bias))
        return t
    raise ValueError(f"unknown element type {name!r}; known: {', '.join(ELEMENT_TYPE_NAMES)}")


def parse_scale_type(name: str) -> ScaleType:
    """Scale element types: fp32, fp16, bf16, e8m0 (2**(b-127)), e4m3 / ue4m3 (stored as e4m3fn)."""
    key = str(name).strip().lower()
    if key in ("ue4m3", "e4m3", "e4m3fn"):  # NVFP4 block scales: positive e4m3 values stored as e4m3fn bytes
        return _NAMED_FLOATS["e4m3fn"]
    if key in ("fp32", "float32", "fp16", "float16", "bf16", "bfloat16"):
        return WideFloat({"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(key, key))
    t = parse_element_type(key)
    if isinstance(t, FloatType) and t.bits == 8 and t.special in ("e8m0", "fn"):
        return _NAMED_FLOATS["e8m0"] if t.special == "e8m0" else _NAMED_FLOATS["e4m3fn"]
    raise ValueError(f"unsupported scale type {name!r}; expected fp32, fp16, bf16, e8m0 or e4m3")


# --- value tables and rounding -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _value_table(t: ElementType) -> torch.Tensor:
    codes = torch.arange(1 << t.bits, dtype=torch.float64)
    if isinstance(t, IntType):
        c = codes.long()
        if t.signed:
            c = torch.where(c >= (1 << (t.bits - 1)), c - (1 << t.bits), c)
        return c.float()
    assert isinstance(t, FloatType)
    c = codes.long()
    mag_bits = t.exp + t.man
    sign = ((c >> mag_bits) & 1) if t.signed else torch.zeros_like(c)
    e = (c >> t.man) & ((1 << t.exp) - 1)
    m = (c & ((1 << t.man) - 1)).double()
    frac = m / (1 << t.man)
    bias = t.exp_bias
    if t.special == "e8m0":
        val = torch.pow(2.0, e.double() - bias)
    else:
        normal = (1.0 + frac) * torch.pow(2.0, e.double() - bias)
        sub = frac * (2.0 ** (1 - bias))
        val = torch.where(e == 0, sub, normal)
    emax = (1 << t.exp) - 1
    mmax = (1 << t.man) - 1
    if t.special == "ieee":
        val = torch.where((e == emax) & (m == 0), torch.tensor(float("inf"), dtype=torch.float64), val)
        val = torch.where((e == emax) & (m != 0), torch.tensor(float("nan"), dtype=torch.float64), val)
    elif t.special == "fn":
        val = torch.where((e == emax) & (m == mmax), torch.tensor(float("nan"), dtype=torch.float64), val)
    elif t.special == "e8m0":
        val = torch.where(e == emax, torch.tensor(float("nan"), dtype=torch.float64), val)
    val = torch.where(sign == 1, -val, val)
    return val.float()


@functools.lru_cache(maxsize=None)
def _sorted_finite(t: ElementType) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted distinct finite values and, for each, its preferred code (even code first, +0 over -0)."""
    table = _value_table(t).double()
    codes = torch.arange(len(table))
    fin = torch.isfinite(table)
    vals, cds = table[fin], codes[fin]
    # order by value, then prefer the smaller code (so +0 = code 0 wins over -0)
    order = sorted(range(len(vals)), key=lambda i: (float(vals[i]), int(cds[i])))
    uniq_v, uniq_c = [], []
    for i in order:
        v = float(vals[i])
        if uniq_v and uniq_v[-1] == v:
            continue
        uniq_v.append(v)
        uniq_c.append(int(cds[i]))
    return torch.tensor(uniq_v, dtype=torch.float64), torch.tensor(uniq_c, dtype=torch.int32)


@functools.lru_cache(maxsize=None)
def _on_device(t: ElementType, what: str, device: torch.device) -> torch.Tensor:
    """Lookup tables copied to a device once (a copy per call would also break CUDA-graph capture)."""
    src = {"table": lambda: _value_table(t), "vals": lambda: _sorted_finite(t)[0],
           "codes": lambda: _sorted_finite(t)[1]}[what]()
    return src.to(device)


def _encode_nearest(t: ElementType, values: torch.Tensor) -> torch.Tensor:
    vals, cds = _on_device(t, "vals", values.device), _on_device(t, "codes", values.device)
    x = values.double().clamp(float(vals[0]), float(vals[-1]))
    hi = torch.searchsorted(vals, x).clamp(1, len(vals) - 1)  # vals[hi-1] < x <= vals[hi]
    lo = hi - 1
    d_lo, d_hi = x - vals[lo], vals[hi] - x
    take_hi = d_hi < d_lo
    tie = d_hi == d_lo
    # ties: the code whose mantissa LSB is 0 (round-half-to-even in the value grid)
    take_hi = take_hi | (tie & ((cds[hi] & 1) == 0) & ((cds[lo] & 1) == 1))
    idx = torch.where(take_hi, hi, lo)
    out = cds[idx]
    if isinstance(t, FloatType) and t.signed:  # negative values that round to zero keep their sign (-0)
        out = torch.where((vals[idx] == 0) & (x < 0), torch.full_like(out, 1 << (t.bits - 1)), out)
    return out
