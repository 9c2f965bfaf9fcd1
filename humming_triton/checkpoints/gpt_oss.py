"""gpt-oss MXFP4 experts (``quant_method: "mxfp4"``; only the experts are quantized).

Per MoE layer ``<p> = model.layers.<i>.mlp.experts``:

* ``<p>.gate_up_proj_blocks`` uint8 ``[E, 2I, H/32, 16]``: per output row, H e2m1 codes two per byte, low
  nibble = even element -- flattening the last two axes gives exactly our 4-bit K-packed stream;
* ``<p>.gate_up_proj_scales`` uint8 ``[E, 2I, H/32]`` e8m0 (``2**(b-127)``), ``<p>.gate_up_proj_bias`` fp32
  ``[E, 2I]``; the same for ``down_proj`` with ``[E, H, I/32, 16]`` / ``[E, H, I/32]`` / ``[E, H]``.

The result is ``{<p>.gate_up_proj: [E, 2I, H], <p>.down_proj: [E, H, I]}`` (N x K per expert, biases in the
QuantWeights).  **The gate/up rows stay interleaved** (gate = even rows, up = odd rows) as the producer wrote
them: the reference MoE activation ``"swiglu_oai"`` reads interleaved rows, so nothing is reordered.

Rank windows (``ShardSpec``): an expert window reads the rank's experts of ``<proj>_blocks``, an N window its
rows, a K window its 32-element blocks (split points sit on the 32-element scale groups); scales and biases are
read whole.
"""
from __future__ import annotations

import torch

from ..formats.weight import QuantWeight
from ._common import (CheckpointFormatError, Tensors, bytes_to_words, check_shape, e8m0_codes, finish, float_weight,
                      window_slices)

FMT = "gpt-oss MXFP4"
PROJS = ("gate_up_proj", "down_proj")


def import_experts_proj(t: Tensors, name: str) -> QuantWeight:
    """``name`` = ``<p>.gate_up_proj`` or ``<p>.down_proj``."""
    blocks = t.meta(f"{name}_blocks", FMT)
    if blocks.dtype != torch.uint8 or blocks.dim() != 4 or blocks.shape[-1] != 16:
        raise CheckpointFormatError(f"{FMT}: {name}_blocks must be uint8 [E, N, K/32, 16], got {blocks.dtype} "
                                    f"{list(blocks.shape)}")
    e, n, kb, _ = blocks.shape
    k = kb * 32
    scales = t.get(f"{name}_scales", FMT)
    check_shape(scales, (e, n, kb), f"{name}_scales", FMT)
    bias = t.opt(f"{name}_bias")
    if bias is not None:
        check_shape(bias, (e, n), f"{name}_bias", FMT)
    layer = float_weight(elem="e2m1", lead=(e,), n=n, k=k, scales=e8m0_codes(scales, f"{name}_scales", FMT),
                         scale_dtype="e8m0", block=(1, 32), bias=bias, fmt=f"{FMT} {name}")

    def read_words(win):
        b = t.read(f"{name}_blocks", FMT, window_slices(win, 4, {"expert": 0, "n": 1, "k": 2}, {"k": (1, 32)}))
        return bytes_to_words(b.reshape(*b.shape[:2], -1))

    return finish(t, name, layer, read_words, f"{FMT} {name}")


def read(t: Tensors, qcfg: dict, hints: dict) -> dict[str, QuantWeight]:
    out = {}
    for key in sorted(t.keys):
        for proj in PROJS:
            if key.endswith(f".{proj}_blocks"):
                name = key[: -len("_blocks")]
                out[name] = import_experts_proj(t, name)
    return out
