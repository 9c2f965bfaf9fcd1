"""Every registered path on odd shapes, for compute-sanitizer (issue 15): one launch of each kernel family of each
backend this GPU runs -- the first config of the family and, where it has one, a split-K config -- for a format of
every family's domain, dense (``quant_linear``) and grouped (``grouped_linear``, uneven experts, empty ones
included), each checked against the float64 reference.  N, K, M and the expert row counts are not multiples of any
tile.  Usage on the GPU:

    compute-sanitizer --tool memcheck  python3 scripts/sanitize_probe.py
    compute-sanitizer --tool racecheck python3 scripts/sanitize_probe.py --split-k-and-grouped
    compute-sanitizer --tool memcheck  python3 scripts/sanitize_probe.py --shard 2/4   # a quarter of the paths

Prints one line per path and exits 1 if any result is off (the sanitizer reports its own errors)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import humming_triton as ht  # noqa: E402
from humming_triton import backends  # noqa: E402
from humming_triton.dispatch import call_for  # noqa: E402

# one scheme per decode family of the weight (int4 sym / asym, int8, e2m1 MX / NV, fp8 weights) and the
# activation-quantized kinds (fp8, int8, MX, NV): every family's domain holds at least one of them
SCHEMES = ["w4a16", "w4a16-asym", "w8a16", "mxfp4", "nvfp4", "w8a16-fp8", "w8a8-fp8", "w8a8-fp8-block", "w8a8-int8",
           "w4a8-int8", "w4a8-fp8", "w4a8-mxfp4", "w4a4-nvfp4"]
# N, K, M; the last: the cuBLASLt block-scaled / int8 families' domain (N % 128, K % 512; M = 7 pads to 8, M = 33 > 16)
DENSE = [(200, 384, 1), (200, 384, 7), (136, 1024, 33), (256, 1024, 7), (256, 1024, 33)]
FAMILIES: list[str] = []  # --families: only these (dense), empty for all
SHARD = [0, 1]  # --shard I/N: only the paths whose running index is I mod N (N sanitizer processes in parallel)
GROUPED_COUNTS = [0, 5, 1, 0, 19, 2]                       # rows per expert (two empty experts)
DEV = "cuda" if torch.cuda.is_available() else "cpu"     # cpu: a smoke run of the logic (TRITON_INTERPRET=1)


def _paths(b, call, split_k_only: bool):
    """The first candidate of each family, and its first split-K candidate (split_k > 1) when it has one."""
    seen, out = set(), []
    for cand in b.candidates(call):
        sk = getattr(cand.config, "split_k", 1) > 1
        key = (cand.family, sk)
        if key in seen or (split_k_only and not sk):
            continue
        seen.add(key)
        out.append(cand)
    return out


def _mine(counter: list) -> bool:
    """Whether the next path is this shard's (every shard enumerates the same paths in the same order)."""
    counter[0] += 1
    return (counter[0] - 1) % SHARD[1] == SHARD[0]


def _check(y, ref, what: str, bad: list) -> None:
    err = float((y.double().cpu() - ref).norm() / ref.norm().clamp(min=1e-30))
    ok = err < 3e-2  # bf16 outputs of 4-bit formats: well under this; a wrong tile or race is far over it
    print(f"{'ok  ' if ok else 'BAD '} {what}  rel err {err:.1e}", flush=True)
    if not ok:
        bad.append(what)


def dense(rng, split_k_only: bool, bad: list, counter: list) -> int:
    runs = 0
    for scheme in SCHEMES:
        for n, k, m in DENSE:
            qw = ht.quantize_weight(torch.randn(n, k, generator=rng) * 0.05, scheme,
                                    bias=torch.randn(n, generator=rng)).to(DEV)
            x = torch.randn(m, k, generator=rng).to(torch.bfloat16).to(DEV)
            ref = ht.reference_linear(x.cpu(), qw.to("cpu"), qw.bias.cpu(), out_dtype=torch.float32).double()
            call = call_for("quant_linear", x, qw)
            for name, b in backends.registered().items():
                if name == "reference" or b.reason(call) is not None:
                    continue
                for cand in _paths(b, call, split_k_only):
                    if (FAMILIES and cand.family not in FAMILIES) or not _mine(counter):
                        continue
                    y = b.quant_linear(x, qw, qw.bias, x.dtype, cand)
                    _check(y, ref, f"{scheme} {n}x{k} M={m} {cand.describe()}", bad)
                    runs += 1
    return runs


def grouped(rng, split_k_only: bool, bad: list, counter: list) -> int:
    runs = 0
    e, n, k = len(GROUPED_COUNTS), 136, 384
    offsets = torch.zeros(e + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(GROUPED_COUNTS), 0)
    t = int(offsets[-1])
    for scheme in ["w4a16", "w8a16", "mxfp4", "nvfp4", "w8a8-fp8", "w4a8-mxfp4"]:
        qw = ht.quantize_weight(torch.randn(e, n, k, generator=rng) * 0.05, scheme).to(DEV)
        x = torch.randn(t, k, generator=rng).to(torch.bfloat16).to(DEV)
        ref = ht.reference_grouped_linear(x.cpu(), qw.to("cpu"), offsets, out_dtype=torch.float32).double()
        off = offsets.to(DEV)
        call = call_for("grouped_linear", x, qw)
        for name, b in backends.registered().items():
            if name == "reference" or b.reason(call) is not None:
                continue
            for cand in _paths(b, call, False):
                if not _mine(counter):
                    continue
                y = b.grouped_linear(x, qw, off, None, x.dtype, cand)
                _check(y, ref, f"grouped {scheme} E{e} {n}x{k} T={t} {cand.describe()}", bad)
                runs += 1
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split-k-and-grouped", action="store_true",
                    help="only the split-K dense paths and the grouped ones (the racecheck run)")
    ap.add_argument("--only", default=None, help="comma list of dense schemes (one shape): a quick look")
    ap.add_argument("--families", default=None, help="comma list of dense families only (no grouped paths)")
    ap.add_argument("--shard", default="0/1", help="I/N: the paths of index I mod N only (default all)")
    a = ap.parse_args()
    i, n = (int(v) for v in a.shard.split("/"))
    if not 0 <= i < n:
        ap.error(f"--shard {a.shard}: want I/N with 0 <= I < N")
    SHARD[:] = [i, n]
    FAMILIES[:] = a.families.split(",") if a.families else []
    rng = torch.Generator().manual_seed(0)
    if a.only:
        SCHEMES[:] = [s for s in SCHEMES if s in a.only.split(",")]
        DENSE[:] = DENSE[:1]
    bad: list = []
    counter = [0]
    runs = dense(rng, a.split_k_and_grouped, bad, counter)
    runs += 0 if FAMILIES else grouped(rng, a.split_k_and_grouped, bad, counter)
    if DEV == "cuda":
        torch.cuda.synchronize()
    print(f"{runs} paths ran, {len(bad)} off the reference")
    return 1 if bad or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
