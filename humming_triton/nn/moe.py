"""QuantMoE: a drop-in for transformers >= 5 fused experts modules (``experts(hidden, top_k_index,
top_k_weights) -> [T, H]``) whose expert weights are QuantWeights and whose forward is the fused_moe op.

Hugging Face stores experts as 3-D parameters in two layouts (the ``use_experts_implementation`` decorator
records which one in ``is_transposed`` / ``is_concatenated`` / ``has_bias``):

* Qwen3-MoE, Mixtral, DeepSeek-V3: ``gate_up_proj [E, 2I, H]`` (gate rows, then up rows),
  ``down_proj [E, H, I]``, SiLU -- already our ``[E, N, K]`` layout, activation ``silu``.
* gpt-oss: ``gate_up_proj [E, H, 2I]`` (used as ``x @ W``) with gate/up *interleaved* along 2I, ``down_proj
  [E, I, H]``, biases ``gate_up_proj_bias [E, 2I]`` / ``down_proj_bias [E, H]`` -- transposed to ``[E, N, K]``,
  interleaving kept (activation ``swiglu_oai`` reads even/odd rows), biases carried in the QuantWeights.
"""
from __future__ import annotations

import torch
from torch import nn

from cutlass_ext import native_op

from ..dispatch import check_backend_name
from ..formats.quantize import quantize_weight
from ..formats.scheme import QuantScheme
from ..formats.weight import QuantWeight
from ..linear import fused_moe
from ..ops import eager_direct, quant_weight_from_args
from ..reference import moe_forward
from ._buffers import QuantBuffersMixin

__all__ = ["QuantMoE", "is_experts_module", "experts_weights"]

# constants baked into reference.moe_activation("swiglu_oai"); a module with other values cannot be converted
_OAI_ALPHA, _OAI_LIMIT = 1.702, 7.0
ACTIVATIONS = ("silu", "swiglu_oai")


def is_experts_module(m: nn.Module) -> bool:
    """A fused experts container: 3-D ``gate_up_proj`` and ``down_proj`` tensors (not sub-modules)."""
    gu, dn = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
    return isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and gu.dim() == 3 and dn.dim() == 3


def _is_silu(act) -> bool:
    if act is None:
        return False
    probe = torch.linspace(-6.0, 6.0, 25)
    try:
        return bool(torch.allclose(act(probe), nn.functional.silu(probe), rtol=1e-5, atol=1e-6))
    except Exception:  # noqa: BLE001 - any activation we cannot evaluate is "not SiLU"
        return False


def experts_weights(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, str]:
    """-> ``(gate_up [E, 2I, H], down [E, H, I], gate_up_bias [E, 2I] | None, down_bias [E, H] | None,
    activation)`` in our layout, or ValueError saying why this experts module cannot be converted."""
    if not is_experts_module(m):
        raise ValueError("not a fused experts module (needs 3-D gate_up_proj and down_proj)")
    if getattr(m, "has_gate", True) is False:
        raise ValueError("experts without a gate (up-projection only) are not supported")
    gu, dn = m.gate_up_proj.detach(), m.down_proj.detach()
    e, a, b = gu.shape
    _, c, d = dn.shape
    transposed = getattr(m, "is_transposed", None)
    if transposed is None:  # infer: [E, 2I, H] + [E, H, I] vs [E, H, 2I] + [E, I, H] never both fit
        transposed = not (a == 2 * d and b == c)
    if transposed:
        gu, dn = gu.transpose(1, 2), dn.transpose(1, 2)
    if dn.shape[0] != e or gu.shape[1] != 2 * dn.shape[2] or gu.shape[2] != dn.shape[1]:
        raise ValueError(f"expert shapes do not fit a gated MLP: gate_up_proj {list(m.gate_up_proj.shape)}, "
                         f"down_proj {list(m.down_proj.shape)}")
    concatenated = getattr(m, "is_concatenated", None)
    if concatenated is None:
        concatenated = not hasattr(m, "limit")  # gpt-oss keeps swiglu alpha/limit on the module
    if concatenated:
        if not _is_silu(getattr(m, "act_fn", None)):
            raise ValueError(f"expert activation {type(getattr(m, 'act_fn', None)).__name__} is not SiLU; "
                             "only SwiGLU (silu) and gpt-oss swiglu_oai experts are supported")
        activation = "silu"
    else:
        alpha, limit = float(getattr(m, "alpha", _OAI_ALPHA)), float(getattr(m, "limit", _OAI_LIMIT))
        if abs(alpha - _OAI_ALPHA) > 1e-6 or abs(limit - _OAI_LIMIT) > 1e-6:
            raise ValueError(f"interleaved experts with swiglu alpha={alpha}, limit={limit}; only gpt-oss's "
                             f"alpha={_OAI_ALPHA}, limit={_OAI_LIMIT} are supported")
        activation = "swiglu_oai"
    gb, db = getattr(m, "gate_up_proj_bias", None), getattr(m, "down_proj_bias", None)
    gb = gb.detach() if isinstance(gb, torch.Tensor) else None
    db = db.detach() if isinstance(db, torch.Tensor) else None
    return gu, dn, gb, db, activation


