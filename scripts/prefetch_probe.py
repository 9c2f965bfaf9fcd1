"""Same-run A/B of the native decode kernels' L2 prefetch (``decode_mma.cu`` Params.l2_prefetch), on the GPU.

For each case -- the grouped decode kernel (``mma_decode_grouped``) at Qwen3-30B-A3B / Mixtral-8x7B expert shapes
and 16 / 64 / 256 tokens, routed as the benchmark routes, and the dense one (``mma_decode``) at the decode suite's
shapes -- every candidate config the tuner would time is timed at each prefetch depth (chunks of each warp's
range prefetched when its tile starts; 0 = today's kernel), the depths interleaved per case so that they share
the machine's state.  Reports the best config per depth, its µs and % of the stream floor.  JSON to argv[1]."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import humming_triton as ht  # noqa: E402
from cutlass_ext.native import library  # noqa: E402
from humming_triton.dispatch import call_for  # noqa: E402
from humming_triton.kernels import families  # noqa: E402
from grouped_probe import routed  # noqa: E402

DEPTHS = (0, 8, 32)
GROUPED = [("qwen3_gate_up", 128, 8, 1536, 2048, t) for t in (16, 64, 256)] + \
          [("qwen3_down", 128, 8, 2048, 768, t) for t in (16, 64, 256)] + \
          [("mixtral_gate_up", 8, 2, 28672, 4096, 16), ("mixtral_down", 8, 2, 4096, 14336, 16)]
DENSE = [(8192, 8192, 1), (8192, 8192, 16), (28672, 4096, 16), (4096, 14336, 16)]


def main(out_path: str | None) -> None:
    from benchmarks.floor import StreamFloor
    from benchmarks.timing import time_configs
    lib = library()
    if not hasattr(lib, "ht_decode_set_l2_prefetch"):
        raise SystemExit("this native library has no L2 prefetch knob (rebuild it)")
    floor = StreamFloor()
    rows = []

    def case(name, fam_name, qw, x, offsets, active_bytes):
        fam = families.get(fam_name)
        call = call_for("grouped_linear" if offsets is not None else "quant_linear", x, qw)
        configs = fam.candidates(call)
        if offsets is not None:
            ref = ht.reference_grouped_linear(x, qw, offsets, out_dtype=torch.float32)
            out = torch.empty(x.shape[0], qw.N, dtype=x.dtype, device="cuda")
            run = lambda cfg: fam.run(x, offsets, qw, None, x.dtype, cfg, out)  # noqa: E731
        else:
            ref = ht.reference_linear(x, qw, out_dtype=torch.float32)
            run = lambda cfg: fam.run(x, x, qw, None, x.dtype, cfg, None)  # noqa: E731
        f_us = floor.us(active_bytes)
        row = {"case": name, "rows": int(x.shape[0]), "floor_us": round(f_us, 2), "depths": {}}
        for depth in DEPTHS:
            lib.ht_decode_set_l2_prefetch(depth)
            timed, failed = time_configs(configs, run, ref)
            best = timed[0]
            row["depths"][depth] = {"us": round(best[0], 2), "config": best[1], "rel_err": best[2],
                                    "pct_floor": round(100 * f_us / best[0], 1), "failed": len(failed),
                                    "top": [[round(t, 2), d] for t, d, _ in timed[:4]]}
        lib.ht_decode_set_l2_prefetch(0)
        base = row["depths"][0]["us"]
        print(f"{name:34s} " + "  ".join(f"pf{d}: {v['us']:7.1f} us ({base / v['us']:.2f}x, {v['pct_floor']:3.0f}% "
                                          f"floor, {v['config']})" for d, v in row["depths"].items()), flush=True)
        rows.append(row)

    g = torch.Generator(device="cuda").manual_seed(1)
    for n, k, m in DENSE:
        qw = ht.quantize_weight(torch.randn(n, k, device="cuda", generator=g) * 0.02, "w4a16")
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        case(f"dense w4a16 {n}x{k} M={m}", "mma_decode", qw, x, None, qw.nbytes())
        del qw
    for name, e, topk, n, k, tokens in GROUPED:
        qw, xs, offsets, counts = routed(e, topk, n, k, tokens, "w4a16")
        active = int((counts > 0).sum())
        case(f"{name} w4a16 tokens {tokens}", "mma_decode_grouped", qw, xs, offsets, qw.nbytes() * active // e)
        del qw, xs
        torch.cuda.empty_cache()
    if out_path:
        Path(out_path).write_text(json.dumps({"depths": DEPTHS, "rows": rows, "floor": floor.summary()}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
