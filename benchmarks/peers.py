"""Peer libraries through their public Python APIs: humming-kernels (``HummingLayer``) and gemlite.

API facts come from /tmp/peers/PEERS_API.md (verified on an H200); no peer code is copied here.  Both peers
compile on first use (humming: NVRTC per kernel config, 2-13 s; gemlite: Triton autotune per M bucket, 4-19 s),
so every (config, M) is warmed before timing and the time spent doing so is charged to a per-peer budget; a
peer over budget is skipped with the reason in its rows instead of blowing the suite's time limit.
"""
from __future__ import annotations

import os

import torch

import humming_triton as ht

from .methods import TOL_PEER_A8, TOL_PEER_A16, MInputs, Prepared, SchemeCtx, Skip

__all__ = ["PeerBudget", "import_peer", "make_humming", "make_gemlite", "HUMMING_FORMATS", "GEMLITE_FORMATS"]

_MX = {"dtype": "float4e2m1", "scale_dtype": "float8e8m0", "group_size": 32}
_NV = {"dtype": "float4e2m1", "scale_dtype": "float8e4m3", "group_size": 16, "scale_2_type": "tensor"}
_FP8 = {"dtype": "float8e4m3"}
_U4 = {"dtype": "uint4", "group_size": 128}
# our preset -> humming (weight_config, input_config); None input = A16.  Entries marked (*) were not among the
# configurations verified on the H200 in PEERS_API.md; a failure there is recorded in the row.
HUMMING_FORMATS = {
    "w4a16": (_U4, None),                                   # symmetric uint4 == int4 with offset 8
    "w4a16-asym": ({**_U4, "has_zero_point": True}, None),
    "w3a16": ({"dtype": "uint3", "group_size": 128, "has_zero_point": True}, None),  # (*)
    "w2a16": ({"dtype": "uint2", "group_size": 128, "has_zero_point": True}, None),  # (*)
    "w8a16": ({"dtype": "uint8"}, None),                    # per-channel (group_size 0), symmetric
    "w8a16-fp8": (_FP8, None),                              # (*)
    "mxfp4": (_MX, None),
    "nvfp4": (_NV, None),
    "w8a8-fp8": (_FP8, _FP8),                               # channel weight scale, dynamic per-token input
    "w8a8-fp8-block": ({**_FP8, "group_size": 128, "group_size_n": 128}, {**_FP8, "group_size": 128}),
    "w4a8-fp8": (_U4, _FP8),                                # (*)
    "w4a8-mxfp4": (_MX, _FP8),
    "w4a4-mxfp4": (_MX, _MX),                               # (*)
    "w4a4-nvfp4": (_NV, _NV),                               # (*)
}
# our preset -> gemlite helper; "w4a16" is fed our own int4 codes and scales (same quantized weight as ours)
GEMLITE_FORMATS = {
    "w4a16": "A16Wn",
    "w8a16": "A16W8_INT8",
    "w8a8-fp8": "A8W8_fp8_dynamic",
    "mxfp4": "A16W4_MXFP",
    "w4a8-mxfp4": "A8W4_MXFP_dynamic",
}
GEMLITE_UNSUPPORTED = {"nvfp4": "gemlite A16W4_NVFP fails to compile on SM90 (Triton MLIR assertion in "
                                 "gemm_splitK_MX_kernel); skipped"}

_imported: dict = {}


def import_peer(name: str):
    """The peer's module, or raise Skip('<name> not importable: ...') -- cached, including the failure."""
    if name not in _imported:
        try:
            if name == "humming":
                from humming.layer import HummingLayer  # noqa: F401
                import humming as mod
            else:
                import gemlite as mod
                # the H200's device name matches none of gemlite's config tags: load the H100 file explicitly
                cfg = os.path.join(os.path.dirname(mod.__file__), "configs", "h100.json")
                if os.path.exists(cfg):
                    mod.load_config(cfg)
            _imported[name] = mod
        except Exception as e:  # noqa: BLE001
            _imported[name] = Skip(f"{name} not importable: {type(e).__name__}: {e}")
    got = _imported[name]
    if isinstance(got, Skip):
        raise got
    return got


class PeerBudget:
    """Seconds a peer may spend building layers and on first (compiling/autotuning) calls."""

    def __init__(self, limits: dict[str, float | None]):
        self.limits = limits
        self.spent: dict[str, float] = {}

    def check(self, method: str) -> None:
        lim = self.limits.get(method)
        if lim is not None and self.spent.get(method, 0.0) > lim:
            msg = (f"{method}: compile/warm-up budget of {lim:.0f} s exhausted "
                   f"(spent {self.spent[method]:.0f} s); skipped")
            print("  budget:", msg, flush=True)
            raise Skip(msg)

    def charge(self, method: str, seconds: float) -> None:
        self.spent[method] = self.spent.get(method, 0.0) + seconds


def _act8(scheme: str) -> bool:
    return ht.QuantScheme.parse(scheme).act is not None


# --- humming -----------------------------------------------------------------------------------------------

def _humming_layer(sc: SchemeCtx):
    """Build + quantize (humming's own RTN on the GPU) + transform, once per (scheme, shape).  The dequantized
    weight must be read *before* transform() (the parameters are repacked into the kernel layout after)."""
    return _built_once(sc, "humming", _build_humming)


