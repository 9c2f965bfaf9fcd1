"""Compile every kernel variant the launchers can pick, for several GPU architectures, without a GPU -- with
this environment's Triton or *another* one.

The H200 runs Triton 3.6 while CI runs 3.8, and a construct that lowers on one Triton (or one SM) can fail on
another.  Two steps, two interpreters:

    PYTHONPATH=. python3 scripts/compile_check.py dump jobs.json            # this env (torch + humming_triton)
    /path/to/python-with-some-triton scripts/compile_check.py compile jobs.json [--arch 80,89,90,100,120]
                                                              [--jobs N] [--json results.json] [--verbose]

``dump`` records what ``kernels.inspect`` would compile (signature, constexprs, divisibility attributes, warps,
stages) for every preset at several M with the built-in configs, the first candidate of every registered dense
family those configs never pick (a measured table can pick it), the grouped kernel, the dequantize kernel and
the activation quantizer.
``compile`` loads the kernel modules straight from humming_triton/kernels/ (they import only triton) and
``humming_triton/capability.py`` by path (it imports no torch), then, arch by arch, compiles each distinct
variant with ``triton.compile(src, target=GPUTarget("cuda", arch, 32))`` -- Triton itself turns 90 / 100 / 120
into sm_90a / sm_100a / sm_120a (and uses its bundled ptxas-blackwell from 100).  A variant whose MMA the arch
lacks (capability.mma_reason: fp8 activations on sm_80, the block-scaled ``dot_scaled`` family below sm_100, ...) is
"not applicable" and not compiled; a block-scaled variant whose PTX has no block-scaled MMA instruction (Triton
emulated ``tl.dot_scaled``) counts as a failure, and the block-scaled PTX instructions and SASS opcodes found are
reported per arch.  On sm_90 it also reports (does not fail) tiled variants with a >= 64-row MMA side whose PTX has
no wgmma.  Exit status 1 when any variant fails to compile.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import itertools
import json
import os
import re
import sys
import time
import traceback
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "humming_triton", "kernels")
ARCHS = (80, 89, 90, 100, 120)


def job_of(kern, consts: dict, ptrs: dict, ints: dict, num_warps: int, num_stages: int, arch: int) -> dict:
    """One compile job: the kernel (module and name under humming_triton/kernels/), its signature (pointer types,
    i32 for the other runtime arguments), constexprs and the runtime's divisibility-by-16 specialisation."""
    names = kern.arg_names
    return {"module": kern.fn.__module__.rsplit(".", 1)[-1], "kernel": kern.fn.__name__,
            "signature": {a: ("constexpr" if a in consts else ptrs.get(a, "i32")) for a in names},
            "constexprs": consts, "divisible": [a for a in names if a in ptrs or (a in ints and ints[a] % 16 == 0)],
            "num_warps": num_warps, "num_stages": num_stages, "arch": arch}


