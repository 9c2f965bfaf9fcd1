"""QuantWeight: packed codes + scales (+ zeros, + global scale) + scheme + logical shape.

Canonical layout ``"kpack32"`` (every backend reads this; kernel-specific layouts are cached views):

=============  ================================================  ===========================================
field          shape                                             dtype / meaning
=============  ================================================  ===========================================
``data``       ``[*lead, N, ceil(K*bits/32)]``                   int32, codes packed along K (see packing.py)
``scales``     ``[*lead, ceil(N/bn), ceil(K/bk)]``               fp32/fp16/bf16 as the scheme says; e8m0 and
                                                                 e4m3 scales as uint8 codes
``zeros``      same as scales, or None                          uint8 integer zero codes (``zero=int``) or
                                                                 the scale's float dtype (``zero=float``)
``global_scale`` ``[*lead]`` or None                             fp32, multiplied on top (NVFP4)
``input_scale``  ``[]`` or None                                  fp32 static activation scale (calibrated)
=============  ================================================  ===========================================

``lead`` is ``()`` for a linear layer and ``(E,)`` for MoE experts.  ``bn``/``bk`` are the scheme's scale block
(``channel`` = 1 x K, ``tensor`` = N x K).  Value of element ``[n, k]``::

    w = decode(q) * s[n//bn, k//bk] * global            (zero = none)
    w = (q - z[n//bn, k//bk]) * s[n//bn, k//bk]          (zero = int | float; q is the unsigned code)

``k_perm`` (act-order, e.g. GPTQ ``desc_act``): when set, the packed codes/scales/zeros describe the weight
with its K axis permuted, so that scale groups are contiguous: stored column ``j`` is logical column
``k_perm[j]``.  ``dequantize_weight`` returns the *logical* weight (``w[..., k_perm] = w_stored``), so
``y = x @ w.T = x[..., k_perm] @ w_stored.T``: a backend gathers the activation's K once per call (or folds
the gather into its loads) and then runs the ordinary grouped kernel on the stored layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from .dtypes import WideFloat
from .packing import packed_words
from .scheme import QuantScheme

__all__ = ["QuantWeight", "LAYOUT", "scale_shape", "decode_scales"]

LAYOUT = "kpack32"


def scale_shape(scheme: QuantScheme, n: int, k: int) -> tuple[int, int]:
    bn, bk = scheme.group_n(n), scheme.group_k(k)
    return (n + bn - 1) // bn, (k + bk - 1) // bk


def scale_storage_dtype(scheme: QuantScheme) -> torch.dtype:
    d = scheme.scale.dtype
    return d.torch_dtype if isinstance(d, WideFloat) else torch.uint8


def zero_storage_dtype(scheme: QuantScheme) -> torch.dtype | None:
    if scheme.zero == "none":
        return None
    if scheme.zero == "int":
        return torch.uint8
    d = scheme.scale.dtype
    return d.torch_dtype if isinstance(d, WideFloat) else torch.float32


def decode_scales(scales: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """Stored scales -> float32 values."""
    d = scheme.scale.dtype
    if isinstance(d, WideFloat):
        return scales.float()
    return d.decode(scales)


def _version(t: torch.Tensor | None) -> int | None:
    if t is None:
        return None
    try:
        return t._version
    except RuntimeError:  # inference tensors: no version counter (and immutable outside inference mode)
        return -1


@dataclass
class QuantWeight:
    data: torch.Tensor
    scales: torch.Tensor
    scheme: QuantScheme
    shape: tuple[int, ...]
    zeros: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None
    input_scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    layout: str = LAYOUT
    k_perm: torch.Tensor | None = None
    # kernel-specific views made once (e.g. a repacked layout), keyed by the backend that made them
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self.shape = tuple(int(d) for d in self.shape)
        self.validate()

    def __getstate__(self) -> dict:
        """Pickling (torch.save, deepcopy) leaves the run-time cache behind: backend views, planned launches and
        dispatch choices are remade on first use, never serialized."""
        state = self.__dict__.copy()
        state["cache"] = {}
        return state

    def cached_view(self, backend: str, key, make):
        """A backend's view derived from this weight's tensors (a repacked layout), made by ``make()`` once and
        made again when one of the tensors it came from is replaced or edited in place (its version counter moved):
        a stale repack is never used.  Holds the tensors it was made from, so an id cannot be reused under it."""
        tensors = (self.data, self.scales, self.zeros, self.global_scale, self.k_perm)
        versions = tuple(_version(t) for t in tensors)
        state = self.cache.setdefault(backend, {})
        hit = state.get(key)
        if hit is not None and hit[1] == versions and all(a is b for a, b in zip(hit[0], tensors)):
            return hit[2]
        value = make()
        state[key] = (tensors, versions, value)
        return value

    # --- facts --------------------------------------------------------------------------------------------------
    @property
    def N(self) -> int:
        return self.shape[-2]

    @property
    def K(self) -> int:
        return self.shape[-1]

    @property
    def lead(self) -> tuple[int, ...]:
        return self.shape[:-2]

    @property
    def num_experts(self) -> int | None:
        return self.shape[0] if len(self.shape) == 3 else None

    @property
    def device(self) -> torch.device:
        return self.data.device

    def nbytes(self) -> int:
        ts = [self.data, self.scales, self.zeros, self.global_scale]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def to(self, device) -> "QuantWeight":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(self, data=mv(self.data), scales=mv(self.scales), zeros=mv(self.zeros),
                       global_scale=mv(self.global_scale), input_scale=mv(self.input_scale), bias=mv(self.bias),
                       k_perm=mv(self.k_perm), cache={})

    def expert(self, e: int) -> "QuantWeight":
        """The 2-D QuantWeight of expert ``e`` (views, no copies)."""
        if self.num_experts is None:
            raise ValueError("expert() needs a 3-D [E, N, K] QuantWeight")
        pick = lambda t: None if t is None else t[e]  # noqa: E731
        gs = None if self.global_scale is None else self.global_scale[e]
        kp = None if self.k_perm is None else (self.k_perm[e] if self.k_perm.dim() == 2 else self.k_perm)
        return QuantWeight(self.data[e], self.scales[e], self.scheme, self.shape[1:], pick(self.zeros), gs,
                           self.input_scale, pick(self.bias), k_perm=kp)

    # --- checks -------------------------------------------------------------------------------------------------
    def validate(self) -> None:
        s = self.scheme
        if not isinstance(s, QuantScheme):
            raise TypeError(f"scheme must be a QuantScheme, got {type(s).__name__}")
        if len(self.shape) not in (2, 3):
            raise ValueError(f"QuantWeight logical shape must be [N, K] or [E, N, K], got {list(self.shape)}")
        if self.layout != LAYOUT:
            raise ValueError(f"unknown QuantWeight layout {self.layout!r}; the canonical layout is {LAYOUT!r}")
        n, k = self.N, self.K
        want = (*self.lead, n, packed_words(k, s.bits))
        if self.data.dtype != torch.int32 or tuple(self.data.shape) != want:
            raise ValueError(f"packed data for logical shape {list(self.shape)} with {s.bits}-bit codes must be int32 "
                             f"{list(want)}, got {self.data.dtype} {list(self.data.shape)}")
        sshape = (*self.lead, *scale_shape(s, n, k))
        sdt = scale_storage_dtype(s)
        if self.scales.dtype != sdt or tuple(self.scales.shape) != sshape:
            raise ValueError(f"scales for {s.scale} must be {sdt} {list(sshape)}, got {self.scales.dtype} "
                             f"{list(self.scales.shape)}")
        zdt = zero_storage_dtype(s)
        if zdt is None and self.zeros is not None:
            raise ValueError(f"scheme {s.name} has no zero point but zeros were given")
        if zdt is not None and (self.zeros is None or self.zeros.dtype != zdt or tuple(self.zeros.shape) != sshape):
            got = None if self.zeros is None else f"{self.zeros.dtype} {list(self.zeros.shape)}"
            raise ValueError(f"zeros for zero={s.zero} must be {zdt} {list(sshape)}, got {got}")
        if s.scale.global_scale:
            if self.global_scale is None or self.global_scale.dtype != torch.float32 or \
                    tuple(self.global_scale.shape) != tuple(self.lead):
                got = None if self.global_scale is None else f"{self.global_scale.dtype} {list(self.global_scale.shape)}"
                raise ValueError(f"scheme {s.name} needs an fp32 global_scale of shape {list(self.lead)}, got {got}")
        elif self.global_scale is not None:
            raise ValueError(f"scheme {s.name} has no global scale but one was given")
        if self.bias is not None and tuple(self.bias.shape) != (*self.lead, n):
            raise ValueError(f"bias must have shape {[*self.lead, n]}, got {list(self.bias.shape)}")
        if self.k_perm is not None:
            kp = self.k_perm
            if kp.dtype != torch.int64 or tuple(kp.shape) not in ((k,), (*self.lead, k)):
                raise ValueError(f"k_perm must be int64 of shape [{k}] or {[*self.lead, k]}, got {kp.dtype} "
                                 f"{list(kp.shape)}")
            if not torch.equal(kp.sort(dim=-1).values, torch.arange(k, device=kp.device).expand_as(kp)):
                raise ValueError("k_perm must be a permutation of range(K) (each row holds every index once)")
        devs = {t.device for t in (self.data, self.scales, self.zeros, self.global_scale, self.k_perm)
                if t is not None}
        if len(devs) > 1:
            raise ValueError(f"QuantWeight tensors live on different devices: {sorted(map(str, devs))}")

