"""The dense kernels compile for Hopper (sm_90) without a GPU, with the instructions we rely on: wgmma in the
tiled family, no register spills in the default configs of the main formats.  Runs in a subprocess because
the test session interprets Triton kernels (TRITON_INTERPRET=1)."""
import json
import os
import subprocess
import sys

import pytest

# fp8-activation schemes: fp8 mma.sync at M <= 16, e4m3 codes on a bf16 wgmma above (configs.fp8_config)
CASES = [("w4a16", 1), ("w4a16", 16), ("w4a16", 256), ("nvfp4", 1), ("mxfp4", 64), ("w8a16", 1), ("w3a16", 1),
         ("w3a16", 16), ("w3a16", 256), ("w2a16", 64), ("w2a16", 256), ("w4a16-asym", 64), ("w4a16-asym", 256), ("w1a16", 256),
         ("w8a16-fp8-block", 256), ("nvfp4", 256), ("w8a8-fp8", 16), ("w4a8-mxfp4", 16), ("w4a8-fp8", 1),
         ("w8a8-int8", 256), ("w4a8-int8", 64), ("w4a4-mxfp4", 1), ("w4a4-nvfp4", 16), ("w4a4-nvfp4", 256),
         ("w8a8-fp8", 64), ("w8a8-fp8-block", 256), ("w4a8-mxfp4", 256), ("w8a8-mxfp8", 16),
         ("w8a8-mxfp8", 256)]

GROUPED = [("w4a16", 16), ("nvfp4", 64), ("w3a16", 64), ("w4a16-asym", 64), ("w2a16", 64), ("mxfp4", 16),
           ("w8a8-fp8", 16), ("w8a8-fp8", 64), ("w8a8-int8", 64), ("w4a4-nvfp4", 64)]

_SCRIPT = """
import json, sys
from humming_triton.kernels.inspect import compile_report, grouped_report
dense = [compile_report(s, m, 4096, 4096) for s, m in json.loads(sys.argv[1])]
grouped = [grouped_report(s, 1536, 2048, 128, rows=8 if bm == 16 else 32768) for s, bm in json.loads(sys.argv[2])]
print(json.dumps([dense, grouped]))
"""


@pytest.fixture(scope="module")
def reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(CASES), json.dumps(GROUPED)],
                         capture_output=True, text=True,
                         env=env, timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-3000:]
    dense, grouped = json.loads(out.stdout.strip().splitlines()[-1])
    return {**{(r["scheme"], r["M"]): r for r in dense}, **{(r["scheme"], "grouped", r["block_m"]): r for r in grouped}}


@pytest.mark.parametrize("scheme,m", CASES)
def test_compiles_for_hopper_without_spills(reports, scheme, m):
    r = reports[(scheme, m)]
    assert r["stack_bytes"] == 0 and r["ldl"] == 0, f"register spills: {r}"
    assert r["shared_bytes"] <= 227 * 1024, f"more shared memory than an H100/H200 block can have: {r}"
    if r["family"] == "tiled" and r["block_m"] >= 64:
        # fp8 activations on 64/128-row tiles go through a bf16 wgmma (the fp8 one is not exact on the H200)
        mma = "igmma" if scheme.endswith("int8") else "hgmma"
        assert r[mma] > 0, f"tiled kernel with BLOCK_M >= 64 should use wgmma ({mma}): {r}"
    if r["family"] == "tiled" and r["block_m"] < 64:
        assert r["hmma"] > 0, r


@pytest.mark.parametrize("scheme,block_m", GROUPED)
def test_grouped_kernel_compiles_for_hopper(reports, scheme, block_m):
    r = reports[(scheme, "grouped", block_m)]
    assert r["stack_bytes"] == 0 and r["ldl"] == 0, f"register spills: {r}"
    assert r["shared_bytes"] <= 227 * 1024, r
    mma = ("igmma" if scheme.endswith("int8") else "hgmma") if block_m >= 64 else \
        ("imma" if scheme.endswith("int8") else "hmma")
    assert r[mma] > 0, r


_ACT_QUANT_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from humming_triton.kernels._act_quant import act_quant_f32_kernel, act_quant_kernel, act_quant_mx_rows_kernel

def ptx(fn, consts, ptrs, warps=4):
    names = fn.arg_names
    sig = {a: ("constexpr" if a in consts else ptrs.get(a, "i32")) for a in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(a),): v for a, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]

approx = lambda p: "div.full.f32" in p or "div.approx.f32" in p
for kind, scale_kind in ((1, 1), (3, 1), (3, 2)):
    for xt in ("*fp16", "*bf16", "*fp32"):
        p = ptx(act_quant_kernel, dict(KIND=kind, SCALE_KIND=scale_kind, GROUP_K=32, BLOCK_K=32, SCALE_VALUES=False,
                                       GROUPS=32, VALUES=0),
                {"x_ptr": xt, "codes_ptr": "*u8", "scales_ptr": "*u8", "gs_ptr": "*fp32"})
        print("f64", kind, xt, "div.rn.f64" in p, approx(p))
for int8 in (False, True):
    for xt in ("*fp16", "*bf16", "*fp32"):
        for group, groups, block in ((128, 8, 128), (32768, 1, 4096)):
            p = ptx(act_quant_f32_kernel, dict(INT8=int8, GROUP_K=group, GROUPS=groups, BLOCK_K=block,
                                               CODE_VALUES=False), {"x_ptr": xt, "codes_ptr": "*u8", "scales_ptr": "*fp32"})
            print("f32", int8, xt, "div.rn.f32" in p, approx(p))
for xt in ("*fp16", "*bf16"):  # MXFP4 rows as e4m3: no division at all (exponents off the bits), no flushed
    for ct in ("*u8", "*bf16"):  # subnormals; bytes for _scaled_mm, bf16 code values for the decode kernel
        p = ptx(act_quant_mx_rows_kernel, dict(BLOCK_K=8192, ONE_PASS=True, CODE_VALUES=ct != "*u8"),
                {"x_ptr": xt, "codes_ptr": ct, "rs_ptr": "*fp32"}, warps=16)
        print("mx", xt, ct, "div." not in p and ".ftz" not in p, approx(p))
"""


def test_activation_quantizer_divides_exactly_on_hopper():
    """The quantizers must round the quotient the reference's way: IEEE division (float64 for the block-scaled
    formats; fp32 with an exact float64 residual for fp32 scales), never the approximate fp32 one Triton emits
    for a plain fp32 '/' on the GPU (the MXFP4 row quantizer included)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _ACT_QUANT_SCRIPT], capture_output=True, text=True, env=env,
                         timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 25 and all(line.endswith("True False") for line in lines), lines
