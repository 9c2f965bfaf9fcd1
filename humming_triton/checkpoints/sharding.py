"""One tensor- / expert-parallel rank's view of a checkpoint: ``read_quantized_tensors(d, shard=ShardSpec(r, n))``.

Why: a rank of an ``n``-way tensor-parallel model needs ``1/n`` of each layer; reading every tensor whole on every
rank costs ``n`` times the disk reads and a whole layer of host memory per rank.  The rank's result is **exactly**
``formats.shard.shard(<the whole layer>, dim, n, r)`` (same split points, scheme, scales, zeros, bias,
g_idx / k_perm, global scales) for the ``dim`` the plan gives the layer's name:

* ``"n"`` -- column parallel (q/k/v/gate/up projections, fused qkv / gate_up: the rank's output rows);
* ``"k"`` -- row parallel (o_proj / down_proj: the rank's input columns; only rank 0 keeps the bias, the
  all-reduce adds it once);
* ``"expert"`` -- expert parallel: a fused 3-D ``[E, N, K]`` weight is cut by expert; a checkpoint that stores
  one layer per expert (``...experts.<e>.<proj>``) gives the rank only the layers of its experts (the others are
  never read), experts dealt out as ``split_points`` deals 3-D ones;
* ``None`` -- replicated (read whole on every rank): every name no pattern matches (lm_head, MoE routers...).

The plan is an ordered sequence of ``(regex, dim)`` (``re.search`` on the module name, first match wins); a dict
works too.  ``DEFAULT_PLAN`` covers Llama / Qwen / Mixtral / DeepSeek / gpt-oss names.  Split points are
``split_points``' (packed words, scale blocks, activation groups); a split that cannot be made raises ValueError
naming the layer and the constraint.  They do not know about attention heads: choose ``size`` so that each
rank's rows hold whole heads.  A fused ``gate_up`` / ``qkv`` weight is cut contiguously like any other
(``shard``'s semantics); a runtime that needs each rank's gate *and* up rows must store them interleaved (as
gpt-oss does) or split the parts before fusing.  ``size == 1`` reads every layer whole (the identity shard).

Which bytes are read: the importers (``_common.finish``) read only the rank's window of the packed codes -- the
bulk of a layer -- through safetensors ``get_slice`` wherever the layout is sliceable, and the small tensors
(scales, zeros, g_idx, bias, global scales: e.g. 1/8 of the codes' bytes for NVFP4, 1/25 for 4-bit g128 GPTQ)
whole, so that data-dependent import choices (GPTQ zeros that are all ``2**(bits-1)`` becoming signed codes, say)
are the whole layer's.  Per format see each importer's docstring; in short: GPTQ, compressed-tensors
(pack-quantized, float/int-quantized, nvfp4/mxfp4), FP8-block, ModelOpt and gpt-oss slice every split they allow;
AWQ slices K and reads N windows rounded out to its 8-column words; compressed-tensors' old padded 3/5/6/7-bit
packing reads rows for N windows but whole rows for K windows; HQQ's planar packing is read whole and cut in
memory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..formats.shard import DIMS, even_cuts, split_points
from ..formats.weight import QuantWeight

__all__ = ["ShardSpec", "DEFAULT_PLAN"]

DEFAULT_PLAN: tuple[tuple[str, str | None], ...] = (
    (r"\.experts\.", "expert"),  # MoE experts, per-expert layers or fused 3-D (Mixtral w1/w2/w3 included)
    (r"\.(q|k|v|qkv|gate|up|gate_up)_proj$|\.w[13]$", "n"),
    (r"\.(o|down)_proj$|\.w2$", "k"),
)
# a tensor of one expert's own layer: <base>.experts.<e>.<proj>.<tensor>
_EXPERT_KEY = re.compile(r"^(?P<base>.*\.experts)\.(?P<e>\d+)\.(?P<proj>[^.]+)\.")
_EXPERT_LAYER = re.compile(r"\.experts\.\d+\.[^.]+$")


@dataclass(frozen=True)
class ShardSpec:
    """Rank ``rank`` of ``size``, each layer split along the dim its name's first matching ``plan`` entry says."""
    rank: int
    size: int
    plan: Sequence[tuple[str, str | None]] | Mapping[str, str | None] = DEFAULT_PLAN

    def __post_init__(self):
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"ShardSpec size (tp_size) must be a positive int, got {self.size!r}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.size:
            raise ValueError(f"ShardSpec rank must be an int in [0, {self.size}), got {self.rank!r}")
        plan = tuple(self.plan.items() if isinstance(self.plan, Mapping) else self.plan)
        for entry in plan:
            if len(entry) != 2 or entry[1] not in (*DIMS, None):
                raise ValueError(f"a plan entry is (regex, dim) with dim one of {DIMS} or None, got {entry!r}")
            re.compile(entry[0])
        object.__setattr__(self, "plan", plan)

    def dim_for(self, name: str) -> str | None:
        """The dim module ``name`` is split along (None: replicated)."""
        return next((dim for pattern, dim in self.plan if re.search(pattern, name)), None)

    def window(self, name: str, qw: QuantWeight) -> tuple[str, int, int] | None:
        """``(dim, start, stop)`` of layer ``name`` (whole layer ``qw``: a builder's result) this rank reads, or
        None for all of it."""
        dim = self.dim_for(name)
        if dim is None or self.size == 1:
            return None
        if dim == "expert" and qw.num_experts is None:
            if _EXPERT_LAYER.search(name):
                return None  # one expert's own layer: select() kept it for this rank, it is read whole
            raise ValueError(f"the shard plan splits {name} by expert, but it is a 2-D [N, K] layer, not [E, N, K]")
        try:
            cuts = split_points(qw, dim, self.size)
        except ValueError as e:
            raise ValueError(f"cannot shard {name} {list(qw.shape)} ({qw.scheme.name}) along {dim} into "
                             f"{self.size}: {e}; pass a ShardSpec plan that replicates it (dim None) or "
                             "splits it another way") from None
        return dim, cuts[self.rank], cuts[self.rank + 1]

    def select(self, keys) -> set[str]:
        """``keys`` without the tensors of other ranks' per-expert layers (those the plan splits by expert)."""
        keys = set(keys)
        if self.size == 1:
            return keys
        owner = {}  # tensor name -> (experts module, expert id), for per-expert layers split by expert
        for key in keys:
            m = _EXPERT_KEY.match(key)
            if m and self.dim_for(f"{m['base']}.{m['e']}.{m['proj']}") == "expert":
                owner[key] = (m["base"], int(m["e"]))
        mine = set()
        for base in {b for b, _ in owner.values()}:
            order = sorted({e for b, e in owner.values() if b == base})
            cuts = even_cuts(len(order), 1, self.size, f"the {len(order)} experts of {base}")
            mine |= {(base, e) for e in order[cuts[self.rank]:cuts[self.rank + 1]]}
        return {k for k in keys if k not in owner or owner[k] in mine}
