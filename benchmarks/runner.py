"""The run: ceilings, then every case x method (build -> first call -> check -> time), then cold start.

Cases are grouped by shape so a weight is generated once and shared by every scheme and method, and each
scheme's quantized weight / peer layer is built once and reused across M.  Nothing a method does can abort the
run: every failure becomes a row with ``us = null`` and the reason in ``error``.
"""
from __future__ import annotations

import gc
import itertools
import time

import torch

from . import methods as mt
from . import peers
from .cases import ACT_FP8_SCHEMES, DenseCase, MoECase
from .timing import time_cpu, time_gpu

ALL_METHODS = ("humming_triton", "cublas", "torch_scaled_mm", "torch_grouped_mm", "humming", "gemlite",
               "humming_triton_invariant")
BUDGETED = ("humming", "gemlite")


def _base_record(case, method: str, scheme: str) -> dict:
    r = {"kind": case.kind, "method": method, "scheme": scheme, "N": case.N, "K": case.K, "M": case.M}
    rows = case.M
    if isinstance(case, MoECase):
        rows = case.M * case.topk
        r.update(E=case.E, topk=case.topk, gemm=case.name)
    r.update(rows=rows, us=None, error=None, rel_err=None, tol=None, ref=None, timing=None, reps=None,
             setup_s=None, flops=2 * rows * case.N * case.K, bytes=None, tflops=None, gbps=None, pct_hbm=None,
             pct_tc=None, vs_best_peer=None, best_peer=None, path=None)
    if case.kind == "dense":
        r.update(floor_us=None, pct_floor=None)  # filled after the run by floor.add_floor (GPU only)
    return r


def method_label(method: str, cpu: bool, dtype: torch.dtype) -> str:
    """What a row's method ran, for tables and plots.  On CPU (``--interpret``) the "cublas" baseline is torch's
    CPU matmul: the method key stays "cublas" (the results schema), the label says what it is (issue 18)."""
    from .report import NAMES
    if cpu and method == "cublas":
        short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
        return f"torch CPU matmul ({short.get(dtype, str(dtype).removeprefix('torch.'))})"
    return NAMES.get(method, method)


def _sync(cpu: bool) -> None:
    if not cpu:
        torch.cuda.synchronize()


def run_one(case, method: str, make, *, cpu: bool, budget: peers.PeerBudget, ceilings: dict,
            scheme_label: str) -> dict:
    rec = _base_record(case, method, scheme_label)
    t0 = time.perf_counter()
    charged = False
    try:
        if method in BUDGETED:
            budget.check(method)
        prep = make()
        rec["scheme"] = prep.scheme or scheme_label
        y = prep.fn()  # first call: may compile / autotune / build a cached repacked view
        _sync(cpu)
        if prep.plan is not None:
            rec["path"] = prep.plan()
        if prep.check_backend is not None:
            why = prep.check_backend()
            if why:
                raise mt.Skip(why)
        y = prep.fn()  # second warm call: autotuners that pick on the first call have settled
        _sync(cpu)
        rec["setup_s"] = round(time.perf_counter() - t0, 3)
        budget.charge(method, rec["setup_s"])
        charged = True
        ref = prep.y_ref()
        tol = prep.tol() if callable(prep.tol) else prep.tol
        err = mt.rel_err(y, ref)
        rec.update(rel_err=err, tol=tol, ref=prep.ref)
        del y, ref
        if not err <= tol:  # NaN fails too
            rec["error"] = f"wrong output: relative error {err:.3g} > tolerance {tol:.3g} vs {prep.ref}; not timed"
            return rec
        rec["error"] = err
        t = time_cpu(prep.fn) if cpu else time_gpu(prep.fn)
        us = t["us"]
        nbytes = prep.weight_bytes + rec["rows"] * case.K * 2 + rec["rows"] * case.N * 2
        tflops = rec["flops"] / us / 1e6
        gbps = nbytes / us / 1e3
        rec.update(us=us, reps=t["reps"], timing=t["timing"], spread=t["spread"], bytes=nbytes, tflops=tflops,
                   gbps=gbps)
        if ceilings.get("copy_gbps"):
            rec["pct_hbm"] = 100 * gbps / ceilings["copy_gbps"]
        peak = ceilings.get(f"{prep.peak}_tflops")
        if peak:
            rec["pct_tc"] = 100 * tflops / peak
    except mt.Skip as e:
        rec["error"] = str(e)
    except Exception as e:  # noqa: BLE001 -- a peer's failure is a row, never the end of the run
        rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        try:
            _sync(cpu)
        except Exception:  # noqa: BLE001
            pass
    finally:
        if not charged:
            budget.charge(method, time.perf_counter() - t0)
    return rec


