"""Dense weight-only GEMM (WnA16) on Triton: picks the kernel family by M and launches it.

``triton_linear(x, qw)`` reads the canonical QuantWeight directly (no per-call repacking); the format's
constexprs are computed once per QuantWeight and cached on it.
"""
from __future__ import annotations

import functools

import torch
import triton

from ..dispatch import interpreting
from ..formats.weight import QuantWeight
from . import configs
from ._dense_gemv import dense_gemv_kernel
from ._dense_tiled import dense_tiled_kernel
from .decode import format_constexprs

__all__ = ["triton_linear"]


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[str, int]:
    props = torch.cuda.get_device_properties(index)
    slug = props.name.lower().replace("nvidia", "").strip().replace(" ", "_").replace("-", "_")
    return slug, props.multi_processor_count


def _facts(x: torch.Tensor) -> tuple[str | None, int]:
    if x.is_cuda:
        return _device_facts(x.device.index if x.device.index is not None else torch.cuda.current_device())
    return None, configs.NUM_SMS_DEFAULT


def _format(qw: QuantWeight) -> dict:
    fmt = qw.cache.get("triton_format")
    if fmt is None:
        fmt = qw.cache["triton_format"] = format_constexprs(qw.scheme, qw.N, qw.K)
    return fmt


def triton_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None, config: configs.DenseConfig | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``out`` (optional, ``[M, N]`` contiguous) receives the result; ``config`` overrides the lookup."""
    n, k = qw.N, qw.K
    out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    fmt = _format(qw)
    slug, sms = _facts(x)
    cfg = config or configs.choose(m, n, k, qw.scheme.bits, fmt["GROUP_K"], slug, sms)
    if fmt["GROUP_K"] >= k and fmt["GROUP_K"] < cfg.block_k:
        # one scale spans all of K: any group extent >= K means the same; >= BLOCK_K keeps one scale per tile
        fmt = {**fmt, "GROUP_K": cfg.block_k}
    bias = qw.bias if bias is None else bias
    zeros = qw.zeros if qw.zeros is not None else qw.scales
    gscale = qw.global_scale if qw.global_scale is not None else qw.scales
    common = dict(
        M=m, N=n, K=k, stride_xm=x2.stride(0), stride_wn=qw.data.stride(0),
        stride_sn=qw.scales.stride(0), stride_sk=qw.scales.stride(1),
        stride_zn=zeros.stride(0), stride_zk=zeros.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **fmt)
    if cfg.family == "gemv":
        split = cfg.split_k
        if split == 1:
            y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x.device)
        else:
            y = torch.zeros(m, n, dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, cfg.block_m))
        dense_gemv_kernel[grid](x2, qw.data, qw.scales, zeros, gscale, bias if bias is not None else y, y,
                                stride_ym=y.stride(0), SPLIT_K=split,
                                HAS_BIAS=bias is not None and split == 1, **common)
        if split > 1:
            if bias is not None:
                y += bias.float()
            y = out.copy_(y) if out is not None else y.to(out_dtype)
    else:
        y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x.device)
        group_k = fmt["GROUP_K"]
        post = fmt["ZERO_KIND"] != 2 and (group_k >= k or group_k % cfg.block_k == 0)
        grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
        dense_tiled_kernel[grid](x2, qw.data, qw.scales, zeros, gscale, bias if bias is not None else y, y,
                                 stride_ym=y.stride(0), GROUP_M=cfg.group_m, POST_SCALE=post,
                                 DOT_F32=interpreting() or x.dtype == torch.float32,
                                 HAS_BIAS=bias is not None, **common)
    return y.reshape(*x.shape[:-1], n)
