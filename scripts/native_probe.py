"""The native decode kernel on the GPU: a few launches to profile (``ncu ... python3 scripts/native_probe.py``), or
``--sweep``: every ``mma_decode`` config at the decode shapes, timed like the benchmark (CUDA-graph replay, L2
flushed, median), beside the Triton stream floor of the same weight bytes.  Prints one line per (shape, M) and
writes JSON with ``--out``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import humming_triton as ht  # noqa: E402
from humming_triton.calls import Call, KernelConfig  # noqa: E402
from humming_triton.dispatch import last_plan  # noqa: E402
from humming_triton.kernels import families  # noqa: E402

SHAPES = [("w4a16", 8192, 8192), ("w4a16", 4096, 14336), ("w4a16", 14336, 4096), ("w4a16", 28672, 4096),
          ("w8a16", 8192, 8192), ("w4a16-asym", 8192, 8192), ("mxfp4", 8192, 8192), ("nvfp4", 8192, 8192)]


def _case(scheme, n, k, m):
    g = torch.Generator(device="cuda").manual_seed(0)
    qw = ht.quantize_weight(torch.randn(n, k, device="cuda", generator=g) * 0.02, scheme)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    return qw, x


def odd_shapes() -> None:
    """Tails under compute-sanitizer: partial 16-row tiles, K not a multiple of 64, M = 9 (two token tiles), every
    code kind, checked against the reference."""
    fam = families.get("mma_decode")
    for scheme, n, k, m in [("w8a16", 37, 208, 1), ("nvfp4", 24, 208, 9), ("w4a16-asym", 100, 1280, 9),
                            ("mxfp4", 40, 224, 16), ("w4a16", 8200, 4224, 3)]:
        qw, x = _case(scheme, n, k, m)
        ref = ht.reference_linear(x, qw, out_dtype=torch.float32)
        call = Call("quant_linear", qw.scheme, x.dtype, m, n, k)
        for cfg in fam.candidates(call):
            out = torch.full((m, n), float("nan"), dtype=x.dtype, device="cuda")
            y = fam.run(x, x, qw, None, x.dtype, cfg, out)
            err = float((y.float() - ref).norm() / ref.norm())
            assert err < 1e-2, (scheme, n, k, m, cfg.describe(), err)
    torch.cuda.synchronize()
    print("odd shapes: every config matches the reference")


def profile() -> None:
    fam = families.get("mma_decode")
    for scheme, m, cfg in [("w4a16", 1, KernelConfig("mma_decode", 16, 16, 64, 8, 8, 8, 4)),
                           ("mxfp4", 1, KernelConfig("mma_decode", 16, 16, 64, 8, 8, 8, 4))]:
        qw, x = _case(scheme, 8192, 8192, m)
        out = torch.empty(m, 8192, dtype=x.dtype, device="cuda")
        for _ in range(4):
            fam.run(x, x, qw, None, x.dtype, cfg, out)
        torch.cuda.synchronize()


def sweep(ms, out_path) -> None:
    from benchmarks.floor import StreamFloor
    from benchmarks.timing import time_gpu
    fam = families.get("mma_decode")
    floor = StreamFloor()
    rows = []
    for scheme, n, k in SHAPES:
        qw, x1 = _case(scheme, n, k, 16)
        wbytes = qw.nbytes()
        f_us = floor.us(wbytes)
        for m in ms:
            x = x1[:m].contiguous()
            ref = ht.reference_linear(x, qw, out_dtype=torch.float32)
            call = Call("quant_linear", qw.scheme, x.dtype, m, n, k)
            out = torch.empty(m, n, dtype=x.dtype, device="cuda")
            timed = []
            for cfg in fam.candidates(call):
                fn = lambda cfg=cfg: fam.run(x, x, qw, None, x.dtype, cfg, out)  # noqa: E731
                y = fn()
                err = float((y.float() - ref).norm() / ref.norm())
                us = time_gpu(fn, budget_s=0.03, min_reps=20)["us"]
                timed.append((us, cfg.describe(), err))
            auto = lambda: ht.quant_linear(x, qw)  # noqa: E731
            auto()
            auto_us = time_gpu(auto, budget_s=0.05)["us"]
            timed.sort()
            best = timed[0]
            row = {"scheme": scheme, "n": n, "k": k, "m": m, "best_us": best[0], "best": best[1], "rel_err": best[2],
                   "auto_us": auto_us, "auto": last_plan(), "floor_us": f_us, "weight_bytes": wbytes,
                   "all": [[round(u, 2), d, e] for u, d, e in timed]}
            rows.append(row)
            print(f"{scheme:11s} {n:5d}x{k:<5d} M={m:2d}  native {best[0]:6.1f} us ({best[1]}, err {best[2]:.1e})  "
                  f"table's auto {auto_us:6.1f} us ({row['auto']})  floor {f_us:6.1f} us  "
                  f"-> {f_us / best[0] * 100:4.0f}% of floor, {wbytes / best[0] / 1e3:5.0f} GB/s", flush=True)
        del qw, x1
        torch.cuda.empty_cache()
    if out_path:
        Path(out_path).write_text(json.dumps({"rows": rows, "floor": floor.summary()}, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--odd", action="store_true", help="the tail shapes (for compute-sanitizer)")
    ap.add_argument("--m", default="1,4,16")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.odd:
        odd_shapes()
    elif a.sweep:
        sweep([int(v) for v in a.m.split(",")], a.out)
    else:
        profile()
    return 0


if __name__ == "__main__":
    sys.exit(main())
