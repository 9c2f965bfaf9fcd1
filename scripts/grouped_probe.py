"""The native grouped decode kernel (``mma_decode_grouped``) at the MoE suite's mid-token rows, on the GPU.

``--sweep``: every (K warps, tiles per CTA, chunks in flight, rows per pass) the kernel builds -- a wider grid than
the tuner's candidates -- at Qwen3-30B-A3B and Mixtral-8x7B expert shapes, routed as the benchmark routes
(uniform random top-k), each checked against the reference and timed like the benchmark (CUDA-graph replay, L2
flushed, median), beside the table's ``auto`` and the Triton stream floor of the bytes the routed experts hold.
``--grids experts,passes``: every config on each grid (``decode_mma.run_grouped``'s grid: the base family and its
``_passes`` twin), interleaved case by case in one process -- a same-run A/B.  Without ``--sweep``: one launch of
each ``--launches`` config, for ncu.  JSON with ``--out``."""
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

# (name, experts, top-k, N, K, tokens)
CASES = [("qwen3_gate_up", 128, 8, 1536, 2048, 16), ("qwen3_gate_up", 128, 8, 1536, 2048, 64),
         ("qwen3_down", 128, 8, 2048, 768, 16), ("qwen3_down", 128, 8, 2048, 768, 64),
         ("mixtral_gate_up", 8, 2, 28672, 4096, 16), ("mixtral_down", 8, 2, 4096, 14336, 16),
         # 256 tokens (2048 routed rows, 16 per expert): CUTLASS's rows today, at 0.57-0.62x Humming (session 30)
         ("qwen3_gate_up", 128, 8, 1536, 2048, 256), ("qwen3_down", 128, 8, 2048, 768, 256)]
GRID = [(kw, tw, u) for kw in (1, 2, 4, 8) for tw in (1, 2, 4) for u in (1, 2, 3, 4) if kw * tw <= 16]


def routed(e: int, topk: int, n: int, k: int, tokens: int, scheme: str, seed: int = 0):
    """Expert weights and rows sorted by expert, routed uniformly at random (benchmarks/methods.py's routing)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    qw = ht.quantize_weight(torch.randn(e, n, k, device="cuda", generator=g) * 0.02, scheme)
    x = torch.randn(tokens, k, device="cuda", generator=g).to(torch.bfloat16)
    flat = torch.randn(tokens, e, device="cuda", generator=g).topk(topk, dim=1).indices.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    xs = x[order // topk].contiguous()
    counts = torch.bincount(flat, minlength=e)
    offsets = torch.zeros(e + 1, dtype=torch.int32, device="cuda")
    offsets[1:] = torch.cumsum(counts, 0).to(torch.int32)
    return qw, xs, offsets, counts


def _cfg(bm: int, kw: int, tw: int, u: int, family: str = "mma_decode_grouped") -> KernelConfig:
    return KernelConfig(family, bm, 16 * tw, 64, kw, 8, kw * tw, u)


def sweep(out_path: str | None, scheme: str, grids: list[str], token_counts: set[int]) -> None:
    from benchmarks.floor import StreamFloor
    from benchmarks.timing import time_configs, time_gpu
    # activation-quantized schemes (w4a8-mxfp4, ...) on the same kernel with code values: the _act family
    base = "mma_decode_grouped_act" if ht.QuantScheme.parse(scheme).act else "mma_decode_grouped"
    fams = {g: families.get(base if g == "experts" else f"{base}_{g}") for g in grids}
    floor = StreamFloor()
    rows = []
    for name, e, topk, n, k, tokens in [c for c in CASES if c[-1] in token_counts]:
        qw, xs, offsets, counts = routed(e, topk, n, k, tokens, scheme)
        active = int((counts > 0).sum())
        wbytes = qw.nbytes() * active // e  # the routed experts' bytes: what the kernel must stream
        f_us = floor.us(wbytes)
        ref = ht.reference_grouped_linear(xs, qw, offsets, out_dtype=torch.float32)
        out = torch.empty(xs.shape[0], n, dtype=xs.dtype, device="cuda")
        auto = lambda: ht.grouped_linear(xs, qw, offsets)  # noqa: E731
        auto()
        auto_us = time_gpu(auto, budget_s=0.05)["us"]
        for grid, fam in fams.items():
            configs = [_cfg(bm, kw, tw, u, fam.name) for bm in (8, 16) for kw, tw, u in GRID]
            timed, failed = time_configs(configs, lambda cfg: fam.run(xs, offsets, qw, None, xs.dtype, cfg, out),
                                         ref)
            row = {"case": name, "scheme": scheme, "grid": grid, "family": fam.name, "experts": e, "topk": topk,
                   "n": n, "k": k, "tokens": tokens, "rows": int(xs.shape[0]), "active_experts": active,
                   "auto_us": auto_us, "auto": last_plan("grouped_linear"), "floor_us": f_us, "routed_bytes": wbytes,
                   "all": [[round(t, 2), d, r] for t, d, r in timed], "failed": failed}
            rows.append(row)
            best = timed[0]
            print(f"{name:16s} {scheme} tokens {tokens:3d} ({active:3d} experts) {grid:7s} best {best[0]:7.1f} us "
                  f"({best[1]}, err {best[2]:.1e})  auto {auto_us:7.1f} us ({row['auto']})  floor {f_us:6.1f} us "
                  f"-> {f_us / best[0] * 100:3.0f}% of floor", flush=True)
            for t, d, r in timed[1:6]:
                print(f"    {t:7.1f} us  {d}", flush=True)
        del qw, xs
        torch.cuda.empty_cache()
        if out_path:  # after every case: a run cut off by its time limit keeps what it measured
            Path(out_path).write_text(json.dumps({"rows": rows, "floor": floor.summary()}, indent=1))


def profile(launches: str, scheme: str) -> None:
    """One launch per 'case_index:bm,kw,tw,unroll' (joined by ';') of CASES, for ncu."""
    fam = families.get("mma_decode_grouped")
    for item in launches.split(";"):
        idx, c = item.split(":")
        name, e, topk, n, k, tokens = CASES[int(idx)]
        qw, xs, offsets, _ = routed(e, topk, n, k, tokens, scheme)
        out = torch.empty(xs.shape[0], n, dtype=xs.dtype, device="cuda")
        fam.run(xs, offsets, qw, None, xs.dtype, _cfg(*map(int, c.split(","))), out)
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--scheme", default="w4a16")
    ap.add_argument("--launches", default="0:8,1,4,1;1:8,1,4,1;3:8,1,4,1")
    ap.add_argument("--grids", default="experts", help="comma-separated: experts, passes (run_grouped's grid)")
    ap.add_argument("--tokens", default="16,64", help="comma-separated token counts of CASES to sweep")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.sweep:
        sweep(a.out, a.scheme, a.grids.split(","), {int(t) for t in a.tokens.split(",")})
    else:
        profile(a.launches, a.scheme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