def _fmt(rec: dict) -> str:
    tag = f"{rec['kind']:5s} {rec['scheme']:12s} {rec['N']}x{rec['K']} M={rec['M']:<5d} {rec['method']:17s}"
    if rec["us"] is not None:
        return (f"{tag} {rec['us']:9.1f} us  {rec['tflops']:7.1f} TF/s {rec['gbps']:7.0f} GB/s  "
                f"err {rec['rel_err']:.2e}  [setup {rec['setup_s']:.1f} s]" + (f"  {rec['path']}" if rec["path"] else ""))
    return f"{tag}      --    {rec['error']}"


def _wanted_methods(case, suite: str, selected: set, done: set) -> list[str]:
    key = (case.shape_key, case.M)
    out = []
    if "humming_triton" in selected:
        out.append("humming_triton")
    if "humming_triton_invariant" in selected:
        out.append("humming_triton_invariant")
    if case.kind == "dense":
        if "cublas" in selected and ("cublas", key) not in done:
            out.append("cublas")
        if "torch_scaled_mm" in selected and case.scheme in ACT_FP8_SCHEMES and ("scaled", key) not in done:
            out.append("torch_scaled_mm")
    elif "torch_grouped_mm" in selected and ("grouped", key) not in done:
        out.append("torch_grouped_mm")
    if "humming" in selected and case.scheme in peers.HUMMING_FORMATS:
        out.append("humming")
    if "gemlite" in selected and case.kind == "dense":
        if suite == "full" and (case.scheme in peers.GEMLITE_FORMATS or case.scheme in peers.GEMLITE_UNSUPPORTED):
            out.append("gemlite")
        elif suite in ("headline", "decode") and case.scheme == "w4a16":  # its autotune: 4-19 s per M
            out.append("gemlite")
    return out


def run_cases(cases: list, *, suite: str, selected: set, device: str, our_backend: str,
              budget: peers.PeerBudget, ceilings: dict, log=print) -> list[dict]:
    cpu = device == "cpu"
    records: list[dict] = []
    done: set = set()
    by_shape = itertools.groupby(sorted(cases, key=lambda c: (c.kind, c.shape_key)), key=lambda c: c.shape_key)
    for si, (skey, group) in enumerate(by_shape):
        group = list(group)
        c0 = group[0]
        g = torch.Generator(device=device).manual_seed(1234 + si)
        wshape = (c0.E, c0.N, c0.K) if isinstance(c0, MoECase) else (c0.N, c0.K)
        W = (torch.randn(wshape, device=device, generator=g) * 0.02).to(torch.bfloat16)
        shape = mt.ShapeCtx(W, device, topk=getattr(c0, "topk", 1), seed=si)
        schemes = list(dict.fromkeys(c.scheme for c in group))
        for scheme in schemes:
            sc = mt.SchemeCtx(scheme, shape)
            for case in sorted((c for c in group if c.scheme == scheme), key=lambda c: c.M):
                mi = shape.inputs(case.M)
                key = (case.shape_key, case.M)
                for method in _wanted_methods(case, suite, selected, done):
                    make = {
                        "humming_triton": lambda: mt.make_ours(sc, mi, our_backend),
                        "humming_triton_invariant": lambda: mt.make_ours(sc, mi, our_backend, invariant=True),
                        "cublas": lambda: mt.make_cublas(shape, mi),
                        "torch_scaled_mm": lambda: mt.make_scaled_mm(sc, mi),
                        "torch_grouped_mm": lambda: mt.make_grouped_mm(shape, mi),
                        "humming": lambda: peers.make_humming(sc, mi),
                        "gemlite": lambda: peers.make_gemlite(sc, mi),
                    }[method]
                    label = {"cublas": "bf16", "torch_grouped_mm": "bf16", "torch_scaled_mm": "w8a8-fp8"}.get(
                        method, scheme)
                    rec = run_one(case, method, make, cpu=cpu, budget=budget, ceilings=ceilings,
                                  scheme_label=label)
                    rec["label"] = method_label(method, cpu, W.dtype)
                    done.add(({"cublas": "cublas", "torch_scaled_mm": "scaled",
                               "torch_grouped_mm": "grouped"}.get(method, method), key))
                    records.append(rec)
                    log(_fmt(rec))
            del sc
            gc.collect()
            if not cpu:
                torch.cuda.empty_cache()
        del shape, W
        gc.collect()
        if not cpu:
            torch.cuda.empty_cache()
    return records


def cases_filter(cases: list, only: str | None, schemes: list | None) -> list:
    if only:
        cases = [c for c in cases if c.kind == only]
    if schemes:
        cases = [c for c in cases if c.scheme in schemes]
    return cases


__all__ = ["ALL_METHODS", "run_cases", "run_one", "cases_filter", "method_label", "DenseCase", "MoECase"]
