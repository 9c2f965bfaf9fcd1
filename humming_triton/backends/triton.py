"""The ``triton`` backend: our Triton kernel families (decode GEMVs, swap-AB, tiled, quantized-activation
tiles, grouped MoE).  Needs CUDA tensors, or CPU tensors under the interpreter (TRITON_INTERPRET=1)."""
from __future__ import annotations

import functools

from ..calls import Call, Candidate, interpreting
from . import register
from ._families import FamilyBackend, config_of, family_reason


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class TritonBackend(FamilyBackend):
    name = "triton"

    def reason(self, call: Call) -> str | None:
        if not triton_available():
            return "triton is not installed"
        if call.device_type != "cuda" and not interpreting():
            return (f"Triton kernels need CUDA tensors (x is on {call.device_type}); set TRITON_INTERPRET=1 to run "
                    f"them on CPU")
        if call.act_order and call.scheme.act is not None and (call.scheme.act.group_k or call.op != "quant_linear"):
            # the Triton paths gather x into the weight's stored K order; activation groups (and the grouped
            # kernel's per-row quantization) would then follow that order instead of the logical one
            return f"act-order (k_perm) weights with quantized activations ({call.scheme.act}) in {call.op}"
        if call.op == "fused_moe":
            from ..kernels import supports
            return supports("grouped_linear", call.scheme, call.dtype)
        return super().reason(call)

    def default(self, call: Call) -> Candidate | None:
        """The built-in heuristic's choice (kernels/configs.py), if this device can run its family; else the
        first candidate that it can."""
        if call.op == "grouped_linear":
            return Candidate("triton", "grouped")
        if call.op != "quant_linear":
            return None
        from ..kernels import families
        from ..kernels.dense import default_config
        cfg = default_config(call, call.facts.num_sms if call.facts is not None else 132)
        backend = families.get(cfg.family).backend
        if family_reason(families.get(cfg.family), call) is None:
            return Candidate(backend, cfg.family, cfg)
        cands = self.candidates(call)
        return cands[0] if cands else None

    def grouped_linear(self, x, qw, offsets, bias, out_dtype, cand):
        from ..kernels.grouped import triton_grouped_linear
        return triton_grouped_linear(x, qw, offsets, bias, out_dtype, config=config_of(cand))

    def fused_moe(self, hidden, w13, w2, topk_weights, topk_ids, activation, cand):
        from ..kernels.moe import triton_fused_moe
        # dispatch passes a candidate only where the caller named this backend (then Triton's grouped tiles run,
        # as always); under ``auto`` each grouped GEMM runs what the measured table says is fastest for it
        return triton_fused_moe(hidden, w13, w2, topk_weights, topk_ids, activation, measured=cand is None)


register(TritonBackend())
