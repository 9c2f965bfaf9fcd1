"""``humming_triton::quant_linear_triton``: the quantized linear as a ``torch.library.triton_op`` (opt-in:
``HUMMING_TRITON_COMPILE_TRITON=1``).

Why: a compiled decode step is host-bound, and an opaque custom op costs its dispatch plus our Python on every
call (benchmarks/results/h200/ANALYSIS.md, session 17).  A ``triton_op``'s body is traced by torch.compile: the
dispatch below runs once, at trace time, on fake tensors, and inductor launches the chosen Triton kernel from its
generated code.  Only spec-planned Triton families qualify (their launch is computed from shapes alone); anything
else -- and graphs inductor captures as CUDA graphs (``mode="reduce-overhead"``), where the native decode kernel's
GPU time wins -- traces to the ordinary ``quant_linear_nograd`` op.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import switches
from ..calls import Call
from ..formats.scheme import QuantScheme
from .format_args import format_constexprs
from .launch import launch_format

__all__ = ["ENV", "ON", "set_enabled", "enabled", "quant_linear_triton_op", "triton_plan", "run_planned"]


ENV = "HUMMING_TRITON_COMPILE_TRITON"
# The switch (humming_triton/switches.py: the environment's at import, ``set_enabled`` after, None: the device's
# measured table decides), read by QuantLinear.forward through ``enabled()``: dynamo guards the module global's
# value, not a read of os.environ (cutlass_ext/native_op.py says what that cost)
ON = switches.from_env(ENV)


def set_enabled(on: bool | None) -> None:
    global ON
    ON = None if on is None else bool(on)


def _table_tokens(scheme: str) -> int:
    return switches.table_tokens("compile_triton", scheme)


table_tokens = torch._dynamo.assume_constant_result(_table_tokens)  # folded at trace time (one device kind)


def enabled(tokens: int, scheme: str) -> bool:
    return ON if ON is not None else 0 < tokens <= table_tokens(scheme)


def _capturing_cuda_graphs() -> bool:
    try:
        from torch._inductor import config
    except ImportError:
        return False
    return bool(config.triton.cudagraphs)


def triton_plan(x2: torch.Tensor, scheme: QuantScheme, n: int, k: int, has_bias: bool, backend: str):
    """(kernel, grid, constexprs + scalars, num_warps, num_stages, split) of the Triton family dispatch picks for
    this call -- from shapes, dtypes and the measured table only -- or None when it is no single Triton launch."""
    from .. import backends, dispatch
    from ..capability import device_facts
    from . import families
    from .dense import fitted
    if backend not in ("auto", "triton") or scheme.act is not None:
        return None
    call = Call("quant_linear", scheme, x2.dtype, x2.shape[0], n, k, 0, False, x2.device.type,
                device_facts(x2.device))
    if backends.get("triton").reason(call) is not None:
        return None
    cand = dispatch._measured_choice(call, dispatch.measured_table(call.facts.slug), "triton") or \
        backends.get("triton").default(call)
    if cand is None or cand.config is None:
        return None
    fam = families.get(cand.family)
    cfg = fitted(cand.config, call)
    spec = fam.spec(launch_format(format_constexprs(scheme, n, k), k, cfg.block_k), call, cfg, has_bias)
    if spec is None:
        return None
    return spec


def run_planned(x, data, scales, zeros, global_scale, bias, n: int, k: int, spec, launcher) -> torch.Tensor:
    """One launch of ``spec`` (``triton_plan``) on these tensors through ``launcher(kernel)`` (``wrap_triton`` in the
    op, the kernel itself elsewhere): the launch ``triton_linear`` makes, its arguments from shapes and strides."""
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if spec.split > 1:
        ws = torch.empty(spec.split * m * n, dtype=torch.float32, device=x.device)
        cnt = torch.zeros(spec.grid[0] * (spec.grid[2] if len(spec.grid) > 2 else 1), dtype=torch.int32,
                          device=x.device)
    else:
        ws, cnt = torch.empty(1, device=x.device), torch.empty(1, dtype=torch.int32, device=x.device)
    z = zeros if zeros is not None else scales
    g = global_scale if global_scale is not None else scales
    args = dict(x_ptr=x2, y_ptr=y, b_ptr=bias if bias is not None else y, ws_ptr=ws, cnt_ptr=cnt, w_ptr=data,
                s_ptr=scales, z_ptr=z, g_ptr=g, xs_ptr=data, M=m, N=n, K=k, stride_xm=x2.stride(0), stride_ym=n,
                stride_wn=data.stride(0), stride_sn=scales.stride(0), stride_sk=scales.stride(1), stride_zn=z.stride(0),
                stride_zk=z.stride(1), **spec.scalars, **spec.constexprs)  # xs_ptr: unused with 16-bit activations
    args = {a: args[a] for a in spec.kernel.arg_names if a in args}
    launcher(spec.kernel)[spec.grid](**args, num_warps=spec.num_warps, num_stages=spec.num_stages)
    return y.reshape(*x.shape[:-1], n)


@torch.library.triton_op("humming_triton::quant_linear_triton", mutates_args=())
def quant_linear_triton_op(x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                           global_scale: Optional[torch.Tensor], input_scale: Optional[torch.Tensor],
                           wbias: Optional[torch.Tensor], k_perm: Optional[torch.Tensor], scheme: str,
                           shape: list[int], bias: Optional[torch.Tensor], backend: str) -> torch.Tensor:
    """``quant_linear_nograd`` with the Triton launch visible to torch.compile (module docstring)."""
    n, k = shape[-2], shape[-1]
    b = bias if bias is not None else wbias
    spec = None
    if k_perm is None and x.is_cuda and not _capturing_cuda_graphs():
        spec = triton_plan(x.reshape(-1, k), QuantScheme.parse(scheme), n, k, b is not None, backend)
    if spec is None:
        return torch.ops.humming_triton.quant_linear_nograd(x, data, scales, zeros, global_scale, input_scale, wbias,
                                                            k_perm, scheme, shape, bias, backend, None)
    return run_planned(x, data, scales, zeros, global_scale, b, n, k, spec, torch.library.wrap_triton)
