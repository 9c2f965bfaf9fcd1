"""Holding a QuantWeight inside an nn.Module as buffers.

Why buffers: ``.to(device)``, ``state_dict`` / ``load_state_dict``, ``torch.compile`` and FSDP-style tooling all
see a module's tensors only through its parameters and buffers.  Why a dtype guard: ``model.to(torch.bfloat16)``
(or ``.half()``) casts every floating buffer, which would silently round fp32 scales / global scales to bf16 and
break the scheme's storage contract; quantized tensors therefore follow device moves but never dtype casts.
"""
from __future__ import annotations

import torch

from ..formats.weight import QuantWeight
from ..ops import quant_weight_from_args

# QuantWeight field -> buffer-name suffix (the bias is registered by each module: it follows the model's dtype)
FIELDS = (("data", "packed"), ("scales", "scale"), ("zeros", "zero_point"), ("global_scale", "global_scale"),
          ("input_scale", "input_scale"))


class QuantBuffersMixin:
    """Registers QuantWeights under a name prefix and rebuilds them (cached) from the current buffers."""

    _dtype_frozen: tuple[str, ...] = ()

    def _register_quant_weight(self, prefix: str, qw: QuantWeight) -> None:
        names = []
        for field, suffix in FIELDS:
            name = f"{prefix}_{suffix}"
            self.register_buffer(name, getattr(qw, field))
            names.append(name)
        self.register_buffer(f"{prefix}_k_perm", getattr(qw, "k_perm", None))  # act-order (newer QuantWeights)
        self._dtype_frozen = (*self._dtype_frozen, *names)
        self._meta = {**getattr(self, "_meta", {}), prefix: (str(qw.scheme), list(qw.shape))}

    def _weight_args(self, prefix: str, bias: torch.Tensor | None) -> tuple:
        """The ops' positional weight arguments: data, scales, zeros, global, input scale, bias, k_perm, scheme,
        shape."""
        b = self._buffers
        scheme, shape = self._meta[prefix]
        return (*(b[f"{prefix}_{s}"] for _, s in FIELDS), bias, b[f"{prefix}_k_perm"], scheme, shape)

    def _quant_weight(self, prefix: str, bias: torch.Tensor | None = None) -> QuantWeight:
        return quant_weight_from_args(*self._weight_args(prefix, bias))

    def _apply(self, fn, recurse=True):
        order = list(self._buffers)
        frozen = {n: self._buffers.pop(n) for n in self._dtype_frozen if n in self._buffers}
        try:
            result = super()._apply(fn, recurse)
        finally:
            for n, t in frozen.items():
                if t is not None:
                    moved = fn(t)
                    frozen[n] = moved if moved.dtype == t.dtype else t.to(device=moved.device)
            rest = dict(self._buffers)
            self._buffers.clear()
            for n in order:
                self._buffers[n] = frozen[n] if n in frozen else rest.pop(n)
            self._buffers.update(rest)
        return result

