"""The measured streaming floor of a dense row: how fast a bare Triton kernel can read the weight's packed words.

At decode sizes (M = 1..16) a quantized GEMM is a pass over the weight: every packed int32 word has to come
from HBM once, and nothing else (x, y, scales) is big enough to matter.  The copy bandwidth behind "% HBM" is
not reachable by a single kernel that reads a few tens of MB -- launch, ramp-up of the memory pipeline and
the tail of the last wave cost a large fraction of a 10-30 µs kernel -- so "% HBM" says little about how much
a decode kernel could still gain.  This module measures instead what the *same tool* (Triton, on this device,
in this run) achieves when it only streams those bytes: a kernel that loads the words and XOR-reduces them
(one int32 per program is stored, so the loads cannot be dropped as dead code) and does no other math.  A
GEMV of that weight can be no faster than this in practice, so ``pct_floor = floor_us / our_us * 100`` is how
close our kernel is to the best a Triton decode kernel of that format can do (100 % = as fast as streaming).

Timed like every row (benchmarks/timing.py: CUDA-graph replay, 256 MB L2 flush before each replay, median),
best of a small config sweep (BLOCK words per tile x warps x tiles per program); one measurement per byte
count per run.  GPU only: the CPU smoke mode leaves the floor empty rather than inventing one.
"""
from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from .timing import time_gpu

__all__ = ["weight_word_bytes", "StreamFloor", "add_floor"]

BLOCKS = (256, 512, 1024)   # int32 words per tile
WARPS = (4, 8)
TILES = (1, 4)              # tiles per program: 1 = many short programs, 4 = fewer programs with more in flight


@triton.jit
def _stream_words(w_ptr, out_ptr, n_words, BLOCK: tl.constexpr, TILES: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * TILES)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for t in tl.static_range(TILES):
        idx = base + t * BLOCK + offs
        acc ^= tl.load(w_ptr + idx, mask=idx < n_words, other=0)
    tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))


def weight_word_bytes(scheme: str, n: int, k: int) -> int:
    """Bytes of the packed code words of an [N, K] weight (no scales/zeros: they are a few % and are read by
    a different access pattern); the unquantized bf16 baseline streams N*K*2 bytes."""
    if scheme == "bf16":
        return n * k * 2
    import humming_triton as ht
    from humming_triton.formats.packing import packed_words
    return n * packed_words(k, ht.QuantScheme.parse(scheme).bits) * 4


class StreamFloor:
    """Best-of-sweep streaming time per byte count, cached for the run; ``summary()`` goes into the meta."""

    def __init__(self):
        self.by_bytes: dict[int, dict] = {}

    def us(self, nbytes: int) -> float | None:
        if nbytes not in self.by_bytes:
            try:
                self.by_bytes[nbytes] = self._measure(nbytes)
            except Exception as e:  # noqa: BLE001 -- a failed probe leaves the column empty, not the run dead
                self.by_bytes[nbytes] = {"us": None, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        return self.by_bytes[nbytes]["us"]

    def _measure(self, nbytes: int) -> dict:
        n_words = -(-nbytes // 4)
        words = torch.randint(-2 ** 31, 2 ** 31 - 1, (n_words,), dtype=torch.int32, device="cuda")
        best = None
        for block, warps, tiles in itertools.product(BLOCKS, WARPS, TILES):
            grid = (triton.cdiv(n_words, block * tiles),)
            out = torch.empty(grid[0], dtype=torch.int32, device="cuda")

            def fn(block=block, warps=warps, tiles=tiles, grid=grid, out=out):
                _stream_words[grid](words, out, n_words, BLOCK=block, TILES=tiles, num_warps=warps)
                return out

            fn()  # compile outside the graph capture
            t = time_gpu(fn, budget_s=0.02, min_reps=25, max_reps=100)
            if best is None or t["us"] < best[0]:
                best = (t["us"], fn, {"block": block, "num_warps": warps, "tiles": tiles})
        # re-time the winner with the rows' own budget: the sweep's short medians only rank the configs
        t = time_gpu(best[1])
        del words
        return {"us": t["us"], "config": best[2], "gbps": nbytes / t["us"] / 1e3}

    def summary(self) -> dict:
        return {str(b): {k: (round(v, 2) if isinstance(v, float) else v) for k, v in d.items()}
                for b, d in sorted(self.by_bytes.items())}


def add_floor(records: list[dict], floor: StreamFloor, log=print) -> None:
    """``floor_us`` / ``pct_floor`` on every timed dense record (the floor of the bytes its scheme streams)."""
    for r in records:
        if r["kind"] != "dense" or r["us"] is None:
            continue
        nbytes = weight_word_bytes(r["scheme"], r["N"], r["K"])
        known = nbytes in floor.by_bytes
        f = floor.us(nbytes)
        if not known:
            log(f"stream floor {nbytes / 2 ** 20:.1f} MiB: " + (f"{f:.1f} us" if f else str(floor.by_bytes[nbytes])))
        r["floor_us"] = f
        r["pct_floor"] = 100 * f / r["us"] if f else None
