"""The native kernels on the GPU: a few launches to profile (``ncu ... python3 scripts/native_probe.py``), or
``--sweep``: every config of a native family (``--family``: ``mma_decode``, the decode GEMM, at the decode
shapes; ``cutlass_mixed``, the sm_90a CUTLASS mixed-input GEMMs, at the headline shapes and mid / prefill M)
timed like the benchmark (CUDA-graph replay, L2 flushed, median), beside the table's ``auto`` choice and the
Triton stream floor of the same weight bytes.  Prints one line per (shape, M) and writes JSON with ``--out``."""
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
          ("w8a16", 8192, 8192), ("w4a16-asym", 8192, 8192), ("mxfp4", 8192, 8192), ("nvfp4", 8192, 8192),
          ("w8a16-fp8", 8192, 8192, torch.float16)]
# the quantized-activation schemes on their codes (mma_decode_act): the headline's activation-quantized rows
ACT_SHAPES = [("w8a8-fp8", 8192, 8192), ("w8a8-int8", 8192, 8192), ("w4a8-fp8", 8192, 8192),
              ("w4a8-int8", 8192, 8192), ("w4a8-mxfp4", 8192, 8192)]
# (scheme, N, K[, activation dtype]): the last two rows are diagnostics of the int4 group-scale path -- fp16
# activations (fp16 scales multiply in fp16) and int4 with channel scales (exact convert, no scale in the mainloop)
CUTLASS_SHAPES = [("w4a16", 8192, 8192), ("w4a16", 4096, 14336), ("w8a16", 8192, 8192), ("w4a16-asym", 8192, 8192),
                  ("w8a16-fp8", 8192, 8192), ("w4a16", 8192, 8192, torch.float16),
                  ("weight=int4,scale=fp16:channel", 8192, 8192)]
# the int4 bf16-scale twins (formats 10 / 11): the w4a16 layer shapes of the headline and decode suites
INT4_BF16S_SHAPES = [("w4a16", 8192, 8192), ("w4a16", 4096, 14336), ("w4a16", 14336, 4096), ("w4a16", 28672, 4096)]
FAMILY_SHAPES = {"mma_decode": SHAPES, "mma_decode_act": ACT_SHAPES, "cutlass_mixed": CUTLASS_SHAPES,
                 "cutlass_mixed_bf16s": INT4_BF16S_SHAPES, "cutlass_mixed_shuffled": INT4_BF16S_SHAPES}
DECODE_FAMILIES = ("mma_decode", "mma_decode_act")


