"""``mma_decode_grouped``: the native decode GEMM for MoE experts at decode-sized batches (``grouped_linear``):
grid.y runs over the experts, each CTA reads its expert's row range from the device offsets (no host sync) and
runs its rows 8, 16 or 32 at a time through the same tile loop as ``mma_decode``.  Backend ``cuda``; ``auto`` runs
it only where the device's measured table says it is fastest."""
from __future__ import annotations

import torch

from cutlass_ext import decode_mma as dm

from ...calls import Call, KernelConfig
from . import Family, register

MAX_ROWS_PER_EXPERT = 32  # on average; above it the Triton grouped tiles reuse each weight tile better
# (warps splitting K, 16-row tiles per CTA, chunks in flight): short K (MoE down 768 = 12 chunks) wants few K warps.
# The second line (session 26): more chunks in flight per warp and wider CTAs of one K warp, for the mid-token rows
# (Qwen3 16-64 tokens, Mixtral 16) where (1, 4, 1) won at 64-78 % of the copy rate on the H100 -- candidates for
# the tuner to time, not a claim
_GRID = [(4, 1, 1), (2, 1, 1), (2, 2, 1), (4, 2, 1), (1, 4, 1), (8, 1, 1), (2, 4, 1), (4, 1, 2),
         (1, 4, 2), (1, 4, 3), (1, 2, 2), (2, 2, 2), (1, 8, 1), (2, 1, 3)]


def packed_experts(qw):
    """The kernel's layout of every expert (cutlass_ext.decode_mma.repack_experts), made once per weight."""
    return qw.cached_view("cuda", "decode_mma_experts", lambda: dm.repack_experts(qw))


def expert_call_reason(call: Call) -> str | None:
    """What keeps a call off the grouped decode kernel whatever its activations: not MoE experts, act-order
    experts, or more routed rows than a decode batch."""
    if call.op != "grouped_linear" or not call.experts:
        return "the native grouped decode kernel runs MoE experts (grouped_linear)"
    if call.act_order:
        return "act-order (k_perm) experts"
    if call.m > MAX_ROWS_PER_EXPERT * call.experts:
        return f"{call.m} routed rows over {call.experts} experts (decode batches only)"
    return None


class MMADecodeGrouped(Family):
    name = "mma_decode_grouped"
    op = "grouped_linear"
    backend = "cuda"
    grid = "experts"  # the launch's CTA rows: one per expert (decode_mma.run_grouped's grid)

    def reason(self, call: Call) -> str | None:
        why = expert_call_reason(call)
        if why:
            return why
        if call.dtype not in (torch.float16, torch.bfloat16):
            return f"{call.dtype} activations (fp16 / bf16 only)"
        return dm.weight_reason(call.scheme, call.n, call.k, call.dtype)

    def mma(self, call: Call) -> str:
        if str(call.scheme.weight) == "e4m3fn":
            return "fp8"  # cvt.rn.f16x2.e4m3x2 exists from SM 8.9, with the fp8 MMA
        return "fp16" if call.dtype == torch.float16 else "bf16"

    def candidates(self, call: Call) -> list[KernelConfig]:
        # rows per pass: one or two token tiles.  The kernel also runs four (32 rows, ``decode_mma.run_grouped``),
        # built to decode each weight tile once for experts of 17-32 rows, but measured slower than two 16-row
        # passes on every key it was timed on (H200, 0177666: Qwen3 gate_up 256 tokens 220.9 against 159.1 µs;
        # four tiles cost the kernel occupancy), so the tuner no longer offers it
        passes = (8,) if call.m <= call.experts else (8, 16)
        return [KernelConfig(self.name, bm, 16 * tw, 64, kw, 8, kw * tw, u) for bm in passes for kw, tw, u in _GRID]

    def operands(self, x, qw) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The kernel's activation rows (16-byte aligned, unit column stride) and per-row scales (none here)."""
        if x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
            x = x.contiguous() if not x.is_contiguous() else x.clone()
        return x, None

    def grouped_runner(self, x, offsets, qw, bias, out_dtype, cfg: KernelConfig):
        """The lean plan of a ``run`` call like this one (``decode_mma.grouped_runner``): ``(x, offsets, bias) ->
        y`` or None for an ``x`` / ``offsets`` it was not made for; None: repeats call ``run``.  Only for the
        weight-only kernel: a subclass whose ``operands`` quantize the activations (mma_decode_grouped_act) would
        run unquantized rows through it (the dense twin's bug, H200 headline at 6fc7cc7)."""
        if type(self).operands is not MMADecodeGrouped.operands or x.dim() != 2 or x.shape[0] == 0 or \
                not x.is_contiguous() or x.data_ptr() % 16:
            return None
        return dm.grouped_runner(packed_experts(qw), x.dtype, x.device, x.shape[0], offsets.dtype, bias, qw.bias
                                 if bias is None else None, out_dtype or x.dtype, kw=cfg.split_k,
                                 tw=cfg.block_n // 16, unroll=cfg.num_stages, rows_per_pass=cfg.block_m,
                                 grid=self.grid)

    def run(self, x, offsets, qw, bias, out_dtype, cfg: KernelConfig, out):
        t, n = x.shape[0], qw.N
        out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
        y = out if out is not None else torch.empty(t, n, dtype=out_dtype, device=x.device)
        if t == 0:
            return y
        x, row_scales = self.operands(x, qw)
        bias = qw.bias if bias is None else bias
        target = y if y.dtype in (torch.float16, torch.bfloat16, torch.float32) and y.stride(-1) == 1 else \
            torch.empty(t, n, dtype=torch.float32, device=x.device)
        dm.run_grouped(x, packed_experts(qw), offsets, bias, target, kw=cfg.split_k, tw=cfg.block_n // 16,
                       unroll=cfg.num_stages, rows_per_pass=cfg.block_m, row_scales=row_scales,
                       grid=self.grid)
        if target is not y:
            y.copy_(target)
        return y


