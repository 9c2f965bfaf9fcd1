"""The activation quantizers alone on the GPU (issue 12): same-run A/B of their variants, with % of copy rate.

At K = 8192 and M = 1 / 16 / 256 / 4096, timed like the benchmark (CUDA-graph replay, L2 flushed, median):
- MXFP4 e4m3 rows (``act_quant_mx_rows_kernel``) at ``dense.mx_rows_shape``'s launch shape and at other shapes,
  bytes and bf16 code values, e4m3 bytes by bit operations or CVT_E4M3, outputs compared byte for byte
  (session 28 also timed the float64 twin this kernel replaced: 1.9-2.7x slower);
- per-token e4m3 (``act_quant_f32_kernel``) over num_warps 4 / 8 / 16 x the rounding (float64 or split-fp32
  midpoint comparison; CVT_E4M3 1: the hardware conversion with the exact comparison only in tiles near a
  midpoint; 2: near midpoints fixed element by element), and the library's launch with each rounding forced
  (outputs compared; the persistent kernel, refuted in sessions 29-30, is no longer swept);
- NVFP4 block activations (``act_quant_kernel``): one 16-wide group per program vs 64 groups per program;
- the MoE rows (32768 x 2048 / 768: Qwen3-30B-A3B at 4096 tokens): per-token e4m3, one row per program at 1-8
  warps x each rounding.
% copy = (bytes read + written) / time / the benchmark's measured copy bandwidth.  JSON to argv[1]."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import humming_triton as ht  # noqa: E402
from humming_triton.kernels import _act_quant as aq  # noqa: E402
from humming_triton.kernels import dense  # noqa: E402


_CVT_TAG = {False: "", True: "_cvt", 2: "_cvt2"}  # dense.CVT_E4M3 forced to each rounding


def main(out_path: str | None) -> None:
    from benchmarks.timing import measure_ceilings, time_gpu
    copy_gbps = measure_ceilings()["copy_gbps"]
    k = 8192
    g = torch.Generator(device="cuda").manual_seed(0)
    mx = ht.PRESETS["w4a4-mxfp4"].act
    fp8 = ht.PRESETS["w8a8-fp8"].act
    rows = []

    def timed(name, fn, m, out_bytes, kk=k, **extra):
        fn()
        us = time_gpu(fn, budget_s=0.1)["us"]
        moved = m * kk * 2 + out_bytes
        pct = round(100 * moved / us / 1e3 / copy_gbps, 1)
        row = {"m": m, "k": kk, "case": name, "us": round(us, 2), "pct_copy": pct,
               **extra}
        rows.append(row)
        print(json.dumps(row), flush=True)

    for m in (1, 16, 256, 4096):
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        for values in (None, torch.bfloat16):
            codes_new, scales_new = dense.triton_quantize_mx_rows(x, mx, values)
            codes_old = torch.empty_like(codes_new)
            scales_old = torch.empty_like(scales_new)
            tag = "bytes" if values is None else "bf16"
            out_bytes = m * k * (1 if values is None else 2) + 4 * m
            timed(f"mx_rows_fp32_{tag}", lambda: dense.triton_quantize_mx_rows(x, mx, values), m, out_bytes,
                  shape=list(dense.mx_rows_shape(m, k)))
            if values is not None:
                continue
            for one, block, warps in ((True, 8192, 16), (True, 8192, 32), (False, 1024, 4), (False, 2048, 8),
                                      (False, 4096, 8)):  # the launch shapes mx_rows_shape chooses between
                def shaped():
                    aq.act_quant_mx_rows_kernel[(m,)](x, codes_old, scales_old, k, x.stride(0), codes_old.stride(0),
                                                      BLOCK_K=block, ONE_PASS=one, CODE_VALUES=False,
                                                      num_warps=warps)
                shaped()
                same = torch.equal(codes_old, codes_new) and torch.equal(scales_old, scales_new)
                timed(f"mx_rows_fp32_{'one' if one else 'two'}_{block}_w{warps}", shaped, m, out_bytes,
                      same_as_library=same)

                def shaped_cvt():
                    aq.act_quant_mx_rows_kernel[(m,)](x, codes_old, scales_old, k, x.stride(0), codes_old.stride(0),
                                                      BLOCK_K=block, ONE_PASS=one, CODE_VALUES=False,
                                                      CVT_E4M3=True, num_warps=warps)
                shaped_cvt()
                same = torch.equal(codes_old, codes_new) and torch.equal(scales_old, scales_new)
                timed(f"mx_rows_fp32_{'one' if one else 'two'}_{block}_w{warps}_cvt", shaped_cvt, m, out_bytes,
                      same_as_library=same)
        codes = torch.empty(m, k, dtype=torch.uint8, device="cuda")
        scales = torch.empty(m, 1, dtype=torch.float32, device="cuda")
        ref = None
        for warps in (4, 8, 16):
            for mode in ("f64cmp", "f32cmp", "cvt", "cvt2"):
                def run():
                    aq.act_quant_f32_kernel[(m, 1)](x, codes, scales, k, x.stride(0), codes.stride(0),
                                                    scales.stride(0), scales.stride(1), INT8=False, GROUP_K=k,
                                                    GROUPS=1, BLOCK_K=k, CODE_VALUES=False,
                                                    F32_COMPARE=mode == "f32cmp",
                                                    CVT_E4M3={"cvt": True, "cvt2": 2}.get(mode, False),
                                                    num_warps=warps)
                run()
                got = (codes.clone(), scales.clone())
                ref = ref or got
                same = torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
                timed(f"e4m3_token_w{warps}_{mode}", run, m, m * k + 4 * m, same_as_first=same)
        timed("e4m3_token_library", lambda: dense.triton_quantize_activation(x, fp8), m, m * k + 4 * m)
        # the library's launch with each rounding forced (the persistent kernel, refuted in sessions 29-30, is no
        # longer swept: dense.TOKEN_ROWS_PERSISTENT stays opt-in)
        for cvt in (False, True, 2):
            dense.CVT_E4M3 = cvt
            timed(f"e4m3_token_library{_CVT_TAG[cvt]}", lambda: dense.triton_quantize_activation(x, fp8), m,
                  m * k + 4 * m)
        dense.CVT_E4M3 = None  # the library's rule again
        # NVFP4 activations (e2m1, e4m3 per 16, fp32 global): a program per group vs 64 groups per program
        nv = ht.PRESETS["w4a4-nvfp4"].act
        gscale = dense.triton_global_scale(x, nv)
        groups = k // 16
        codes = torch.empty(m, k, dtype=torch.uint8, device="cuda")
        nv_scales = torch.empty(m, groups, dtype=torch.uint8, device="cuda")
        ref = None
        for per in (1, 64):
            def run():
                aq.act_quant_kernel[(m, -(-groups // per))](x, codes, nv_scales, gscale, k, x.stride(0),
                                                            codes.stride(0), nv_scales.stride(0), nv_scales.stride(1),
                                                            KIND=3, SCALE_KIND=2, GROUP_K=16, BLOCK_K=16,
                                                            SCALE_VALUES=False, GROUPS=per)
            run()
            got = (codes.clone(), nv_scales.clone())
            ref = ref or got
            timed(f"nvfp4_groups_per_program_{per}", run, m, m * k + m * groups,
                  same_as_first=torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]))
    # the MoE rows (Qwen3-30B-A3B at 4096 tokens, top 8: 32768 routed rows of K = 2048 / 768): per-token e4m3,
    # one row per program at 1-8 warps, each rounding (the persistent kernel is no longer swept, as above)
    for m, kk in ((32768, 2048), (32768, 768)):
        x = torch.randn(m, kk, device="cuda", generator=g).to(torch.bfloat16)
        block = triton.next_power_of_2(kk)
        codes = torch.empty(m, kk, dtype=torch.uint8, device="cuda")
        scales = torch.empty(m, 1, dtype=torch.float32, device="cuda")
        out_bytes = m * kk + 4 * m
        timed("moe_e4m3_token_library", lambda: dense.triton_quantize_activation(x, fp8), m, out_bytes, kk)
        ref = None
        for cvt in (False, True, 2):
            for warps in (1, 2, 4, 8):
                def run():
                    aq.act_quant_f32_kernel[(m, 1)](x, codes, scales, kk, x.stride(0), codes.stride(0),
                                                    scales.stride(0), scales.stride(1), INT8=False, GROUP_K=kk,
                                                    GROUPS=1, BLOCK_K=block, CODE_VALUES=False, CVT_E4M3=cvt,
                                                    num_warps=warps)
                run()
                got = (codes.clone(), scales.clone())
                ref = ref or got
                timed(f"moe_e4m3_token_w{warps}{_CVT_TAG[cvt]}", run, m, out_bytes, kk,
                      same_as_first=torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]))
    if out_path:
        Path(out_path).write_text(json.dumps({"copy_gbps": copy_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
