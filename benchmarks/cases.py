"""What is measured: dense cases (scheme x N x K x M) and MoE grouped cases (E, top-k, N, K, M).

The headline suite is exactly the shapes of ../shared/targets.md, so that its numbers can be checked against
the targets table; ``decode`` covers M = 1..16 (decode batches, also at the gate_up shapes 14336x4096 and
28672x4096) and the W4A4 schemes; ``full`` adds formats and shapes for exploration.  ``interpret`` is a CPU
smoke set small enough for the Triton interpreter.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DenseCase", "MoECase", "suite_cases", "ACT_FP8_SCHEMES"]

# schemes whose activations are fp8: their rows are compared with the fp8 tensor-core peak, and the
# torch._scaled_mm row-wise fp8 baseline runs in their shapes
ACT_FP8_SCHEMES = ("w8a8-fp8", "w8a8-fp8-block", "w4a8-fp8", "w4a8-mxfp4")


@dataclass(frozen=True)
class DenseCase:
    scheme: str
    N: int
    K: int
    M: int
    kind: str = "dense"

    @property
    def shape_key(self) -> tuple:
        return ("dense", self.N, self.K)


@dataclass(frozen=True)
class MoECase:
    scheme: str
    E: int
    topk: int
    N: int
    K: int
    M: int          # tokens; the grouped GEMM sees M * topk routed rows
    name: str = ""  # e.g. "gate_up" / "down"
    kind: str = "moe"

    @property
    def shape_key(self) -> tuple:
        return ("moe", self.E, self.topk, self.N, self.K)


TARGET_M = (1, 16, 64, 256, 1024, 4096)
DECODE_M = (1, 2, 4, 8, 16)  # serving decode batches: the multi-row word-major GEMV's range
FORMAT_M = (1, 16, 256, 4096)
# Qwen3-30B-A3B experts: hidden 2048, expert intermediate 768 -> gate_up N = 2 * 768
QWEN3_MOE = (("gate_up", 1536, 2048), ("down", 2048, 768))


def _dense(schemes, shapes, ms):
    return [DenseCase(s, n, k, m) for s in schemes for (n, k) in shapes for m in ms]


# Mixtral-8x7B experts: hidden 4096, intermediate 14336 -> gate_up N = 2 * 14336; 8 experts, top-2
MIXTRAL = (("gate_up", 28672, 4096), ("down", 4096, 14336))
MOE_M = (1, 16, 64, 256, 1024, 4096)  # tokens (each routed top-k times)


def _moe(schemes, ms, e=128, topk=8, shapes=QWEN3_MOE):
    return [MoECase(s, e, topk, n, k, m, name) for s in schemes for (name, n, k) in shapes for m in ms]


def suite_cases(suite: str) -> list:
    if suite == "headline":
        return (_dense(["w4a16"], [(8192, 8192), (4096, 14336)], TARGET_M)
                + _dense(["mxfp4", "nvfp4", "w8a16", "w8a8-fp8", "w4a8-mxfp4"], [(8192, 8192)], FORMAT_M)
                + _moe(["w4a16"], FORMAT_M))
    if suite == "full":
        schemes = ["w4a16", "w4a16-asym", "w8a16", "w3a16", "w2a16", "mxfp4", "nvfp4", "w8a16-fp8",
                   "w8a8-fp8", "w8a8-fp8-block", "w8a8-int8", "w4a8-fp8", "w4a8-mxfp4", "w4a4-mxfp4", "w4a4-nvfp4"]
        shapes = [(8192, 8192), (4096, 14336), (14336, 4096), (28672, 4096)]
        return _dense(schemes, shapes, TARGET_M) + _moe(["w4a16", "mxfp4", "w4a8-mxfp4"], TARGET_M)
    if suite == "decode":
        return (_dense(["w4a16", "mxfp4", "nvfp4", "w8a16"], [(8192, 8192)], DECODE_M)
                + _dense(["w4a16"], [(4096, 14336)], DECODE_M)
                # Llama-3-8B's gate (or up) projection and its fused gate_up (2 x 14336) at hidden 4096:
                # long N, short K -- few K iterations per output, the opposite aspect of 4096x14336
                + _dense(["w4a16"], [(14336, 4096), (28672, 4096)], DECODE_M)
                + _dense(["w4a4-mxfp4", "w4a4-nvfp4"], [(8192, 8192)], FORMAT_M))
    if suite == "moe":
        # the MoE issue's rows: Qwen3-30B-A3B (128 experts, top-8) and Mixtral-8x7B (8 experts, top-2) GEMMs,
        # 16-bit and fp8 activations, decode to prefill token counts
        schemes = ["w4a16", "mxfp4", "w4a8-mxfp4"]
        return _moe(schemes, MOE_M) + _moe(schemes, MOE_M, e=8, topk=2, shapes=MIXTRAL)
    if suite == "act":
        # every activation-quantized scheme of the FP8 / INT8 issue at its M points (the headline holds two of them)
        return _dense(["w8a8-fp8", "w8a8-fp8-block", "w8a8-int8", "w4a8-fp8", "w4a8-int8", "w4a8-mxfp4"],
                      [(8192, 8192)], FORMAT_M)
    if suite == "interpret":
        # tiny: the Triton interpreter runs every program instance in Python
        return [DenseCase("w4a16", 64, 256, 3), DenseCase("w8a16", 48, 128, 5), DenseCase("mxfp4", 32, 128, 2)]
    raise ValueError(f"unknown suite {suite!r}; expected headline, decode, act, moe, full or interpret")
