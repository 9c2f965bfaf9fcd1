"""Where the time of an fp8 GEMM with per-token activations goes, on the GPU (issue 12).

At 8192 x 8192 and M = 16 / 256 / 4096, timed like the benchmark (CUDA-graph replay, L2 flushed, median): our
e4m3 activation quantizer alone, the MXFP4 e4m3-rows quantizer alone, ``torch._scaled_mm`` row-wise (what the
``scaled_mm`` families call) and tensor-wise (one scale each side, bf16 out, then the row and column scales as one
multiply of the bf16 output), all with fast accumulation off.  The question: is the row-wise GEMM itself slower
than cuBLASLt's tensor-wise one by more than the extra pass over y would cost?  JSON to argv[1]."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import humming_triton as ht  # noqa: E402
from humming_triton.kernels import dense  # noqa: E402


def main(out_path: str | None) -> None:
    from benchmarks.timing import time_gpu
    torch.backends.cuda.matmul.allow_tf32 = False
    n = k = 8192
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02)
    wq = (w / w.abs().amax(1, keepdim=True) * 448).to(torch.float8_e4m3fn)
    w_scales = (w.abs().amax(1) / 448).reshape(1, n).float()
    spec = ht.PRESETS["w8a8-fp8"].act
    mx = ht.PRESETS["w4a4-mxfp4"].act
    one = torch.ones((), device="cuda")
    rows = []
    for m in (16, 256, 4096):
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        q = dense.triton_quantize_activation(x, spec)
        a, a_scales = q.codes.view(torch.float8_e4m3fn), q.scales
        ref = (a.float() * a_scales) @ (wq.float() * w_scales).t()  # fp32 (TF32 off): ~1e-6, far below fp8's error

        def rowwise():
            return torch._scaled_mm(a, wq.t(), scale_a=a_scales, scale_b=w_scales, out_dtype=torch.bfloat16,
                                    use_fast_accum=False)

        def tensorwise():
            return torch._scaled_mm(a, wq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                    use_fast_accum=False)

        def tensorwise_scaled():
            return tensorwise().mul_(a_scales).mul_(w_scales)

        cases = {"act_quant_e4m3": lambda: dense.triton_quantize_activation(x, spec),
                 "act_quant_mx_rows": lambda: dense.triton_quantize_mx_rows(x, mx),
                 "scaled_mm_rowwise": rowwise, "scaled_mm_tensorwise": tensorwise,
                 "tensorwise_then_scales": tensorwise_scaled}
        row = {"m": m, "n": n, "k": k}
        for name, fn in cases.items():
            fn()
            row[name + "_us"] = round(time_gpu(fn, budget_s=0.1)["us"], 2)
        for name, fn in (("rowwise", rowwise), ("tensorwise_then_scales", tensorwise_scaled)):
            row[name + "_rel_err"] = float((fn().float() - ref).norm() / ref.norm())
        row["rowwise_tflops"] = round(2 * m * n * k / row["scaled_mm_rowwise_us"] / 1e6, 1)
        row["tensorwise_tflops"] = round(2 * m * n * k / row["scaled_mm_tensorwise_us"] / 1e6, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if out_path:
        Path(out_path).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