def _case(scheme, n, k, m, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(0)
    qw = ht.quantize_weight(torch.randn(n, k, device="cuda", generator=g) * 0.02, scheme)
    x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    return qw, x


ODD = {"mma_decode": [("w8a16", 37, 208, 1), ("nvfp4", 24, 208, 9), ("w4a16-asym", 100, 1280, 9),
                      ("mxfp4", 40, 224, 16), ("w4a16", 8200, 4224, 3), ("w8a16-fp8", 72, 400, 5, torch.float16)],
       "mma_decode_act": [("w8a8-fp8", 37, 208, 1), ("w8a8-int8", 100, 1280, 9), ("w4a8-fp8", 24, 256, 16),
                          ("w4a8-mxfp4", 40, 224, 3), ("w4a8-int8", 8200, 4224, 7)],
       "cutlass_mixed": [("w4a16", 200, 1024, 7), ("w4a16-asym", 72, 384, 33), ("w8a16", 8200, 4224, 300),
                         ("w8a16-fp8", 136, 256, 17), ("weight=int4,scale=fp16:channel", 8, 256, 1),
                         ("w4a16", 200, 1024, 7, torch.float16), ("w8a16-fp8", 136, 256, 17, torch.float16),
                         ("weight=int4,scale=fp16:channel", 72, 384, 33, torch.float16)],
       "cutlass_mixed_shuffled": [("w4a16", 208, 1024, 7), ("w4a16", 8208, 4224, 300), ("w4a16", 16, 256, 1)]}
ODD["cutlass_mixed_bf16s"] = ODD["cutlass_mixed_shuffled"]


def odd_shapes(family: str = "mma_decode") -> None:
    """Tails under compute-sanitizer: partial weight and token tiles, K not a multiple of the K tile, every code
    kind of the family, every config, checked against the reference."""
    fam = families.get(family)
    for scheme, n, k, m, *dtype in ODD[family]:
        qw, x = _case(scheme, n, k, m, *dtype)
        ref = ht.reference_linear(x, qw, out_dtype=torch.float32)
        call = Call("quant_linear", qw.scheme, x.dtype, m, n, k)
        for cfg in fam.candidates(call):
            out = torch.full((m, n), float("nan"), dtype=x.dtype, device="cuda")
            y = fam.run(x, x, qw, None, x.dtype, cfg, out)
            err = float((y.float() - ref).norm() / ref.norm())
            assert err < 1e-2, (scheme, n, k, m, cfg.describe(), err)
    torch.cuda.synchronize()
    print(f"odd shapes: every {family} config matches the reference")


def profile(launches: str | None = None) -> None:
    """Launches for ncu, one each.  Default: w4a16, MXFP4 and NVFP4 at M = 1 with the table's config (8 warps on K
    x 2 tiles, one chunk ahead); w4a16 at M = 16 with 4 and with 8 warps on K (one tile per CTA).  ``launches``:
    'scheme:M:kw,tw,unroll' joined by ';' (8192² each)."""
    fam = families.get("mma_decode")
    cfg = lambda kw, tw, u=1: KernelConfig("mma_decode", 16, 16 * tw, 64, kw, 8, kw * tw, u)  # noqa: E731
    todo = [("w4a16", 1, cfg(8, 2)), ("mxfp4", 1, cfg(8, 2)), ("nvfp4", 1, cfg(8, 2)),
            ("w4a16", 16, cfg(4, 1)), ("w4a16", 16, cfg(8, 1))]
    if launches:
        todo = [(sc, int(m), cfg(*map(int, c.split(",")))) for sc, m, c in (x.split(":") for x in launches.split(";"))]
    for scheme, m, c in todo:
        qw, x = _case(scheme, 8192, 8192, m)
        out = torch.empty(m, 8192, dtype=x.dtype, device="cuda")
        fam.run(x, x, qw, None, x.dtype, c, out)
        torch.cuda.synchronize()


def sweep(ms, out_path, family: str = "mma_decode", schemes: list[str] | None = None) -> None:
    from benchmarks.floor import StreamFloor
    from benchmarks.timing import time_configs, time_gpu
    fam = families.get(family)
    floor = StreamFloor()
    rows = []
    for scheme, n, k, *dtype in FAMILY_SHAPES[family]:
        if schemes and (scheme not in schemes or dtype):  # a subset: the bf16 rows of these schemes
            continue
        qw, x1 = _case(scheme, n, k, max(ms), *dtype)
        wbytes = qw.nbytes()
        f_us = floor.us(wbytes)
        for m in ms:
            x = x1[:m].contiguous()
            ref = ht.reference_linear(x, qw, out_dtype=torch.float32)
            call = Call("quant_linear", qw.scheme, x.dtype, m, n, k)
            out = torch.empty(m, n, dtype=x.dtype, device="cuda")
            run = lambda cfg: fam.run(x, x, qw, None, x.dtype, cfg, out)  # noqa: E731
            timed, failed = time_configs(fam.candidates(call), run, ref)
            if not timed:
                print(f"{scheme} {n}x{k} M={m}: no config ran: {failed}", flush=True)
                continue
            auto = lambda: ht.quant_linear(x, qw)  # noqa: E731
            auto()
            auto_us = time_gpu(auto, budget_s=0.05)["us"]
            best = timed[0]
            row = {"scheme": scheme, "dtype": str(x.dtype), "n": n, "k": k, "m": m, "best_us": best[0], "best": best[1], "rel_err": best[2],
                   "auto_us": auto_us, "auto": last_plan(), "floor_us": f_us, "weight_bytes": wbytes,
                   "all": [[round(u, 2), d, e] for u, d, e in timed], "failed": failed}
            rows.append(row)
            print(f"{scheme:11s} {str(x.dtype)[6:]:8s} {n:5d}x{k:<5d} M={m:4d}  {family} {best[0]:7.1f} us ({best[1]}, err {best[2]:.1e})  "
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
    ap.add_argument("--family", default="mma_decode", choices=sorted(FAMILY_SHAPES))
    ap.add_argument("--m", default=None, help="token counts (default: 1,4,16 for mma_decode, 16..4096 for cutlass)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--schemes", default=None, help="comma list: sweep only these schemes' bf16 shapes")
    ap.add_argument("--launches", default=None, help="profile these: 'scheme:M:kw,tw,unroll' joined by ';'")
    a = ap.parse_args()
    ms = a.m or ("1,4,16" if a.family in DECODE_FAMILIES else "16,64,256,1024,4096")
    if a.odd:
        odd_shapes(a.family)
    elif a.sweep:
        sweep([int(v) for v in ms.split(",")], a.out, a.family, a.schemes.split(",") if a.schemes else None)
    else:
        profile(a.launches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