class QuantMoE(QuantBuffersMixin, nn.Module):
    """Quantized fused experts; ``forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])``.

    Buffers ``gate_up_proj_{packed,scale,zero_point,global_scale,input_scale,k_perm,bias}`` and the same for
    ``down_proj``; weights in our ``[E, N, K]`` layout (gpt-oss's are stored transposed relative to HF).
    """

    def __init__(self, gate_up: QuantWeight, down: QuantWeight, activation: str = "silu", backend: str = "auto",
                 expert_parallel: bool = False):
        super().__init__()
        for what, qw in (("gate_up", gate_up), ("down", down)):
            if not isinstance(qw, QuantWeight) or qw.num_experts is None:
                raise ValueError(f"{what} must be a 3-D [E, N, K] QuantWeight")
        if down.num_experts != gate_up.num_experts or gate_up.N != 2 * down.K or down.N != gate_up.K:
            raise ValueError(f"expert weights do not fit: gate_up {list(gate_up.shape)}, down {list(down.shape)}; "
                             "expected [E, 2I, H] and [E, H, I]")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown MoE activation {activation!r}; expected one of {ACTIVATIONS}")
        check_backend_name(backend)
        self.num_experts, self.hidden_dim, self.intermediate_dim = down.num_experts, down.N, down.K
        self.activation, self.backend, self.scheme = activation, backend, gate_up.scheme
        self._scheme_key = gate_up.scheme.name  # a plain str: torch.compile folds what forward asks the switches with
        # HF marks routing slots of experts living on another rank with index == num_experts
        self.expert_parallel = expert_parallel
        self._register_quant_weight("gate_up_proj", gate_up)
        self._register_quant_weight("down_proj", down)
        self.register_buffer("gate_up_proj_bias", gate_up.bias)
        self.register_buffer("down_proj_bias", down.bias)

    @classmethod
    def from_quant_weights(cls, gate_up: QuantWeight, down: QuantWeight, activation: str = "silu",
                           backend: str = "auto") -> "QuantMoE":
        return cls(gate_up, down, activation, backend)

    @classmethod
    def from_experts(cls, experts: nn.Module, scheme: "QuantScheme | str", backend: str = "auto") -> "QuantMoE":
        """Quantize an HF fused experts module (see the module docstring for the layouts it understands)."""
        gu, dn, gb, db, activation = experts_weights(experts)
        return cls(quantize_weight(gu, scheme, bias=gb), quantize_weight(dn, scheme, bias=db), activation, backend,
                   bool(getattr(experts, "_is_expert_parallel", False)))

    @property
    def gate_up_weight(self) -> QuantWeight:
        return self._quant_weight("gate_up_proj", self.gate_up_proj_bias)

    @property
    def down_weight(self) -> QuantWeight:
        return self._quant_weight("down_proj", self.down_proj_bias)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        h = hidden_states.reshape(-1, shape[-1])
        if self.expert_parallel:
            keep = top_k_index < self.num_experts
            top_k_index = torch.where(keep, top_k_index, 0)
            top_k_weights = torch.where(keep, top_k_weights, 0)
        w13 = self._weight_args("gate_up_proj", self.gate_up_proj_bias)
        w2 = self._weight_args("down_proj", self.down_proj_bias)
        if eager_direct(h, top_k_weights):  # eager inference: the op's body, without the custom-op layer
            y = fused_moe(h, quant_weight_from_args(*w13), quant_weight_from_args(*w2), top_k_weights, top_k_index,
                          self.activation, self.backend)
        elif torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in
                                             (h, top_k_weights, self.gate_up_proj_bias, self.down_proj_bias)):
            y = torch.ops.humming_triton.fused_moe(h, *w13, *w2, top_k_weights, top_k_index, self.activation,
                                                   self.backend)  # raises if backpropagated through (ops.py)
        elif self.backend == "auto":  # compiled inference: routing, activation and reduction in the graph
            gemm = _grouped_native if native_op.enabled(top_k_index.shape[0], self._scheme_key) else _grouped_nograd
            y = moe_forward(h, _Experts(w13), _Experts(w2), top_k_weights, top_k_index, self.activation, gemm)
        else:  # a named backend's fused MoE, without the autograd layer (ops.py)
            y = torch.ops.humming_triton.fused_moe_nograd(h, *w13, *w2, top_k_weights, top_k_index, self.activation,
                                                          self.backend)
        return y.reshape(shape)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, activation={self.activation}, "
                f"bias={self.gate_up_proj_bias is not None}, scheme={self.scheme.name}, backend={self.backend}")


class _Experts:
    """One expert weight's op arguments with the two facts ``moe_forward`` reads (a QuantWeight is not built
    while torch.compile traces: its cache lives on the tensors)."""

    def __init__(self, args: tuple):
        self.args = args
        self.num_experts, self.N = args[-1][0], args[-1][1]


def _grouped_native(x: torch.Tensor, w: _Experts, offsets: torch.Tensor) -> torch.Tensor:
    # the host path in C++ (a guarded global or the device's table: cutlass_ext/native_op.py)
    return torch.ops.humming_triton.grouped_linear_native(x, *w.args, offsets, None, "auto", torch.float32)


def _grouped_nograd(x: torch.Tensor, w: _Experts, offsets: torch.Tensor) -> torch.Tensor:
    # backend auto: each GEMM the measured table's choice, as the fused op's auto path runs them
    return torch.ops.humming_triton.grouped_linear_nograd(x, *w.args, offsets, None, "auto", torch.float32)
