"""``mma_decode``: the native CUDA decode GEMM for M <= 16 (``cutlass_ext/csrc/decode_mma.cu``): int4 / int8
weights with per-row group or channel scales (and integer zero points), fp16 / bf16 activations, and MXFP4 /
NVFP4 e2m1 weights with bf16 activations; mma.sync with
the tokens on the MMA's N side, K split across the warps of a CTA.  Backend ``cuda``; ``auto`` runs it only where
the device's measured table says it is fastest."""
from __future__ import annotations

import torch

from cutlass_ext import decode_mma as dm

from ...calls import Call, KernelConfig
from . import Family, register

MAX_M = 16
# (warps splitting K, 16-row tiles per CTA, chunks of weight in flight per warp).  U = 1 / 3: D = U + 1 register
# sets in a loop unrolled by D (no copies), x one chunk ahead; U = 2 / 4 / 8: the register ring refilled after use
# (never a dense winner; the grouped kernel's U = 2 is).  One chunk ahead measured fastest on the H200 at M <= 8;
# with two token tiles (M > 8) three chunks ahead won most keys by 1-6 % (session 12, whole-chunk x, 96-104
# registers).  Since session 13 4-bit two-tile kernels load x by half chunks within 64 registers (decode_mma.cu,
# half_chunk_x): one chunk ahead won every 4-bit M = 16 key, 3-9 % faster.  Two tiles: at most four in flight.
_ONE_TILE = [(8, 1, 1), (16, 1, 1), (4, 1, 1), (4, 2, 1), (8, 2, 1), (8, 1, 2), (16, 1, 2), (8, 1, 4), (4, 1, 4),
             (4, 2, 4), (2, 4, 4), (4, 4, 1), (8, 1, 3), (4, 1, 3), (16, 1, 3)]
_TWO_TILES = [(4, 4, 1), (8, 1, 1), (4, 1, 1), (8, 2, 1), (16, 1, 1), (4, 2, 1), (2, 4, 1), (4, 1, 2), (8, 1, 2),
              (4, 2, 2), (4, 1, 3), (8, 1, 3), (4, 2, 3), (2, 2, 3), (2, 1, 3)]
# (measured and dropped, benchmarks/results/h200/ANALYSIS.md session 10: a shared-memory weight ring, 5-30 % slower;
# the two-tile kernel with whole-chunk x held to 64 registers, 30-100 % slower through rematerialisation;
# session 12: a cp.async ring for every load, 2-25 % slower)


def decode_grid(family: str, m: int) -> list[KernelConfig]:
    """The configs worth timing at ``m`` rows (block_n: 16 rows per tile-warp; split_k: warps splitting K)."""
    grid = _ONE_TILE if m <= 8 else _TWO_TILES
    return [KernelConfig(family, 16, 16 * tw, 64, kw, 8, kw * tw, u) for kw, tw, u in grid]


def packed_view(qw, group_k: int | None = None):
    """The kernel's layout of ``qw`` (cutlass_ext.decode_mma.repack; ``group_k``: scales per that many K), made
    once and cached on the weight (made again after an edit of its tensors)."""
    return qw.cached_view("cuda", ("decode_mma", group_k), lambda: dm.repack(qw, group_k))


class MMADecode(Family):
    name = "mma_decode"
    backend = "cuda"

    def reason(self, call: Call) -> str | None:
        from cutlass_ext.decode_mma import weight_reason
        if call.op != "quant_linear" or call.experts:
            return "the native decode kernel runs dense linear layers"
        if call.m > MAX_M:
            return f"M={call.m} (the native decode kernel takes M <= {MAX_M})"
        if call.dtype not in (torch.float16, torch.bfloat16):
            return f"{call.dtype} activations (fp16 / bf16 only)"
        return weight_reason(call.scheme, call.n, call.k, call.dtype)

    def mma(self, call: Call) -> str:
        if str(call.scheme.weight) == "e4m3fn":
            return "fp8"  # cvt.rn.f16x2.e4m3x2 exists from SM 8.9, with the fp8 MMA
        return "fp16" if call.dtype == torch.float16 else "bf16"

    def candidates(self, call: Call) -> list[KernelConfig]:
        return decode_grid(self.name, call.m)

    def launch(self, x2, qw, bias, target, cfg: KernelConfig) -> None:
        """The kernel on 16-bit activations ``x2`` into ``target`` (fp16 / bf16 / fp32, unit column stride)."""
        dm.run(x2, packed_view(qw), bias, target, kw=cfg.split_k, tw=cfg.block_n // 16, unroll=cfg.num_stages)

    def runner(self, x2, qw, bias, out_dtype, cfg: KernelConfig, shape: tuple):
        if x2.data_ptr() % 16 or x2.stride(0) != qw.K:
            return None
        return dm.runner(packed_view(qw), x2.dtype, x2.device, x2.shape[0], bias, out_dtype, shape,
                         kw=cfg.split_k, tw=cfg.block_n // 16, unroll=cfg.num_stages)

    def run(self, x, x2, qw, bias, out_dtype, cfg: KernelConfig, out):
        m, n = x2.shape[0], qw.N
        y = out if out is not None else torch.empty(m, n, dtype=out_dtype, device=x2.device)
        if m == 0:
            return y
        if x2.stride(0) % 8 or x2.data_ptr() % 16:  # the kernel loads 16-byte vectors of x
            x2 = x2.contiguous() if not x2.is_contiguous() else x2.clone()
        target = y if y.dtype in (torch.float16, torch.bfloat16, torch.float32) and y.stride(-1) == 1 else \
            torch.empty(m, n, dtype=torch.float32, device=x2.device)
        self.launch(x2, qw, bias, target, cfg)
        if target is not y:
            y.copy_(target)
        return y


register(MMADecode())