def dump(path: str) -> int:
    sys.path.insert(0, ROOT)
    from humming_triton.formats import PRESETS
    from humming_triton.kernels import inspect as ins
    jobs = []

    def record(kern, consts, ptrs, ints, num_warps, num_stages, arch):
        jobs.append(job_of(kern, consts, ptrs, ints, num_warps, num_stages, arch))
        return {}

    ins._compile = record
    reached = set()
    for preset in PRESETS:
        for m in (1, 2, 4, 8, 16, 64, 256):
            try:
                reached.add(ins.compile_report(preset, m, 4096, 4096)["family"])
            except ValueError:  # dequant_mm: the dequantize kernel + cuBLAS, covered below
                pass
    # a family the built-in defaults never pick can still be chosen by a measured table (autotune_configs/):
    # compile its first candidate for every preset, at the smallest of these M it takes
    import torch
    from humming_triton.calls import Call
    from humming_triton.formats import QuantScheme
    from humming_triton.kernels import families
    for fam in families.registered("quant_linear", "triton"):
        if fam.name in reached:
            continue
        for preset in PRESETS:
            for m in (1, 16, 64, 256):
                call = Call("quant_linear", QuantScheme.parse(preset), torch.bfloat16, m, 4096, 4096)
                cands = [] if fam.reason(call) else fam.candidates(call)
                if cands:
                    if hasattr(fam, "compile_spec"):  # a multi-step family (quantizer + GEMM): its GEMM launch
                        spec, ptrs, ints = fam.compile_spec(call, cands[0])
                        record(spec.kernel, spec.constexprs, ptrs, ints, spec.num_warps, spec.num_stages, 100)
                        break
                    try:
                        ins.compile_report(preset, m, 4096, 4096, cfg=cands[0])
                    except ValueError:  # not a single Triton launch
                        pass
                    break
    for preset, rows in (("w4a16", 8), ("w4a16", 32768), ("mxfp4", 32768), ("w3a16", 32768), ("nvfp4", 8),
                         ("w8a8-fp8", 8), ("w8a8-fp8-block", 32768), ("w4a8-mxfp4", 8), ("w8a8-int8", 32768),
                         ("w4a8-int8", 8), ("w4a4-nvfp4", 8), ("w4a4-mxfp4", 32768)):
        ins.grouped_report(preset, 1536, 2048, 128, rows=rows)
    for preset, rows in (("w4a16", 8), ("w4a16", 32768), ("w3a16", 8)):  # act-order (GPTQ desc_act) experts
        ins.grouped_report(preset, 1536, 2048, 128, rows=rows, act_order=True)
    # the swap-AB loop: grouped (16-row tiles with the scale on the partial, wide ones scaling the weight) and dense
    # above 16 tokens (the family's first wide tile), which the smallest-M pass above does not reach
    for preset, rows in (("w4a16", 2048), ("w4a16", 32768), ("mxfp4", 32768), ("w3a16", 32768), ("nvfp4", 2048)):
        ins.grouped_report(preset, 1536, 2048, 128, rows=rows, swap=True)
    swap = families.get("swapab")
    for preset in ("w4a16", "w4a16-asym", "w3a16", "w8a16", "mxfp4", "nvfp4"):
        call = Call("quant_linear", QuantScheme.parse(preset), torch.bfloat16, 256, 4096, 4096)
        if not swap.reason(call):
            ins.compile_report(preset, 256, 4096, 4096, cfg=swap.candidates(call)[0])
    from humming_triton.kernels import configs
    from humming_triton.kernels._dequant import dequant_kernel
    from humming_triton.kernels.format_args import format_constexprs
    for preset in PRESETS:  # the dequantize kernel of the dequant_mm route, with the launcher's tile
        s = QuantScheme.parse(preset)
        fmt = format_constexprs(s, 4096, 4096)
        bk = configs.fit_block_k(128, fmt["GROUP_K"], 4096, s.bits)
        fmt["GROUP_K"] = max(fmt["GROUP_K"], bk) if fmt["GROUP_K"] >= 4096 else fmt["GROUP_K"]
        ptrs = {k: v for k, v in ins._pointer_types(s, "bf16", 1).items() if k in ("w_ptr", "s_ptr", "z_ptr", "g_ptr")}
        record(dequant_kernel, dict(BLOCK_N=32, BLOCK_K=bk, EVEN_K=True, **fmt), {**ptrs, "out_ptr": "*bf16"},
               {"N": 4096, "K": 4096}, 4, 3, 90)
    from humming_triton.kernels._act_quant import act_quant_f32_kernel, act_quant_kernel
    for kind, scale_kind in ((1, 1), (3, 1), (3, 2)):  # block-scaled activations (MXFP8, MXFP4, NVFP4)
        g = 32 if scale_kind == 1 else 16
        for groups, values in ((1, 0), (1024 // g, 0), (1024 // g, 1), (1024 // g, 2)):  # values: bf16 out
            consts = dict(KIND=kind, SCALE_KIND=scale_kind, GROUP_K=g, BLOCK_K=g, SCALE_VALUES=False,
                          GROUPS=groups, VALUES=values)
            record(act_quant_kernel, consts, {"x_ptr": "*bf16", "codes_ptr": "*bf16" if values else "*u8",
                                              "gs_ptr": "*fp32", "scales_ptr": "*u8"}, {}, 4, 3, 90)
    for int8, values, (group, groups, block, warps) in itertools.product(
            (False, True), (False, True), ((128, 8, 128, 4), (4096, 1, 4096, 4), (8192, 1, 8192, 8),
                                           (32768, 1, 4096, 4))):  # fp32 scales; values: fp16 code values
        for cvt in ((False, True, 2) if not int8 and not values else (False,)):  # CVT_E4M3: e4m3 bytes only
            consts = dict(INT8=int8, GROUP_K=group, GROUPS=groups, BLOCK_K=block, CODE_VALUES=values, CVT_E4M3=cvt)
            record(act_quant_f32_kernel, consts, {"x_ptr": "*bf16", "codes_ptr": "*fp16" if values else "*u8",
                                                  "scales_ptr": "*fp32"}, {}, warps, 3, 90)
    with open(path, "w") as f:
        json.dump(jobs, f)
    print(f"{len(jobs)} compile jobs -> {path}")
    return 0


def load_capability():
    """humming_triton/capability.py as a stand-alone module (importing the package would import torch)."""
    if "ht_capability" not in sys.modules:
        spec = importlib.util.spec_from_file_location("ht_capability", os.path.join(ROOT, "humming_triton",
                                                                                     "capability.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ht_capability"] = mod  # dataclasses look their module up while the class is built
        spec.loader.exec_module(mod)
    return sys.modules["ht_capability"]


# the tile loop's ACT_KIND on activation codes (x_ptr *u8) -> their element type (kernels/dense.py: act_kind);
# 16-bit activations (ACT_KIND 0, or 6: the packed-int4 weight decode) are told apart by x_ptr's type instead
_ACT_KIND_DTYPE = {1: "e4m3fn", 5: "e4m3fn", 8: "e4m3fn", 2: "int8", 7: "int8", 9: "int8", 3: "e2m1", 4: "e2m1"}
# kernel -> the constexpr that is the M side of its MMA (the wgmma check); swap-AB puts the weight's N there
MMA_M_SIDE = {"dense_tiled_kernel": "BLOCK_M", "grouped_tiled_kernel": "BLOCK_M", "dense_swapab_kernel": "BLOCK_N"}
# kernels built on tl.dot_scaled (kernels/_dense_scaled.py): "block_scaled" (SM 10.0+); below it Triton would emulate
# the MMA in bf16, which no dispatch path offers, so sm_80 / 89 / 90 list them as not applicable
BLOCK_SCALED = {"dense_scaled_kernel"}


def job_mma(job: dict) -> str:
    """The MMA kind a variant needs (capability.MMA_KINDS; "fma": no tensor cores)."""
    cap = load_capability()
    c = job["constexprs"]
    if job["kernel"] in MMA_M_SIDE:
        x = job["signature"].get("x_ptr", "*bf16").lstrip("*")
        if x != "u8":  # 16-bit (or fp32) activations, whatever the weight-decode variant (ACT_KIND 0 / 6)
            return cap.kernel_mma_kind(None, "fp32" if c.get("DOT_F32") else x)
        if c.get("ACT_KIND") not in _ACT_KIND_DTYPE:
            raise ValueError(f"{job['kernel']}: unknown ACT_KIND {c.get('ACT_KIND')} on codes; add it to "
                             f"scripts/compile_check.py:_ACT_KIND_DTYPE")
        return cap.kernel_mma_kind(_ACT_KIND_DTYPE[c["ACT_KIND"]])
    if job["kernel"] in BLOCK_SCALED:  # tl.dot_scaled: native only where the MMA applies the block scales
        return "block_scaled"
    if (job["kernel"] == "act_quant_kernel" and c["KIND"] == 1) or \
            (job["kernel"] == "act_quant_f32_kernel" and not c["INT8"] and not c["CODE_VALUES"]):
        # the e4m3 quantizer converts through Triton's fp8e4nv (sm_89+) and serves only fp8-MMA schemes
        return "fp8"
    return "fma"  # GEMVs, dequantize, int8 / e2m1 quantizers: CUDA cores only


def wants_wgmma(job: dict) -> bool:
    """A tensor-core variant with a >= 64-row MMA side: on sm_90 it should lower to wgmma."""
    side = MMA_M_SIDE.get(job["kernel"])
    return side is not None and job["constexprs"][side] >= 64 and job_mma(job) != "fma"


def describe(job: dict) -> str:
    c = job["constexprs"]
    keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "ROWS", "BLOCK_W", "SPLIT_K", "ACT_KIND", "KIND", "BITS", "W_IS_FLOAT",
            "GROUP_K", "ZERO_KIND", "HAS_PERM")
    return job["kernel"] + " " + ",".join(f"{k}={c[k]}" for k in keys if k in c)


def _init_worker() -> None:
    pkg = types.ModuleType("htk")  # the kernels directory as a package, without running its __init__ (torch)
    pkg.__path__ = [KERNELS]
    sys.modules["htk"] = pkg


def first_line(e: Exception) -> str:
    """One line saying what went wrong.  Triton's CompilationError reads "at L:C:", the quoted kernel source, then
    its message -- which a CompilationError raised inside a called @jit function carries on its cause instead."""
    where, msg, x = None, None, e
    while x is not None:
        lines = [ln.strip() for ln in str(x).splitlines() if ln.strip()] or [""]
        if where is None and lines[0].startswith("at "):
            where = lines[0]
        if getattr(x, "error_message", None):
            msg = str(x.error_message).strip().splitlines()[0]  # the innermost one wins
        elif not lines[0].startswith("at "):
            msg = msg or f"{type(x).__name__}: {lines[0]}"
        x = x.__cause__ or x.__context__
    return f"{type(e).__name__} {where or ''} {msg or ''}".replace("  ", " ").strip()[:300]


def compile_one(job: dict, arch: int) -> dict:
    """Compile one variant for ``arch``: ok, seconds, whether its PTX has wgmma, the error's first line."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    if "htk" not in sys.modules:
        _init_worker()
    kern = getattr(importlib.import_module(f"htk.{job['module']}"), job["kernel"])
    names = kern.arg_names
    stale = [a for a in names if a not in job["signature"]]
    if stale:  # the kernel changed since the dump: its new arguments would surface as a cryptic compile error
        return {"ok": False, "seconds": 0.0, "trace": "",
                "error": f"the jobs file is stale: {job['kernel']} now takes {', '.join(stale)}; run dump again"}
    src = ASTSource(fn=kern, signature=job["signature"],
                    constexprs={(names.index(a),): v for a, v in job["constexprs"].items()},
                    attrs={(names.index(a),): [["tt.divisibility", 16]] for a in job["divisible"]})
    t0 = time.perf_counter()
    try:
        ck = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": job["num_warps"], "num_stages": job["num_stages"]})
    except Exception as e:  # report every failure, keep going
        return {"ok": False, "seconds": time.perf_counter() - t0, "error": first_line(e),
                "trace": traceback.format_exc(limit=3)}
    ptx = ck.asm["ptx"]
    out = {"ok": True, "seconds": time.perf_counter() - t0, "wgmma": "wgmma.mma_async" in ptx}
    if job["kernel"] in BLOCK_SCALED:
        # the block-scaled MMA itself: sm_100 "tcgen05.mma.cta_group::1.kind::mxf4.block_scale..." (mxf4nvf4,
        # mxf8f6f4), sm_120 "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale..."; an emulated
        # tl.dot_scaled shows a kind::f16 / bf16 MMA instead
        found = sorted(set(re.findall(r"[\w.:]*mma[\w.:]*\.block_scale[\w.:]*", ptx)))
        out["block_scale_mma"] = found
        out["block_scale_sass"] = _sass_mma(ck.asm["cubin"])
        if not found:
            return {**out, "ok": False, "trace": "",
                    "error": "compiled, but its PTX has no block-scaled MMA (Triton emulated tl.dot_scaled)"}
    return out


def _sass_mma(cubin: bytes) -> list[str]:
    """The MMA opcodes of a cubin's SASS (cuobjdump from Triton's bundled tools; [] where it is missing):
    sm_100 tcgen05 UTCOMMA / UTCQMMA, sm_120 OMMA.SF / QMMA.SF (the block-scaled mma.sync)."""
    import subprocess
    import tempfile
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.access(tool, os.X_OK):
        return []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True).stdout
    return sorted(set(re.findall(r"\b(UTC[A-Z]*MMA[\w.]*|[A-Z]*MMA\.SF[\w.]*)", sass)))


def distinct(jobs: list[dict]) -> list[dict]:
    """The dump lists a variant once per (preset, M) that picks it; compile each once."""
    seen, out = set(), []
    for job in jobs:
        key = json.dumps({k: v for k, v in job.items() if k != "arch"}, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(job)
    return out


def compile_matrix(jobs: list[dict], archs=ARCHS, workers: int = 1, verbose: bool = False, log=print) -> dict:
    """Compile every distinct variant for every arch; returns {"triton": version, "archs": {arch: summary}}."""
    import triton
    cap = load_capability()
    variants = distinct(jobs)
    result = {"triton": triton.__version__, "variants": len(variants), "archs": {}}
    pool = None
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor
        pool = ProcessPoolExecutor(workers, initializer=_init_worker)
    try:
        for arch in archs:
            facts = cap.facts_for_sm(divmod(arch, 10))
            todo, skipped = [], collections.defaultdict(list)
            for job in variants:
                why = cap.mma_reason(job_mma(job), facts)
                (skipped[why].append(job) if why else todo.append(job))
            t0 = time.perf_counter()
            if pool is not None:
                outs = list(pool.map(compile_one, todo, [arch] * len(todo)))
            else:
                outs = [compile_one(job, arch) for job in todo]
            wall = time.perf_counter() - t0
            failed = [(job, o) for job, o in zip(todo, outs) if not o["ok"]]
            # a >= 64-row MMA side on Hopper should be a wgmma (tests/test_compile_sm90.py asserts it per case)
            checked = [(job, o) for job, o in zip(todo, outs) if arch == 90 and o["ok"] and wants_wgmma(job)]
            no_wgmma = [job for job, o in checked if not o["wgmma"]]
            wg_checked = len(checked)
            summary = {"compiled": len(todo) - len(failed), "attempted": len(todo),
                       "not_applicable": {why: len(js) for why, js in skipped.items()},
                       "failures": [{"variant": describe(j), "constexprs": j["constexprs"], "error": o["error"]}
                                    for j, o in failed],
                       "seconds": round(wall, 1), "compile_seconds": round(sum(o["seconds"] for o in outs), 1)}
            scaled = [o["block_scale_mma"] for o in outs if o.get("block_scale_mma")]
            if scaled:
                summary["block_scale_mma"] = sorted({i for found in scaled for i in found})
                summary["block_scale_sass"] = sorted({i for o in outs for i in o.get("block_scale_sass", [])})
            if arch == 90:
                summary["wgmma_checked"] = wg_checked
                summary["no_wgmma"] = [describe(j) for j in no_wgmma]
            result["archs"][arch] = summary
            log(f"triton {triton.__version__} sm_{arch}: {summary['compiled']}/{len(todo)} variants compiled, "
                f"{len(failed)} failed, {sum(map(len, skipped.values()))} not applicable, {wall:.1f} s")
            for why, js in skipped.items():
                kinds = collections.Counter(j["kernel"] for j in js)
                log(f"  not applicable ({len(js)}): {why} -- " + ", ".join(f"{k} x{n}" for k, n in kinds.items()))
            for i, (job, o) in enumerate(failed):
                if i == 20 and not verbose:  # all of them are in the --json file
                    log(f"  ... and {len(failed) - 20} more failures")
                    break
                log(f"  FAILED {describe(job)}: {o['error']}")
                if verbose:
                    log(f"    constexprs {json.dumps(job['constexprs'])}\n{o['trace']}")
            if scaled:
                log(f"  block-scaled MMA in {len(scaled)} dot_scaled variant(s): "
                    + ", ".join(summary["block_scale_mma"]) + "; SASS: " + ", ".join(summary["block_scale_sass"]))
            if arch == 90:
                log(f"  wgmma: {wg_checked - len(no_wgmma)}/{wg_checked} variants with a >= 64-row MMA side use it"
                    + "".join(f"\n  no wgmma in PTX: {d}" for d in summary["no_wgmma"]))
    finally:
        if pool is not None:
            pool.shutdown()
    return result


def compile_jobs(path: str, archs=ARCHS, workers: int = 1, json_out: str | None = None, verbose: bool = False
                 ) -> int:
    with open(path) as f:
        jobs = json.load(f)
    t0 = time.perf_counter()
    result = compile_matrix(jobs, archs, workers, verbose)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    failed = sum(len(a["failures"]) for a in result["archs"].values())
    print(f"triton {result['triton']}: {len(jobs)} jobs, {result['variants']} distinct variants x "
          f"{len(archs)} archs, {failed} failures, {result['seconds']} s with {workers} worker(s)")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("dump", "compile"))
    ap.add_argument("path", help="the jobs file (dump writes it, compile reads it)")
    ap.add_argument("--arch", default=",".join(map(str, ARCHS)), help="compile: comma-separated SM numbers")
    ap.add_argument("--jobs", type=int, default=1, help="compile: worker processes")
    ap.add_argument("--json", help="compile: write the per-arch results here")
    ap.add_argument("--verbose", action="store_true", help="compile: tracebacks of failures")
    args = ap.parse_args(argv)
    if args.step == "dump":
        return dump(args.path)
    return compile_jobs(args.path, [int(a) for a in args.arch.split(",")], args.jobs, args.json, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
