"""``dot_scaled``: the block-scaled MMA tile loop (``_dense_scaled.py``, ``tl.dot_scaled``) for MX / NV weights
against quantized activations -- W4A4 MXFP4 x MXFP4 (``w4a4-mxfp4``), W4A4 NVFP4 x NVFP4 (``w4a4-nvfp4``),
W4A8 MXFP4 x e4m3 with per-token fp32 scales (``w4a8-mxfp4``), W4A8 MXFP4 x MXFP8 (``w4a8-mx``) and W8A8 MXFP8 x
MXFP8 (``w8a8-mxfp8``).  Issue 16.

Opt-in: its MMA is "block_scaled" (capability.py: SM 10.0 and 12.0), so neither the H200 nor the interpreter's
posed H200 facts offer it, and the built-in heuristic (configs.py) never names it -- only a measured table from
a Blackwell GPU could pick it.  Compiled for sm_100a / sm_120a and checked on CPU (tests/test_dot_scaled.py);
it has never run on a GPU.
"""
from __future__ import annotations

import triton

from ...calls import Call, KernelConfig, interpreting
from ..launch import LaunchSpec
from . import Family, register

C = KernelConfig

# scheme shapes this family runs: (weight dtype, scale dtype, group, global) x (act dtype, scale dtype, group, global)
_MX4 = ("e2m1", "e8m0", 32, False)
_NV4 = ("e2m1", "e4m3fn", 16, True)
KINDS = {  # name -> (weight, activation)
    "mxfp4": (_MX4, ("e2m1", "e8m0", 32, False)),
    "nvfp4": (_NV4, ("e2m1", "e4m3fn", 16, True)),
    "w4a8-mxfp4": (_MX4, ("e4m3fn", "fp32", 0, False)),
    "w4a8-mx": (_MX4, ("e4m3fn", "e8m0", 32, False)),
    "mxfp8": (("e4m3fn", "e8m0", 32, False), ("e4m3fn", "e8m0", 32, False)),
}
W_FMT = {"e2m1": 0, "e4m3fn": 1}  # the kernel's W_FMT: packed e2m1 pairs / one e4m3 code per byte
SCALE_KIND = {"e8m0": 1, "e4m3fn": 2}  # the kernel's W_SCALE / X_SCALE (0: fp32 per-token activation scales)


def scheme_kind(scheme) -> str | None:
    """Which of KINDS a scheme is (None: not one this family runs)."""
    s, a = scheme, scheme.act
    if a is None or s.zero != "none" or s.scale.block_n != 1:
        return None
    w = (str(s.weight), str(s.scale.dtype), s.scale.block_k, s.scale.global_scale)
    act = (str(a.dtype), str(a.scale_dtype), a.group_k, a.global_scale)
    for name, (wk, ak) in KINDS.items():
        if w == wk and act == ak and a.per_token and (not a.static or a.global_scale):
            return name
    return None


def constexprs(call: Call, cfg: KernelConfig, has_bias: bool, emulate: bool = False) -> dict:
    """The kernel's constexprs for a call (the launcher, the compile check and the tests share them); ``emulate``:
    the interpreter's stand-in for e4m3 block scales (the kernel's EMULATE).

    W4A8 widens the weight's e2m1 codes to e4m3 in registers (W_AS_E4M3): Triton 3.6 / 3.8 lower sm_120's
    block-scaled mma.sync for e2m1 x e2m1 and e4m3 x e4m3 but emulate e4m3 x e2m1 in bf16 (mma.sync ... bf16).
    On sm_100 e4m3 x e2m1 does lower natively (tcgen05 kind::mxf8f6f4), so W_AS_E4M3=False is a variant worth
    timing there once a Blackwell GPU is lent; one variant for both archs until then."""
    kind = scheme_kind(call.scheme)
    (wdt, wsd, group, glob), (adt, asd, _, aglob) = KINDS[kind]
    bk = cfg.block_k
    if bk < 64 or bk & (bk - 1):
        raise ValueError(f"dot_scaled needs a power-of-two BLOCK_K >= 64 (got {bk})")
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=bk, GROUP_M=cfg.group_m, SPLIT_K=cfg.split_k,
                EVEN_K=call.k % bk == 0, HAS_BIAS=has_bias, HAS_GLOBAL=glob or aglob,
                X_FMT=0 if adt == "e2m1" else 1, X_SCALE=SCALE_KIND.get(asd, 0), W_SCALE=SCALE_KIND[wsd],
                W_FMT=W_FMT[wdt], SCALE_GROUP=group, W_AS_E4M3=adt == "e4m3fn" and wdt == "e2m1",
                EMULATE=emulate and wsd == "e4m3fn")


