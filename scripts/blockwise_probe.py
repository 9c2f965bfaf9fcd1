"""Which block-scaled fp8 recipes torch's F.scaled_mm takes on this GPU (shapes, output types, bias), and how
fast: the facts behind the ``scaled_mm_block`` family's reason and layout (its docstring).  GPU only."""
import itertools
import json
import sys

import torch
import torch.nn.functional as F


def _time(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _scale_b(rhs, n, k):
    """128x128: [K/128, N/128], the transpose of row-major [N/128, K/128]; 1x128: [N, K/128] column-major."""
    if rhs == "128x128":
        return torch.rand(n // 128, k // 128, device="cuda").t()
    return torch.rand(k // 128, n, device="cuda").t()


def _time_graph(fn, reps=10):
    """µs per call of ``fn`` replayed from a CUDA graph (no host launch cost in the time)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * reps)


def _sweep_quantizer(out):
    """The fp32 quantizer's launch shapes (dense.ONE_PASS_ELEMENTS / TWO_PASS_BLOCK / GROUP_TILE), graph-timed."""
    import humming_triton as ht
    from humming_triton.kernels import dense
    from humming_triton.kernels.dense import triton_quantize_activation
    keep = (dense.ONE_PASS_ELEMENTS, dense.TWO_PASS_BLOCK, dense.GROUP_TILE)
    for act, m in itertools.product(("e4m3fn/fp32:token", "int8/fp32:token", "e4m3fn/fp32:g128"), (1, 16, 256, 4096)):
        spec = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={act}").act
        x = torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16)
        shapes = ([(16384, 4096, 1024), (8192, 4096, 1024), (1024, 1024, 1024), (1024, 2048, 1024), (1024, 4096, 1024)]
                  if "token" in act else [(16384, 4096, t) for t in (256, 512, 1024, 2048, 4096)])
        for shape in shapes:
            dense.ONE_PASS_ELEMENTS, dense.TWO_PASS_BLOCK, dense.GROUP_TILE = shape
            us = _time_graph(lambda: triton_quantize_activation(x, spec))
            out["rows"].append({"quantizer": act, "m": m, "one_pass/two_pass_block/group_tile": shape,
                                "us": round(us, 2)})
            print(out["rows"][-1], flush=True)
    dense.ONE_PASS_ELEMENTS, dense.TWO_PASS_BLOCK, dense.GROUP_TILE = keep
    for act, m, f32 in itertools.product(("e4m3fn/fp32:token", "int8/fp32:token", "e4m3fn/fp32:g128"), (16, 4096),
                                         (False, True)):  # the midpoint comparison in float64 or split fp32
        spec = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={act}").act
        x = torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16)
        dense.F32_COMPARE = f32
        us = _time_graph(lambda: triton_quantize_activation(x, spec))
        out["rows"].append({"quantizer": act, "m": m, "f32_compare": f32, "us": round(us, 2)})
        print(out["rows"][-1], flush=True)
    dense.F32_COMPARE = False


def _time_parts(out):
    """The steps of the activation-quantized paths at 8192^2, alone: our quantizer (per token, per 128), the
    int8 GEMM and its scale epilogue."""
    import humming_triton as ht
    from humming_triton.kernels.dense import triton_quantize_activation
    from humming_triton.kernels._scale_epilogue import scale_rows_cols_kernel
    for m in (256, 4096):
        x = torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16)
        for act in ("e4m3fn/fp32:token", "e4m3fn/fp32:g128", "int8/fp32:token"):
            spec = ht.QuantScheme.parse(f"weight=int8,scale=fp32:channel,act={act}").act
            us = _time_graph(lambda: triton_quantize_activation(x, spec))
            out["rows"].append({"part": f"quantize {act}", "m": m, "us": round(us, 1)})
        a = torch.randint(-127, 127, (m, 8192), device="cuda", dtype=torch.int8)
        w = torch.randint(-127, 127, (8192, 8192), device="cuda", dtype=torch.int8)
        out["rows"].append({"part": "torch._int_mm", "m": m, "us": round(_time_graph(lambda: torch._int_mm(a, w.t())), 1)})
        acc = torch._int_mm(a, w.t())
        xs, ws = torch.rand(m, device="cuda"), torch.rand(8192, device="cuda")
        y = torch.empty(m, 8192, device="cuda", dtype=torch.bfloat16)
        us = _time_graph(lambda: scale_rows_cols_kernel[(m // 32, 64)](acc, xs, ws, ws, y, m, 8192, 8192, 8192,
                                                                 HAS_BIAS=False, BLOCK_M=32, BLOCK_N=128))
        out["rows"].append({"part": "int8 scale epilogue", "m": m, "us": round(us, 1)})
        print(out["rows"][-5:], flush=True)


def main() -> int:
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "rows": []}
    st = F.ScalingType
    for m, (n, k), rhs, dtype, bias in itertools.product((1, 4, 6, 17, 256), ((1024, 2048),), ("128x128", "1x128"),
                                                          (torch.bfloat16, torch.float32, torch.float16), (False, True)):
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.rand(k // 128, m, device="cuda").t()
        sb = _scale_b(rhs, n, k)
        b = torch.randn(n, device="cuda").to(dtype) if bias else None
        row = {"m": m, "rhs": rhs, "out": str(dtype), "bias": bias}
        try:
            y = F.scaled_mm(a, w.t(), sa, st.BlockWise1x128, sb,
                            st.BlockWise128x128 if rhs == "128x128" else st.BlockWise1x128, bias=b,
                            output_dtype=dtype)
            ref = (a.double() * sa.double().repeat_interleave(128, 1)) @ \
                  (w.double() * (sb.t().double().repeat_interleave(128, 0).repeat_interleave(128, 1)
                                 if rhs == "128x128" else sb.t().double().repeat_interleave(128, 1))).t()
            if bias:
                ref = ref + b.double()
            row["rel_err"] = float((y.double() - ref).norm() / ref.norm())
            row["ok"] = True
        except Exception as e:  # the point of the probe: what is refused, and its message
            row["ok"] = False
            row["error"] = str(e).splitlines()[0][:200]
        out["rows"].append(row)
        print(row, flush=True)
    for m, rhs in itertools.product((16, 256, 4096), ("128x128", "1x128")):
        n = k = 8192
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.rand(k // 128, m, device="cuda").t()
        sb = _scale_b(rhs, n, k)
        rec = st.BlockWise128x128 if rhs == "128x128" else st.BlockWise1x128
        try:
            us = _time(lambda: F.scaled_mm(a, w.t(), sa, st.BlockWise1x128, sb, rec, output_dtype=torch.bfloat16))
            rw = _time(lambda: torch._scaled_mm(a, w.t(), scale_a=torch.rand(m, 1, device="cuda"),
                                                scale_b=torch.rand(1, n, device="cuda"), out_dtype=torch.bfloat16))
            row = {"time_m": m, "rhs": rhs, "us": round(us, 1), "rowwise_us": round(rw, 1)}
        except Exception as e:
            row = {"time_m": m, "rhs": rhs, "error": str(e).splitlines()[0][:200]}
        out["rows"].append(row)
        print(row, flush=True)
    _time_parts(out)
    _sweep_quantizer(out)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
