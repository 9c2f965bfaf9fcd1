"""Tensor / expert parallel on 2+ GPUs: ``NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 scripts/tp_check.py --out DIR``
(without CUDA it runs on CPU over gloo with the reference backend: the CPU test of the sharding semantics).

Every rank builds the same full weights (fixed seed), keeps its shard (``humming_triton.formats.shard``) and runs:
* a column-parallel QuantLinear (N-shards, outputs all-gathered) feeding a row-parallel one (K-shards of its input
  features, partial outputs all-reduced) -- the MLP pair of a TP transformer block;
* expert parallel grouped GEMM: a slice of the experts per rank, each rank computing the rows routed to its
  experts, the outputs summed across ranks.
Each result is checked against the one-GPU computation of the unsharded weights (rank 0, same inputs) and timed
(CUDA events, median of 50, collective included).  Rank 0 writes ``tp.json`` under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import humming_triton as ht  # noqa: E402
from humming_triton.formats.shard import shard  # noqa: E402


def _time(fn, reps=50):
    if not torch.cuda.is_available():
        return None
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def _rel(y, ref):
    return float((y.double() - ref.double()).norm() / ref.double().norm().clamp(min=1e-30))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scheme", default="w4a16")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=14336)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--moe-n", type=int, default=1536)
    ap.add_argument("--moe-k", type=int, default=2048)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = "cuda" if gpu else "cpu"
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    g = torch.Generator(device=dev).manual_seed(0)
    up = ht.quantize_weight(torch.randn(a.inter, a.hidden, device=dev, generator=g) * 0.02, a.scheme)
    down = ht.quantize_weight(torch.randn(a.hidden, a.inter, device=dev, generator=g) * 0.02, a.scheme)
    x = torch.randn(a.tokens, a.hidden, device=dev, generator=g).to(torch.bfloat16 if gpu else torch.float32)
    up_r, down_r = shard(up, "n", world, rank), shard(down, "k", world, rank)

    def mlp_tp():
        h = ht.quant_linear(x, up_r)  # this rank's slice of the intermediate features
        y = ht.quant_linear(h, down_r).float()  # partial sums over this rank's K-slice
        dist.all_reduce(y)
        return y

    ref = ht.quant_linear(ht.quant_linear(x, up), down).float()
    y = mlp_tp()
    out = {"world": world, "scheme": a.scheme, "tokens": a.tokens,
           "mlp": {"rel_err_vs_one_gpu": _rel(y, ref), "us_tp": _time(mlp_tp),
                   "us_one_gpu": _time(lambda: ht.quant_linear(ht.quant_linear(x, up), down))}}

    # expert parallel: 16 experts, top-2 routing of the tokens, experts [e0, e1) on this rank
    e_total, n_e, k_e = 16, a.moe_n, a.moe_k
    experts = ht.quantize_weight(torch.randn(e_total, n_e, k_e, device=dev, generator=g) * 0.02, a.scheme)
    ids = torch.randn(a.tokens, e_total, device=dev, generator=g).topk(2, dim=1).indices.reshape(-1).sort().values
    counts = torch.bincount(ids, minlength=e_total)
    offsets = torch.zeros(e_total + 1, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(counts, 0)
    xs = torch.randn(int(counts.sum()), k_e, device=dev, generator=g).to(x.dtype)
    from humming_triton.formats.shard import split_points
    cuts = split_points(experts, "expert", world)
    e0, e1 = cuts[rank], cuts[rank + 1]
    mine = shard(experts, "expert", world, rank)
    local = (offsets[e0:e1 + 1] - offsets[e0]).contiguous()
    r0, r1 = int(offsets[e0]), int(offsets[e1])  # routing is known before the GEMMs (outside the timed part)

    def moe_ep():
        y = torch.zeros(xs.shape[0], n_e, dtype=torch.float32, device=dev)
        if r1 > r0:
            y[r0:r1] = ht.grouped_linear(xs[r0:r1], mine, local).float()
        dist.all_reduce(y)
        return y

    ref_moe = ht.grouped_linear(xs, experts, offsets).float()
    out["moe_ep"] = {"rel_err_vs_one_gpu": _rel(moe_ep(), ref_moe), "us_ep": _time(moe_ep),
                     "us_one_gpu": _time(lambda: ht.grouped_linear(xs, experts, offsets))}
    # weight-only: only the fp32 summation order differs; quantized activations: each rank quantizes its own K-slice
    tol = 1e-2 if up.scheme.act is None else 5e-2
    out["tolerance"] = tol
    ok = out["mlp"]["rel_err_vs_one_gpu"] < tol and out["moe_ep"]["rel_err_vs_one_gpu"] < tol
    if rank == 0:
        print(json.dumps(out, indent=1))
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "tp.json").write_text(json.dumps(out, indent=1))
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