class DotScaled(Family):
    name = "dot_scaled"

    def reason(self, call: Call) -> str | None:
        if call.op != "quant_linear":
            return f"{call.op}: dot_scaled is a dense quant_linear family"
        if scheme_kind(call.scheme) is None:
            return (f"{call.scheme.name}: dot_scaled runs e2m1 weights with e8m0:g32 scales against e2m1/e8m0:g32 or "
                    f"per-token e4m3fn/fp32 or e4m3fn/e8m0:g32 activations, NVFP4 x NVFP4 (e4m3fn:g16+global both sides), or MXFP8 x "
                    f"MXFP8 (e4m3fn with e8m0:g32 both sides)")
        if call.act_order:
            return "act-order weights"
        if call.k % 32:
            return f"dot_scaled needs K a multiple of 32 (got K={call.k})"
        return None

    def mma(self, call: Call) -> str:
        return "block_scaled"

    def candidates(self, call: Call) -> list[KernelConfig]:
        # 128-row tiles only: at BLOCK_M = 64 both Triton versions lower tl.dot_scaled on sm_100 to an emulated
        # bf16 MMA (tcgen05 kind::f16), and NVFP4 at 64 rows crashes Triton 3.6's AccelerateMatmul pass (checked
        # with scripts/compile_check.py).  Small M: split-K keeps enough CTAs streaming the weight.  Untimed: no
        # Blackwell GPU has run these.
        out = [C("dot_scaled", 128, 128, 128, 1, 8, 4, 3), C("dot_scaled", 128, 256, 128, 1, 8, 8, 3),
               C("dot_scaled", 128, 64, 256, 1, 8, 4, 3)]
        if call.m <= 64:
            out += [C("dot_scaled", 128, 64, 128, 4, 8, 4, 3)]
        return out

    def compile_spec(self, call: Call, cfg: KernelConfig) -> tuple[LaunchSpec, dict, dict]:
        """(launch, pointer types, integer arguments) of the GEMM as ``run`` launches it on a GPU, for compiling
        without one (scripts/compile_check.py, tests); the quantizer before it is compiled on its own."""
        from .._dense_scaled import dense_scaled_kernel
        consts = constexprs(call, cfg, False)
        grid = (triton.cdiv(call.m, cfg.block_m) * triton.cdiv(call.n, cfg.block_n), cfg.split_k)
        spec = LaunchSpec(dense_scaled_kernel, grid, consts, cfg.num_warps, cfg.num_stages, split=cfg.split_k)
        ptrs = {"x_ptr": "*u8", "w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "b_ptr": "*bf16", "y_ptr": "*bf16",
                "xs_ptr": "*fp32" if consts["X_SCALE"] == 0 else "*u8", "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
        k = call.k
        ints = dict(M=call.m, N=call.n, K=k, stride_xm=k, stride_wn=k // (8 if consts["W_FMT"] == 0 else 4),
                    stride_sn=k // consts["SCALE_GROUP"],
                    stride_ym=call.n, stride_xsm=1 if consts["X_SCALE"] == 0 else k // consts["SCALE_GROUP"])
        return spec, ptrs, ints

    def run(self, x, x2, qw, bias, out_dtype, cfg, out):
        import torch
        from .._dense_scaled import dense_scaled_kernel
        from ..dense import call_of, check_act_group, split_buffers, triton_quantize_activation
        call = call_of(x2, qw)
        why = self.reason(call)
        if why:
            raise ValueError(f"dot_scaled cannot run this call: {why}")
        act = qw.scheme.act
        check_act_group(act, qw.K)
        consts = constexprs(call, cfg, bias is not None, interpreting())
        m, n, k = x2.shape[0], qw.N, qw.K
        y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x2.device)
        if not m:
            return y
        q = triton_quantize_activation(x2, act, qw.input_scale)
        # the layouts are dot_scaled's own (module docstring): no host-side transform of codes or scales
        g = qw.global_scale if qw.global_scale is not None else q.scales
        if q.global_scale is not None:  # NVFP4: both fp32 global scales multiply the accumulator once
            g = (q.global_scale * qw.global_scale).reshape(1) if qw.global_scale is not None else \
                q.global_scale.reshape(1)
        grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), cfg.split_k)
        ws, cnt = split_buffers(cfg.split_k, m, n, grid[0], x2.device)
        dense_scaled_kernel[grid](q.codes, qw.data, qw.scales, g, bias if bias is not None else y, y, q.scales, ws,
                                  cnt, m, n, k, q.codes.stride(0), qw.data.stride(0), qw.scales.stride(0), y.stride(0),
                                  q.scales.stride(0), num_warps=cfg.num_warps, num_stages=cfg.num_stages, **consts)
        return y


register(DotScaled())