register(MMADecodeGrouped())


class MMADecodeGroupedRows(MMADecodeGrouped):
    """``mma_decode_grouped_rows``: ``mma_decode_grouped``'s kernel and result with the grid over the routed rows
    where there are fewer of them than experts: CTA row y runs the expert whose rows start at row y.  Why: one
    decode token of Qwen3-30B-A3B routes 8 rows to 8 of 128 experts, and the expert grid launches 16x the CTAs
    that have work (5760 of 6144 leave at once at 48 weight tiles per expert); with those gone, deeper K splits
    (more warps per weight tile, fewer chunks each) are offered too.  Timed on the H100 (session 26: Qwen3 one
    token gate_up 16.9 / down 13.8 µs, Humming 17.7 / 15.7 same run); ``auto`` takes it only where a device's
    measured table names it (the H200's does not yet)."""
    name = "mma_decode_grouped_rows"
    grid = "rows"
    _DEEP_K = [(8, 2, 1), (16, 1, 1), (8, 1, 2)]

    def reason(self, call: Call) -> str | None:
        why = super().reason(call)
        if why is None and call.m >= call.experts:
            why = (f"{call.m} routed rows for {call.experts} experts: the row grid runs only with fewer rows than "
                   f"experts (else it is mma_decode_grouped's expert grid)")
        return why

    def candidates(self, call: Call) -> list[KernelConfig]:
        return super().candidates(call) + [KernelConfig(self.name, 8, 16 * tw, 64, kw, 8, kw * tw, u)
                                           for kw, tw, u in self._DEEP_K]


register(MMADecodeGroupedRows())


class PassGrid:
    """Mixin: a grouped decode family's kernel and result with a CTA row per pass (``decode_mma.run_grouped``'s
    "passes" grid) instead of one per expert running all its passes in a loop.  Why: the loop itself -- any loop
    around the tile -- makes ptxas spill under the kernel's register bound (one token tile, sm_90, session 31:
    MXFP4 / NVFP4 U = 1 356-368 bytes of spill stores -> 8, int8 U = 1 576 -> 12, w4a16 at 80 registers 40 -> 0,
    two token tiles U = 3 132-852 -> 0), and an expert of several passes runs them side by side.  Timed on an H100
    only (session 32, best config of each grid, same run: MXFP4 Qwen3 experts at 16 / 64 tokens 11-17 % faster,
    w4a16 1-2 %); ``auto`` takes it only where a device's measured table names it: the H100's since session 33 (24
    of its 31 decode-sized MoE keys), not yet the H200's."""
    grid = "passes"


class MMADecodeGroupedPasses(PassGrid, MMADecodeGrouped):
    name = "mma_decode_grouped_passes"


register(MMADecodeGroupedPasses())
