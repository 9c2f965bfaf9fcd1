"""QuantLinear: an ``nn.Linear`` stand-in whose weight is a QuantWeight and whose forward is the custom op."""
from __future__ import annotations

import torch
from torch import nn

from cutlass_ext import native_op

from ..dispatch import check_backend_name
from ..formats.quantize import quantize_weight
from ..formats.scheme import QuantScheme
from ..formats.weight import QuantWeight
from ..kernels import compiled
from ..linear import quant_linear
from ..ops import eager_direct, quant_weight_from_args
from ._buffers import QuantBuffersMixin

__all__ = ["QuantLinear"]


class QuantLinear(QuantBuffersMixin, nn.Module):
    """``y = x @ dequant(W).T + bias`` for ``x [..., in_features]``.

    Buffers: ``weight_packed``, ``weight_scale``, ``weight_zero_point``, ``weight_global_scale``,
    ``weight_input_scale``, ``weight_k_perm`` (absent ones are None and not in the state dict) and ``bias``.  The bias follows the
    model's dtype; the quantized tensors keep theirs (see ``_buffers``).
    """

    def __init__(self, qw: QuantWeight, bias: torch.Tensor | None = None, backend: str = "auto"):
        super().__init__()
        if not isinstance(qw, QuantWeight):
            raise TypeError(f"QuantLinear needs a QuantWeight, got {type(qw).__name__}")
        if qw.num_experts is not None:
            raise ValueError(f"QuantLinear takes a 2-D [N, K] QuantWeight, got {list(qw.shape)}; use QuantMoE")
        check_backend_name(backend)
        bias = qw.bias if bias is None else bias
        if bias is not None and tuple(bias.shape) != (qw.N,):
            raise ValueError(f"bias must have shape [{qw.N}], got {list(bias.shape)}")
        self.in_features, self.out_features = qw.K, qw.N
        self.scheme: QuantScheme = qw.scheme
        self._scheme_key = qw.scheme.name  # a plain str: torch.compile folds what forward asks the switches with
        self.backend = backend
        self._register_quant_weight("weight", qw)
        self.register_buffer("bias", None if bias is None else bias.detach())

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: "QuantScheme | str", backend: str = "auto") -> "QuantLinear":
        """Quantize ``linear.weight`` round-to-nearest with ``scheme`` (on the weight's own device)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear needs an nn.Linear, got {type(linear).__name__}")
        qw = quantize_weight(linear.weight.detach(), scheme)
        return cls(qw, None if linear.bias is None else linear.bias.detach(), backend)

    @classmethod
    def from_quant_weight(cls, qw: QuantWeight, bias: torch.Tensor | None = None,
                          backend: str = "auto") -> "QuantLinear":
        return cls(qw, bias, backend)

    @property
    def quant_weight(self) -> QuantWeight:
        """The QuantWeight over the current buffers (cached while they are unchanged)."""
        return self._quant_weight("weight")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the bias goes in the op's override slot, so the QuantWeight rebuilt inside stays bias-free and cached
        args = self._weight_args("weight", None)
        if eager_direct(x):  # eager inference: the op's own body, without the dispatcher's custom-op layer
            if native_op.enabled(x.numel() // x.shape[-1], self._scheme_key):  # host path in C++ (switches.py)
                return torch.ops.humming_triton.quant_linear_native(x, *args, self.bias, self.backend, None)
            return quant_linear(x, quant_weight_from_args(*args), self.bias, self.backend, None)
        bias = self.bias
        if torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)):
            return torch.ops.humming_triton.quant_linear(x, *args, bias, self.backend, None)
        # the switches are module globals that dynamo guards, or the device's measured verdict (switches.py)
        tokens = x.numel() // x.shape[-1]
        if compiled.enabled(tokens, self._scheme_key) and x.is_cuda:  # inductor launches the Triton kernel itself
            return torch.ops.humming_triton.quant_linear_triton(x, *args, bias, self.backend)
        if native_op.enabled(tokens, self._scheme_key):  # a planned native decode call's host path in C++
            return torch.ops.humming_triton.quant_linear_native(x, *args, bias, self.backend, None)
        # no gradient wanted (compiled inference): the op without the autograd layer (ops.py)
        return torch.ops.humming_triton.quant_linear_nograd(x, *args, bias, self.backend, None)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"scheme={self.scheme.name}, backend={self.backend}")