def _build_humming(sc: SchemeCtx):
    if sc.scheme not in HUMMING_FORMATS:
        raise Skip(f"no humming format mapped for {sc.scheme}")
    mod = import_peer("humming")
    wc, ic = HUMMING_FORMATS[sc.scheme]
    kw = {}
    if sc.shape.moe:
        kw["num_experts"] = sc.shape.W.shape[0]
    layer = mod.layer.HummingLayer(shape_n=sc.N, shape_k=sc.K, weight_config=dict(wc),
                                   input_config=dict(ic) if ic else None,
                                   torch_dtype=torch.bfloat16, **kw).cuda()
    layer.load_from_unquantized(sc.shape.W)
    w_deq = layer.weight_schema.dequant_tensors({n: p.data for n, p in layer.named_parameters()})
    if isinstance(w_deq, dict):  # documented as the [N, K] tensor; tolerate a {name: tensor} dict
        w_deq = w_deq.get("weight", next(iter(w_deq.values())))
    layer.transform()
    return layer, w_deq.float()


def _built_once(sc: SchemeCtx, peer: str, build):
    """``build(sc)`` once per (scheme, shape); a failure is remembered as the Skip its rows report."""
    key = f"{peer}_layer"
    if key not in sc.cache:
        try:
            sc.cache[key] = build(sc)
        except Skip as e:
            sc.cache[key] = e
        except Exception as e:  # noqa: BLE001
            sc.cache[key] = Skip(f"{peer} layer build failed: {type(e).__name__}: {e}")
    got = sc.cache[key]
    if isinstance(got, Skip):
        raise got
    return got


def make_humming(sc: SchemeCtx, mi: MInputs) -> Prepared:
    layer, w_deq = _humming_layer(sc)
    x = mi.x
    if sc.shape.moe:
        # PEERS_API.md documents (and verified) only humming's dense forward.  HummingLayer.forward also takes
        # expert_layout / sorted_ids for MoE; we use its "grouped_contiguous" GEMM type (rows already sorted by
        # expert, expert_layout = int64 [E+1] first-row offsets), which is NOT verified -- a failure is recorded.
        layout = mi.offsets.to(torch.int64)
        cc = {"gemm_type": "grouped_contiguous"}
        fn = lambda: layer(x, expert_layout=layout, compute_config=cc)  # noqa: E731
    else:
        fn = lambda: layer(x)  # noqa: E731
    a8 = _act8(sc.scheme)
    return Prepared(fn, lambda: sc.shape.apply_weight(mi, w_deq), TOL_PEER_A8 if a8 else TOL_PEER_A16,
                    "humming's own dequantized weight", sc.wbytes(mi),
                    "fp8" if a8 else "bf16", sc.scheme)


# --- gemlite -----------------------------------------------------------------------------------------------

def _gemlite_layer(sc: SchemeCtx):
    return _built_once(sc, "gemlite", _build_gemlite)


def _build_gemlite(sc: SchemeCtx):
    if sc.shape.moe:
        raise Skip("gemlite has no grouped (MoE) GEMM")
    if sc.scheme in GEMLITE_UNSUPPORTED:
        raise Skip(GEMLITE_UNSUPPORTED[sc.scheme])
    if sc.scheme not in GEMLITE_FORMATS:
        raise Skip(f"no gemlite format mapped for {sc.scheme}")
    import_peer("gemlite")
    from gemlite import helper
    dev = f"cuda:{torch.cuda.current_device()}"
    dt = torch.bfloat16
    W = sc.shape.W
    n, k = sc.N, sc.K
    w_ref = None
    name = GEMLITE_FORMATS[sc.scheme]
    if name == "A16Wn":
        # our int4 codes -> unsigned 0..15 with zero point 8; scales cast to bf16 (gemlite's dtype), so
        # gemlite's dequantized weight is computed here for its reference
        qw = sc.qw()
        vals = qw.scheme.weight.decode(ht.unpack_codes(qw.data, 4, k)).float()  # -8..7
        w_q = (vals + 8).to(torch.uint8)
        scales = qw.scales.to(dt)
        zeros = torch.full_like(scales, 8)
        g = qw.scheme.group_k(k)
        layer = helper.A16Wn(device=dev, dtype=dt).from_weights(w_q, scales, zeros, W_nbits=4,
                                                               group_size=g)
        w_ref = vals * scales.float().repeat_interleave(g, dim=1)
    elif name in ("A16W8_INT8", "A8W8_fp8_dynamic"):
        layer = getattr(helper, name)(device=dev, dtype=dt).from_weights(W.clone())
    else:
        lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=dt)  # throwaway: from_linear eats it
        lin.weight.data.copy_(W)
        kw = {"post_scale": True} if name == "A8W4_MXFP_dynamic" else {}
        layer = getattr(helper, name)(device=dev, dtype=dt, **kw).from_linear(lin)
    return layer, w_ref


def make_gemlite(sc: SchemeCtx, mi: MInputs) -> Prepared:
    layer, w_ref = _gemlite_layer(sc)
    x = mi.x
    a8 = _act8(sc.scheme)
    if w_ref is not None:
        ref, tol, what = (lambda: sc.shape.apply_weight(mi, w_ref)), TOL_PEER_A16, "gemlite's dequantized weight"
    else:
        ref, tol, what = (lambda: sc.shape.y_float(mi)), (lambda: sc.float_tol(mi)), "float32 x@W.T"
    return Prepared(lambda: layer(x), ref, tol, what, sc.wbytes(mi), "fp8" if a8 else "bf16", sc.scheme)
