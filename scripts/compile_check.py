"""Compile every kernel variant the launchers can pick with *another* Triton version, for sm_90, without a GPU.

The H200 runs Triton 3.6 while CI runs 3.8; a construct that lowers on one can fail on the other.  Two steps,
two interpreters:

    PYTHONPATH=. python3 scripts/compile_check.py dump jobs.json            # this env (torch + humming_triton)
    /path/to/python-with-other-triton scripts/compile_check.py compile jobs.json   # needs only triton

``dump`` records what ``kernels.inspect`` would compile (signature, constexprs, divisibility attributes, warps,
stages) for every preset at several M, the grouped kernel and the activation quantizer; ``compile`` loads the
kernel modules straight from humming_triton/kernels/ (they import only triton) and compiles each job.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
import types

KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "humming_triton", "kernels")


def dump(path: str) -> int:
    sys.path.insert(0, os.path.dirname(KERNELS.rsplit(os.sep, 1)[0]))
    from humming_triton.formats import PRESETS
    from humming_triton.kernels import inspect as ins
    jobs = []

    def record(kern, consts, ptrs, ints, num_warps, num_stages, arch):
        names = kern.arg_names
        jobs.append({"module": kern.fn.__module__.rsplit(".", 1)[-1], "kernel": kern.fn.__name__,
                     "signature": {a: ("constexpr" if a in consts else ptrs.get(a, "i32")) for a in names},
                     "constexprs": consts, "divisible": [a for a in names if a in ptrs or (a in ints and
                                                                                    ints[a] % 16 == 0)],
                     "num_warps": num_warps, "num_stages": num_stages, "arch": arch})
        return {}

    ins._compile = record
    for preset in PRESETS:
        for m in (1, 2, 4, 8, 16, 64, 256):
            try:
                ins.compile_report(preset, m, 4096, 4096)
            except ValueError:  # dequant_mm: the dequantize kernel + cuBLAS, covered below
                pass
    for preset, rows in (("w4a16", 8), ("w4a16", 32768), ("mxfp4", 32768), ("w3a16", 32768), ("nvfp4", 8),
                         ("w8a8-fp8", 8), ("w8a8-fp8-block", 32768), ("w4a8-mxfp4", 8), ("w8a8-int8", 32768),
                         ("w4a8-int8", 8), ("w4a4-nvfp4", 8), ("w4a4-mxfp4", 32768)):
        ins.grouped_report(preset, 1536, 2048, 128, rows=rows)
    for preset, rows in (("w4a16", 8), ("w4a16", 32768), ("w3a16", 8)):  # act-order (GPTQ desc_act) experts
        ins.grouped_report(preset, 1536, 2048, 128, rows=rows, act_order=True)
    from humming_triton.formats import QuantScheme
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
    from humming_triton.kernels._act_quant import act_quant_kernel
    for kind, scale_kind in ((1, 0), (2, 0), (3, 1), (3, 2)):
        consts = dict(KIND=kind, SCALE_KIND=scale_kind, GROUP_K=128, BLOCK_K=128)
        record(act_quant_kernel, consts, {"x_ptr": "*bf16", "codes_ptr": "*u8", "gs_ptr": "*fp32",
                                          "scales_ptr": "*fp32" if kind < 3 else "*u8"}, {}, 4, 3, 90)
    with open(path, "w") as f:
        json.dump(jobs, f)
    print(f"{len(jobs)} compile jobs -> {path}")
    return 0


def compile_jobs(path: str) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    pkg = types.ModuleType("htk")  # the kernels directory as a package, without running its __init__ (torch)
    pkg.__path__ = [KERNELS]
    sys.modules["htk"] = pkg
    jobs = json.load(open(path))
    failed = 0
    for i, job in enumerate(jobs):
        kern = getattr(importlib.import_module(f"htk.{job['module']}"), job["kernel"])
        names = kern.arg_names
        src = ASTSource(fn=kern, signature=job["signature"],
                        constexprs={(names.index(a),): v for a, v in job["constexprs"].items()},
                        attrs={(names.index(a),): [["tt.divisibility", 16]] for a in job["divisible"]})
        try:
            triton.compile(src, target=GPUTarget("cuda", job["arch"], 32),
                           options={"num_warps": job["num_warps"], "num_stages": job["num_stages"]})
        except Exception:  # report every failure, keep going
            failed += 1
            print(f"FAILED {job['kernel']} {json.dumps(job['constexprs'])}\n{traceback.format_exc(limit=3)}")
    print(f"triton {triton.__version__}: {len(jobs) - failed}/{len(jobs)} kernel variants compiled for sm_90")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("dump", "compile"):
        sys.exit(__doc__)
    sys.exit(dump(sys.argv[2]) if sys.argv[1] == "dump" else compile_jobs(sys.argv[2]))
