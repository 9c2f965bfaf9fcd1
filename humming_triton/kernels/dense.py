"""Dense weight-only GEMM (WnA16) on Triton: picks the kernel family by M and launches it.

Families (configs.py chooses; ``autotune_configs/<device>.json`` overrides):
``gemv``  small M, CUDA-core FMA reduction streaming the weight once (``_dense_gemv.py``);
``gemv_words`` M = 1 decode: the word-major GEMV for codes that never straddle a word (3 instructions per
          weight element; falls back to ``gemv`` where it does not apply);
``tiled`` tensor-core ``tl.dot`` with in-register dequantization, optional split-K (``_dense_tiled.py``);
``dequant_mm`` large M: dequantize to a dense tensor once per call (``_dequant.py``), then cuBLAS (for
          activation-quantized schemes the quantized activations are dequantized too: fp8 / e2m1 at M >= 512).

``triton_linear(x, qw)`` reads the canonical QuantWeight directly (no per-call repacking); the format's
constexprs are computed once per QuantWeight and cached on it.
"""
from __future__ import annotations

import functools
import os

import torch
import triton

from ..dispatch import interpreting
from ..formats.activation import QuantActivation, dequantize_activation
from ..formats.dtypes import FloatType, WideFloat
from ..formats.quantize import positive_qmax
from ..formats.scheme import ActQuant, QuantScheme
from ..formats.weight import QuantWeight
from . import configs
from ._dense_gemv import dense_gemv_kernel, dense_gemv_words_kernel
from ._act_quant import act_quant_kernel
from ._dense_tiled import dense_tiled_kernel
from ._dequant import dequant_kernel
from .format_args import format_constexprs

__all__ = ["triton_linear", "triton_dequantize", "triton_quantize_activation"]

PER_TOKEN = 1 << 30  # ACT_GROUP_K meaning "one scale per row": k0 // PER_TOKEN == 0 for every K tile


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[str, int]:
    props = torch.cuda.get_device_properties(index)
    slug = props.name.lower().replace("nvidia", "").strip().replace(" ", "_").replace("-", "_")
    return slug, props.multi_processor_count


def device_facts(device: torch.device) -> tuple[str | None, int]:
    """(config-file slug, SM count) of a device; CPU (the interpreter) gets the H200's SM count."""
    if device.type == "cuda":
        return _device_facts(device.index if device.index is not None else torch.cuda.current_device())
    return None, configs.NUM_SMS_DEFAULT


def _format(qw: QuantWeight) -> dict:
    fmt = qw.cache.get("triton_format")
    if fmt is None:
        fmt = qw.cache["triton_format"] = format_constexprs(qw.scheme, qw.N, qw.K)
    return fmt


def _launch_format(qw: QuantWeight, block_k: int) -> dict:
    fmt = _format(qw)
    if fmt["GROUP_K"] >= qw.K and fmt["GROUP_K"] < block_k:
        # one scale spans all of K: any group extent >= K means the same; >= BLOCK_K keeps one scale per tile
        fmt = {**fmt, "GROUP_K": block_k}
    return fmt


def post_scale(fmt: dict, block_k: int) -> bool:
    """Whether the group scale can multiply the fp32 partial product of a K tile (one group spans the tile, no
    float zero point) instead of every weight element."""
    return fmt["ZERO_KIND"] != 2 and fmt["GROUP_K"] >= block_k and fmt["GROUP_K"] % block_k == 0


MAGIC_2_23 = 0x4B000000  # fp32 bits of 2**23; a runtime kernel argument on purpose (_dense_gemv.py says why)


