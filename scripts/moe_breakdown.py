"""Where an MoE grouped GEMM's time goes, kernel by kernel (issue 11), on the GPU.

For each case (scheme, expert shape, tokens) the table's ``auto`` call -- and, with ``--families``, each named
family's fastest candidate for that call (timed like the tuner) -- runs under ``torch.profiler``: every CUDA kernel
the call launches, its mean µs per call, and the sum, beside the call's CUDA-graph time (L2 flushed, as the
benchmark times it) and the stream floor of the routed experts' bytes.  Tells a slow GEMM from slow passes around
it (activation quantizer, widening, row scales, routing).  JSON to ``--out``."""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import humming_triton as ht  # noqa: E402
from humming_triton.dispatch import call_for, last_plan  # noqa: E402
from humming_triton.kernels import families  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grouped_probe import routed  # noqa: E402

SHAPES = {"qwen3_gate_up": (128, 8, 1536, 2048), "qwen3_down": (128, 8, 2048, 768),
          "mixtral_gate_up": (8, 2, 28672, 4096), "mixtral_down": (8, 2, 4096, 14336),
          # one expert holding all 128 of Qwen3's: the same bytes and tiles as 16 rows on each of 128 experts (256
          # tokens), without a group change between a CTA's tiles -- what the per-group switch costs
          "flat_qwen3_down": (1, 1, 128 * 2048, 768), "flat_qwen3_gate_up": (1, 1, 128 * 1536, 2048)}
DEFAULT_CASES = ("w4a8-mxfp4:qwen3_gate_up:4096,w4a8-mxfp4:qwen3_down:256,mxfp4:qwen3_down:256,"
                 "mxfp4:flat_qwen3_down:16,w4a16:qwen3_down:256,w4a16:flat_qwen3_down:16,"
                 "w4a16:qwen3_gate_up:256,w4a16:flat_qwen3_gate_up:16,mxfp4:mixtral_gate_up:64")


def kernel_times(fn, calls: int = 10) -> dict[str, float]:
    """Mean µs per call of each CUDA kernel ``fn`` launches (profiled over ``calls`` calls, L2 flushed between)."""
    from benchmarks.timing import _flush
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            _flush()
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA or "FillFunctor<unsigned char>" in ev.name:
            continue  # the L2 flush's zero_() of its uint8 buffer
        us = getattr(ev, "device_time_total", None)
        per[ev.name[:140]] += (ev.cuda_time_total if us is None else us) / calls
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def fastest(fam, call, run, ref):
    """The family's fastest candidate for this call (timed as the tuner times them), or None."""
    from benchmarks.timing import time_configs
    configs = {c.describe(): c for c in fam.candidates(call)}
    timed, _ = time_configs(list(configs.values()), run, ref)
    return configs[timed[0][1]] if timed else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="'scheme:shape:tokens' joined by ','")
    ap.add_argument("--families", default="", help="comma list of families to profile beside auto")
    ap.add_argument("--out", default=None)
    ap.add_argument("--once", action="store_true", help="each case's auto call once, nothing timed (for ncu)")
    a = ap.parse_args()
    from benchmarks.floor import StreamFloor
    from benchmarks.timing import time_gpu
    floor = StreamFloor()
    rows = []
    for item in a.cases.split(","):
        scheme, shape, tokens = item.split(":")
        e, topk, n, k = SHAPES[shape]
        qw, xs, offsets, counts = routed(e, topk, n, k, int(tokens), scheme)
        active = int((counts > 0).sum())
        f_us = floor.us(qw.nbytes() * active // e)
        runs = {"auto": lambda: ht.grouped_linear(xs, qw, offsets)}
        runs["auto"]()
        plans = {"auto": last_plan("grouped_linear")}
        if a.once:
            torch.cuda.synchronize()
            print(f"{scheme} {shape} tokens {tokens}: {plans['auto']}", flush=True)
            continue
        ref = ht.reference_grouped_linear(xs, qw, offsets, out_dtype=torch.float32)
        call = call_for("grouped_linear", xs, qw)
        out = torch.empty(xs.shape[0], n, dtype=xs.dtype, device="cuda")
        for name in filter(None, a.families.split(",")):
            fam = families.get(name)
            why = fam.reason(call)
            if why:
                print(f"  {name}: cannot run ({why})", flush=True)
                continue
            cfg = fastest(fam, call, lambda c, fam=fam: fam.run(xs, offsets, qw, None, xs.dtype, c, out), ref)
            if cfg is None:
                print(f"  {name}: no candidate ran", flush=True)
                continue
            runs[name] = (lambda cfg=cfg, fam=fam: fam.run(xs, offsets, qw, None, xs.dtype, cfg, out))
            plans[name] = cfg.describe()
        for name, fn in runs.items():
            fn()
            us = time_gpu(fn, budget_s=0.1)["us"]
            kernels = kernel_times(fn)
            row = {"scheme": scheme, "shape": shape, "tokens": int(tokens), "rows": int(xs.shape[0]),
                   "active_experts": active, "path": name, "plan": plans[name], "graph_us": round(us, 2),
                   "kernels_us": {kk: round(v, 2) for kk, v in kernels.items()},
                   "kernel_sum_us": round(sum(kernels.values()), 2), "floor_us": round(f_us, 2)}
            rows.append(row)
            print(f"{scheme:11s} {shape:16s} tokens {tokens:>5s} {name:26s} graph {us:8.1f} us  kernels "
                  f"{row['kernel_sum_us']:8.1f}  floor {f_us:6.1f}  ({plans[name]})", flush=True)
            for kk, v in kernels.items():
                print(f"      {v:8.1f} us  {kk}", flush=True)
        del qw, xs, ref
        torch.cuda.empty_cache()
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "floor": floor.summary()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
