"""Autotune sweep: ``python -m humming_triton.tune --preset w4a16 --shapes 8192x8192 --m 1,16,256``.

For each (preset, N x K, M bucket) it times every candidate launch configuration of every kernel family on the
current GPU (as the benchmark does: CUDA-graph replay, L2 flushed between reps, median), checks the winner against the
reference, and merges the winners into ``autotune_configs/<device-slug>.json``.  Serving never tunes: the
dense dispatcher only reads that file (configs.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from .kernels import configs
from .kernels.configs import DenseConfig

C = DenseConfig


def candidates(m: int) -> list[DenseConfig]:
    """A small, deliberately chosen search space per M regime (each entry costs one compilation)."""
    if m <= 8:
        bm = configs.m_bucket(m)
        out = [C("gemv", bm, bn, bk, sk, num_warps=w, num_stages=1) for bn, bk, sk, w in
               [(8, 1024, 1, 4), (16, 512, 1, 4), (8, 256, 4, 4)] if bm * bn * bk <= 32768]
        if bm == 1:  # the word-major GEMV, one activation row (num_stages 2 = register prefetch)
            out += [C("gemv_words", 1, bn, bk, sk, num_warps=w, num_stages=st) for bn, bk, sk, w, st in
                    [(4, 1024, 1, 4, 1), (4, 1024, 1, 4, 2), (8, 1024, 1, 4, 1), (8, 1024, 1, 4, 2), (2, 1024, 1, 4, 1),
                     (4, 512, 1, 4, 1), (4, 512, 1, 4, 2), (4, 2048, 1, 8, 1), (4, 1024, 2, 4, 1),
                     (4, 1024, 2, 4, 2), (8, 512, 2, 4, 2), (16, 512, 1, 8, 1)]]
        else:  # bm rows share each decoded tile; the K tile shrinks as rows grow (registers)
            bk = max(128, 1024 // bm)
            out += [C("gemv_words", bm, bn, k, sk, num_warps=w, num_stages=st) for bn, k, sk, w, st in
                    [(4, bk, 1, 4, 1), (4, bk, 1, 4, 2), (4, 2 * bk, 1, 4, 1), (2, 2 * bk, 1, 4, 1),
                     (8, bk, 1, 4, 1), (4, bk, 2, 4, 2), (4, 2 * bk, 1, 8, 1)]]
        out += [C("tiled", 16, 64, 128, 2, 8, 4, 4), C("tiled", 16, 64, 128, 1, 8, 4, 4)]
        return out
    if m <= 16:
        return [C("tiled", 16, bn, bk, sk, 8, w, st) for bn, bk, sk, w, st in
                [(64, 128, 1, 4, 4), (128, 128, 2, 4, 4), (32, 256, 4, 4, 3), (64, 128, 2, 4, 4), (128, 64, 4, 4, 4)]] + \
            [C("gemv_words", 16, 4, 128, 1, num_warps=4, num_stages=1), C("gemv_words", 8, 4, 256, 1, num_warps=4,
                                                                          num_stages=1)]
    if m <= 64:
        bm = 32 if m <= 32 else 64
        return [C("tiled", bm, bn, bk, sk, 8, w, st) for bn, bk, sk, w, st in
                [(64, 128, 1, 4, 4), (128, 64, 2, 4, 4), (64, 128, 2, 4, 4), (64, 128, 4, 4, 3), (128, 128, 1, 8, 3)]]
    if m <= 512:
        return [C("tiled", bm, bn, bk, sk, 8, w, st) for bm, bn, bk, sk, w, st in
                [(128, 128, 64, 1, 8, 4), (64, 128, 64, 1, 4, 4), (128, 64, 64, 1, 4, 4), (64, 64, 128, 1, 4, 4),
                 (64, 128, 64, 2, 4, 4)]] + [C("dequant_mm", 1, 32, 128)]
    return [C("tiled", bm, bn, bk, 1, 8, w, st) for bm, bn, bk, w, st in
            [(128, 128, 64, 8, 4), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (64, 256, 64, 8, 4)]] + \
        [C("dequant_mm", 1, 32, 128)]


def _time_us(fn) -> float:
    """µs per call the way the benchmark measures it (benchmarks/timing.py: CUDA-graph replay, L2 flushed):
    at M = 1 the host cost of a launch exceeds the kernel, and do_bench's events would time the launch."""
    try:
        from benchmarks.timing import time_gpu
    except ImportError:  # installed without the repository's benchmarks/: Triton's event timing
        import triton.testing
        return triton.testing.do_bench(fn, warmup=10, rep=40) * 1e3
    fn()
    return time_gpu(fn, budget_s=0.05, min_reps=15)["us"]


def tune_case(preset: str, n: int, k: int, m: int, dtype=torch.bfloat16, quiet: bool = False) -> dict:

    import humming_triton as ht
    from .kernels.dense import triton_linear

    g = torch.Generator().manual_seed(0)
    qw = ht.quantize_weight(torch.randn(n, k, generator=g) * 0.02, preset).to("cuda")
    x = torch.randn(m, k, generator=g).to(dtype).cuda()
    w_ref = ht.dequantize_weight(qw.to("cpu")).cuda()
    y_ref = x.float() @ w_ref.T
    results = []
    for cfg in candidates(m):
        cfg = DenseConfig(**{**asdict(cfg), "block_k": configs.fit_block_k(cfg.block_k, qw.scheme.group_k(k), k,
                                                                           qw.scheme.bits)})
        try:
            y = triton_linear(x, qw, config=cfg)
            err = ((y.float() - y_ref).norm() / y_ref.norm()).item()
            if not err < 1e-2:
                raise RuntimeError(f"wrong result (rel err {err:.3g})")
            us = _time_us(lambda: triton_linear(x, qw, config=cfg))
            results.append((us, cfg))
            if not quiet:
                print(f"  {preset} {n}x{k} M={m}: {cfg} -> {us:.1f} us", flush=True)
        except Exception as e:  # a config that does not compile or fit is simply not a candidate
            if not quiet:
                print(f"  {preset} {n}x{k} M={m}: {cfg} failed: {str(e).splitlines()[0][:200]}", flush=True)
    if not results:
        raise RuntimeError(f"no candidate config ran for {preset} {n}x{k} M={m}")
    us, best = min(results, key=lambda r: r[0])
    return {**asdict(best), "us": round(us, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", required=True, help="preset(s) to tune (repeatable)")
    ap.add_argument("--shapes", default="8192x8192", help="comma list of NxK")
    ap.add_argument("--m", default="1,16,64,256,1024,4096", help="comma list of M values")
    ap.add_argument("--out", default=None, help="JSON file (default autotune_configs/<device>.json)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("humming_triton.tune needs a CUDA GPU", file=sys.stderr)
        return 2
    from tqdm import tqdm

    from .kernels.dense import device_facts
    slug, _ = device_facts(torch.device("cuda"))
    out = Path(args.out) if args.out else configs.CONFIG_DIR / f"{slug}.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data.setdefault("device", torch.cuda.get_device_name())
    dense = data.setdefault("dense", {})
    cases = [(p, *map(int, s.split("x")), int(m)) for p in args.preset for s in args.shapes.split(",")
             for m in args.m.split(",")]
    for preset, n, k, m in tqdm(cases, desc="tuning", file=sys.stdout):
        best = tune_case(preset, n, k, m)
        dense[configs.tuned_key(m, n, k, preset)] = best
        print(f"{preset} {n}x{k} M={m}: best {best}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