def words_gemv_fits(bits: int, group_k: int, k: int) -> bool:
    """The word-major GEMV needs whole codes in each word, and each word inside one scale group."""
    return 32 % bits == 0 and (group_k % (32 // bits) == 0 or group_k >= k)


def words_gemv_constexprs(common: dict, block_k: int, num_stages: int, bits: int, fused_fma: bool) -> dict:
    """The generic GEMV launch constexprs, rewritten for the word-major GEMV (K tiled in words, not codes)."""
    out = {key: v for key, v in common.items() if key not in ("BLOCK_M", "BLOCK_K", "EVEN_K")}
    return {**out, "ROWS": common["BLOCK_M"], "BLOCK_W": max(1, block_k // (32 // bits)), "PREFETCH": num_stages > 1, "FUSED_FMA": fused_fma}


def _weight_args(qw: QuantWeight) -> tuple[tuple, dict]:
    zeros = qw.zeros if qw.zeros is not None else qw.scales
    gscale = qw.global_scale if qw.global_scale is not None else qw.scales
    ptrs = (qw.data, qw.scales, zeros, gscale)
    strides = dict(stride_wn=qw.data.stride(0), stride_sn=qw.scales.stride(0), stride_sk=qw.scales.stride(1),
                   stride_zn=zeros.stride(0), stride_zk=zeros.stride(1))
    return ptrs, strides


def triton_dequantize(qw: QuantWeight, dtype: torch.dtype = torch.float32, block_n: int = 32,
                      block_k: int = 128) -> torch.Tensor:
    """Dense ``[N, K]`` weight in ``dtype`` (2-D QuantWeights)."""
    n, k = qw.N, qw.K
    block_k = configs.fit_block_k(block_k, _format(qw)["GROUP_K"], k, qw.scheme.bits)
    fmt = _launch_format(qw, block_k)
    out = torch.empty(n, k, dtype=dtype, device=qw.device)
    (w, s, z, g), strides = _weight_args(qw)
    dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
        w, s, z, g, out, n, k, stride_on=out.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=k % block_k == 0, **strides, **fmt)
    return out


ACT_KINDS = {"e4m3fn": 1, "int8": 2, "e2m1": 3}  # the activation element types the quantizer writes
ACT_SCALE_KINDS = {"fp32": 0, "e8m0": 1, "e4m3fn": 2}


def act_kind(act: ActQuant | None, block_m: int) -> int:
    """The tile loop's ACT_KIND: 0 16-bit x; 1 e4m3 on fp8 mma.sync (16-row tiles); 5 e4m3 on a bf16 MMA (64/128
    rows: the fp8 wgmma is not exact); 2 int8; 3 / 4 e2m1 with e8m0 / e4m3 block scales."""
    if act is None:
        return 0
    kind = ACT_KINDS[str(act.dtype)]
    if kind == 1 and block_m >= 64:
        return 5
    return kind + (kind == 3 and str(act.scale_dtype) == "e4m3fn")


def check_act_group(spec: ActQuant, k: int) -> None:
    if spec.group_k and k % spec.group_k:  # as the reference: a partial last group has no agreed scale rule
        raise ValueError(f"activation group size {spec.group_k} does not divide K={k}")


def triton_quantize_activation(x2: torch.Tensor, spec: ActQuant, input_scale: torch.Tensor | None = None
                               ) -> QuantActivation:
    """``x [M, K]`` -> its ``QuantActivation`` (codes uint8 [M, K]: e4m3 / two's-complement int8 / e2m1;
    scales [M, groups]: fp32, or e8m0 / e4m3 codes), as ``formats.activation.quantize_activation`` makes it.
    NV's global scale is amax(x) / (6 * 448) per call, or the calibrated ``input_scale`` when the spec is static."""
    m, k = x2.shape
    g = spec.group_k or k
    check_act_group(spec, k)
    codes = torch.empty(m, k, dtype=torch.uint8, device=x2.device)
    wide = str(spec.scale_dtype) == "fp32"
    scales = torch.empty(m, -(-k // g), dtype=torch.float32 if wide else torch.uint8, device=x2.device)
    gscale = None
    if spec.global_scale:  # the reference's formula, in the same float64 steps
        if input_scale is not None:
            gscale = input_scale.to(device=x2.device, dtype=torch.float32).reshape(())
        else:
            amax = x2.abs().amax().double() if x2.numel() else torch.zeros((), dtype=torch.float64, device=x2.device)
            gscale = (amax / (positive_qmax(spec.dtype) * spec.scale_dtype.finite_max())).clamp(min=1e-30).float()
    if m:
        block = min(1024, triton.next_power_of_2(g))
        act_quant_kernel[(m, scales.shape[1])](
            x2, codes, scales, gscale if gscale is not None else scales, k, x2.stride(0), codes.stride(0),
            scales.stride(0), KIND=ACT_KINDS[str(spec.dtype)], SCALE_KIND=ACT_SCALE_KINDS[str(spec.scale_dtype)],
            GROUP_K=g, BLOCK_K=block)
    return QuantActivation(codes, scales, spec, gscale)


class _Launch:
    """One cached kernel launch of a QuantWeight for one call signature (M, dtypes, strides, pointer alignment):
    Triton's compiled kernel, its grid and its positional arguments with the per-call tensors (x, y, bias) as
    slots.  Why: re-binding ~35 arguments through Triton's launcher, plus our config lookup, cost ~130 µs of
    CPU per call against ~15 µs of GPU time for a decode GEMV (benchmarks/results/h200/overhead.txt).

    Our own per-call work (config lookup, argument assembly) is always cached.  Replaying Triton's compiled
    kernel directly (``CompiledKernel[grid](*args)``, skipping its binder) is opt-in with
    ``HUMMING_TRITON_LAUNCH_REPLAY=1`` until it has been verified on a GPU (tests/test_dense_kernels.py:
    test_launch_replay_on_gpu)."""

    __slots__ = ("kernel", "grid", "kwargs", "runner", "args", "slots", "split")

    def __init__(self, kernel, grid, kwargs: dict, split: int):
        # three grid axes: the compiled kernel's runner indexes grid[0..2] (JITFunction.run pads, it does not)
        self.kernel, self.grid, self.kwargs = kernel, tuple(grid) + (1,) * (3 - len(grid)), kwargs
        self.split = split
        self.runner = None
        names = kernel.arg_names  # every parameter, constexprs included: the order Triton's launcher takes
        self.args = [kwargs.get(a) for a in names]
        self.slots = tuple(names.index(a) for a in ("x_ptr", "y_ptr", "b_ptr"))

    def __call__(self, x2: torch.Tensor, y: torch.Tensor, b: torch.Tensor) -> None:
        if self.runner is not None:  # the compiled kernel, launched directly with the arguments bound once
            args = list(self.args)
            args[self.slots[0]], args[self.slots[1]], args[self.slots[2]] = x2, y, b
            self.runner(*args)
            return
        compiled = self.kernel[self.grid](**{**self.kwargs, "x_ptr": x2, "y_ptr": y, "b_ptr": b})
        if hasattr(compiled, "function") and os.environ.get("HUMMING_TRITON_LAUNCH_REPLAY", "0") == "1":
            self.runner = compiled[self.grid]  # a GPU compile (the interpreter returns no CompiledKernel)


def _alignment(t: torch.Tensor | None) -> int:
    return -1 if t is None else t.data_ptr() % 16


def triton_linear(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None, config: configs.DenseConfig | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``out`` (optional, ``[M, N]`` contiguous) receives the result; ``config`` overrides the lookup.

    The launch for a call signature is built once per QuantWeight (``qw.cache``) and replayed: the key holds
    everything the compiled kernel was specialised on -- M, dtypes, strides, each pointer's 16-byte alignment."""
    n, k = qw.N, qw.K
    out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    bias = qw.bias if bias is None else bias
    key = (m, x2.dtype, out_dtype, x2.device, x2.stride(0), _alignment(x2), _alignment(bias),
           None if bias is None else bias.dtype, None if out is None else (out.stride(0), _alignment(out)), config,
           qw.data.data_ptr(), qw.scales.data_ptr(), None if qw.zeros is None else qw.zeros.data_ptr(),
           None if qw.global_scale is None else qw.global_scale.data_ptr())
    launches = qw.cache.setdefault("triton_launches", {})
    launch = launches.get(key)
    if launch is None:
        cfg = _config(x2, qw, config)
        # dequant_mm / quantized activations are not a single launch: their config is what gets cached
        launch = _plan(x2, qw, bias, cfg, out.stride(0) if out is not None else n) or cfg
        if len(launches) >= 64:  # bounded: a server sees a handful of M values per weight
            launches.clear()
        launches[key] = launch
    if isinstance(launch, configs.DenseConfig):
        return _linear_unplanned(x, x2, qw, bias, out_dtype, launch, out)
    if launch.split == 1:
        y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x.device)
    else:
        y = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    if m:
        launch(x2, y, bias if bias is not None and launch.split == 1 else y)
    if launch.split > 1:
        if bias is not None:
            y += bias.float()
        y = out.copy_(y) if out is not None else y.to(out_dtype)
    return y.reshape(*x.shape[:-1], n)


def _config(x2: torch.Tensor, qw: QuantWeight, config: configs.DenseConfig | None) -> configs.DenseConfig:
    m, n, k = x2.shape[0], qw.N, qw.K
    slug, sms = device_facts(x2.device)
    if qw.scheme.act is not None:
        return config or act_config(m, n, k, qw.scheme, sms)
    return config or configs.choose(m, n, k, qw.scheme.bits, _format(qw)["GROUP_K"], slug, sms, qw.scheme.name,
                                    qw.scheme.zero != "none")


def _significant_bits(t) -> int:
    """Bits of precision a value of element/scale type ``t`` can need (implicit bit included)."""
    if isinstance(t, WideFloat):
        return {"fp32": 24, "fp16": 11, "bf16": 8}[t.name]
    if isinstance(t, FloatType):
        return 1 if t.special == "e8m0" else t.man + 1
    return t.bits  # integer codes (a zero point can add the sign)


def _weight_exact_bf16(scheme: QuantScheme) -> bool:
    return _significant_bits(scheme.weight) + _significant_bits(scheme.scale.dtype) <= 8 and scheme.zero == "none"


def act_config(m: int, n: int, k: int, scheme: QuantScheme, num_sms: int = configs.NUM_SMS_DEFAULT
               ) -> configs.DenseConfig:
    """The launch config of an activation-quantized scheme (configs.fp8_config with the scheme's facts)."""
    return configs.fp8_config(m, n, k, scheme.scale.block_k, scheme.act.group_k, num_sms, str(scheme.act.dtype),
                              _weight_exact_bf16(scheme))


def act_block_k(bk: int, scheme: QuantScheme, k: int) -> int:
    """configs.act_block_k with the scheme's facts; a clear error where no K tile fits."""
    out = configs.act_block_k(bk, k, scheme.scale.block_k, scheme.act.group_k, str(scheme.act.dtype),
                              _weight_exact_bf16(scheme))
    if out is None:
        raise ValueError(f"no K tile fits both the weight groups ({scheme.scale.block_k}) and the activation groups "
                         f"({scheme.act.group_k}) of {scheme.name}")
    return out


def _plan(x2: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None, cfg: configs.DenseConfig,
          out_stride: int) -> _Launch | None:
    """The weight-only launch (gemv / gemv_words / tiled) for this call signature; None for the other paths."""
    if cfg.family == "dequant_mm" or qw.scheme.act is not None:
        return None
    m, n, k = x2.shape[0], qw.N, qw.K
    fmt = _launch_format(qw, cfg.block_k)
    (w, s, z, g), strides = _weight_args(qw)
    split = cfg.split_k
    stride_ym = out_stride if split == 1 else n  # split-K accumulates in a contiguous fp32 workspace
    common = dict(M=m, N=n, K=k, stride_xm=x2.stride(0), stride_ym=stride_ym, BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split, EVEN_K=k % cfg.block_k == 0,
                  HAS_BIAS=bias is not None and split == 1, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                  **strides, **fmt)
    tensors = dict(x_ptr=None, y_ptr=None, b_ptr=None, w_ptr=w, s_ptr=s, z_ptr=z, g_ptr=g)
    family = cfg.family
    if family == "gemv_words" and not words_gemv_fits(qw.scheme.bits, fmt["GROUP_K"], k):
        family = "gemv"  # codes straddle words (3/5/6/7 bits) or a word spans two groups: the generic GEMV
    if family == "gemv_words":
        return _Launch(dense_gemv_words_kernel, (triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, cfg.block_m)),
                       {**tensors, "magic": MAGIC_2_23, **words_gemv_constexprs(common, cfg.block_k, cfg.num_stages,
                                                                               qw.scheme.bits, not interpreting())},
                       split)
    if family == "gemv":
        return _Launch(dense_gemv_kernel, (triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, cfg.block_m)),
                       {**tensors, **common}, split)
    post = post_scale(fmt, cfg.block_k)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), split)
    return _Launch(dense_tiled_kernel, grid,
                   {**tensors, "xs_ptr": w, "stride_xsm": 0, "ACT_KIND": 0, "ACT_GROUP_K": 1, "GROUP_M": cfg.group_m,
                    "POST_SCALE": post, "DOT_F32": interpreting() or x2.dtype == torch.float32, **common},
                   split)


def _linear_unplanned(x: torch.Tensor, x2: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None,
                      out_dtype: torch.dtype, cfg: configs.DenseConfig, out: torch.Tensor | None) -> torch.Tensor:
    """dequant_mm (any scheme) and the quantized-activation tile loop (fp8 / int8 / e2m1 activations)."""
    n, k = qw.N, qw.K
    m = x2.shape[0]
    if qw.scheme.act is not None:
        check_act_group(qw.scheme.act, k)
    if cfg.family == "dequant_mm":
        if qw.scheme.act is not None:  # quantize x as the scheme says, then run its dequantized values in x's dtype
            q = triton_quantize_activation(x2, qw.scheme.act, qw.input_scale)
            x2 = dequantize_activation(q).to(x2.dtype)
        w = triton_dequantize(qw, x2.dtype, cfg.block_n, cfg.block_k)
        y = torch.nn.functional.linear(x2, w, None if bias is None else bias.to(x2.dtype))
        y = out.copy_(y) if out is not None else y.to(out_dtype)
        return y.reshape(*x.shape[:-1], n)
    # fp8 / int8 tensor cores (the scales multiply partial products), or e2m1 activations decoded to bf16
    act = qw.scheme.act
    kind = act_kind(act, cfg.block_m)
    fmt = _launch_format(qw, cfg.block_k)
    post = post_scale(fmt, cfg.block_k)
    if not post and kind in (1, 2, 5):
        raise ValueError(f"the quantized-activation path needs BLOCK_K ({cfg.block_k}) to divide the "
                         f"weight group ({fmt['GROUP_K']}) of {qw.scheme.name}")
    (w, s, z, g), strides = _weight_args(qw)
    split = cfg.split_k
    if split == 1:
        y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x.device)
    else:
        y = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    q = triton_quantize_activation(x2, act, qw.input_scale)
    has_global = fmt["HAS_GLOBAL"]
    if q.global_scale is not None:  # NV activations: both global scales multiply the accumulator once
        g = q.global_scale * qw.global_scale if has_global else q.global_scale.reshape(1)
        has_global = True
    b = bias if bias is not None else y
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), split)
    dense_tiled_kernel[grid](q.codes, w, s, z, g, b, y, q.scales, M=m, N=n, K=k, stride_xm=q.codes.stride(0),
                             stride_ym=y.stride(0), stride_xsm=q.scales.stride(0), BLOCK_M=cfg.block_m,
                             BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split, EVEN_K=k % cfg.block_k == 0,
                             HAS_BIAS=bias is not None and split == 1, GROUP_M=cfg.group_m, POST_SCALE=post,
                             DOT_F32=interpreting(), ACT_KIND=kind, ACT_GROUP_K=act.group_k or PER_TOKEN,
                             num_warps=cfg.num_warps, num_stages=cfg.num_stages, **strides,
                             **{**fmt, "HAS_GLOBAL": has_global})
    if split > 1:
        if bias is not None:
            y += bias.float()
        y = out.copy_(y) if out is not None else y.to(out_dtype)
    return y.reshape(*x.shape[:-1], n)
