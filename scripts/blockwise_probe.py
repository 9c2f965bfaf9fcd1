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


def main() -> int:
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "rows": []}
    st = F.ScalingType
    for m, (n, k), rhs, dtype, bias in itertools.product((1, 4, 6, 17, 256), ((1024, 2048),), ("128x128", "1x128"),
                                                          (torch.bfloat16, torch.float32, torch.float16), (False, True)):
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.rand(k // 128, m, device="cuda").t()
        sb = (torch.rand(n // 128, k // 128, device="cuda") if rhs == "128x128" else
              torch.rand(k // 128, n, device="cuda").contiguous().t()).t()
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
        sb = (torch.rand(n // 128, k // 128, device="cuda") if rhs == "128x128" else
              torch.rand(k // 128, n, device="cuda").contiguous().t()).t()
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
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
