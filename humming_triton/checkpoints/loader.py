"""``read_quantized_tensors`` / ``load_quantized``: a quantized checkpoint directory -> QuantWeights -> model.

Steps: read ``config.json`` (``quantization_config``; ModelOpt's ``hf_quant_config.json`` as a fallback), open
every ``*.safetensors`` lazily, hand the tensors to the importer of ``quant_method`` (one module per producer
family, each returning ``{module name: QuantWeight}``), then -- for ``load_quantized`` -- build the Hugging Face
skeleton from the config (``AutoModelForCausalLM.from_config``, no hub access), stack per-expert layers into
fused 3-D experts (``fuse.py``), swap in ``QuantLinear`` / ``QuantMoE`` and load the remaining (unquantized)
tensors.  Skip lists (``ignore`` / ``modules_to_not_convert`` / ``exclude_modules``) need no handling: skipped
layers are stored unquantized and load as ordinary tensors.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import warnings
from collections import Counter

import torch
from torch import nn

from ..formats.weight import QuantWeight
from . import awq, compressed_tensors, fp8_block, gpt_oss, gptq, hqq, modelopt
from ._common import CheckpointFormatError, Tensors
from .fuse import fuse_experts
from .sharding import ShardSpec

__all__ = ["read_quantized_tensors", "load_quantized", "quantization_config", "IMPORTERS"]

IMPORTERS = {
    "gptq": gptq.read, "awq": awq.read, "compressed-tensors": compressed_tensors.read, "fp8": fp8_block.read,
    "mxfp4": gpt_oss.read, "modelopt": modelopt.read, "hqq": hqq.read,
}
# per-expert projection names -> role (Mixtral: w1 = gate, w3 = up, w2 = down)
_ROLES = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}
_EXPERT_RE = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)$")


def _check_dir(model_dir) -> str:
    """``model_dir`` as a str, or FileNotFoundError naming it.  Why here: Hugging Face's ``from_pretrained``
    takes a string that is not a directory for a hub repo id and answers a missing local path with "Repo id must
    be in the form 'repo_name' or 'namespace/repo_name'" (issue 18); we read local directories only."""
    model_dir = os.fspath(model_dir)
    if os.path.isdir(model_dir):
        return model_dir
    if os.path.exists(model_dir):
        raise NotADirectoryError(f"{model_dir} is a file; a checkpoint directory (config.json + *.safetensors) "
                                 "was expected")
    # what looks like a path (absolute, ./ or ../, or with a separator) is a missing directory; anything else
    # reads like a hub repo id, which we do not download
    if os.path.isabs(model_dir) or model_dir.startswith(".") or os.sep in model_dir:
        raise FileNotFoundError(f"checkpoint directory {model_dir} does not exist")
    raise FileNotFoundError(f"{model_dir} is not a local directory; humming_triton reads local checkpoint "
                            "directories only (download a hub repo first, e.g. huggingface_hub.snapshot_download)")


def quantization_config(model_dir: str) -> dict:
    model_dir = _check_dir(model_dir)
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{model_dir} has no config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    q = cfg.get("quantization_config")
    hf_q = os.path.join(model_dir, "hf_quant_config.json")
    if q is None and os.path.isfile(hf_q):
        with open(hf_q) as f:
            q = {"quant_method": "modelopt", **(json.load(f).get("quantization") or {})}
    if q is None:
        raise CheckpointFormatError(f"{cfg_path} has no quantization_config (and there is no hf_quant_config.json): "
                                    "not a quantized checkpoint")
    return q


def _open_tensors(model_dir: str, shard: ShardSpec | None = None) -> Tensors:
    from safetensors import safe_open
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors files")
    where, handles = {}, {}
    for path in files:
        h = safe_open(path, framework="pt")
        handles[path] = h
        for k in h.keys():
            where[k] = path
    return Tensors(lambda name: handles[where[name]].get_tensor(name), keys=where.keys(),
                   slicer=lambda name: handles[where[name]].get_slice(name), shard=shard)


def read_quantized_tensors(model_dir: str, hints: dict | None = None,
                           shard: ShardSpec | None = None) -> dict[str, QuantWeight]:
    """``{module name: QuantWeight}`` for every quantized layer of the checkpoint in ``model_dir``.

    ``hints`` maps module names to their whole ``(out_features, in_features)`` for formats whose tensors do not
    carry the logical shape (HQQ without a ``shape`` tensor).  ``shard=ShardSpec(rank, size, plan)``: only that
    tensor / expert parallel rank's part of each layer -- exactly ``formats.shard.shard(<whole layer>, dim,
    size, rank)`` for the dim its plan gives the name, reading only the rank's bytes of the packed codes where
    the layout allows (checkpoints/sharding.py)."""
    model_dir = _check_dir(model_dir)
    q = quantization_config(model_dir)
    method = str(q.get("quant_method", "")).lower()
    if method not in IMPORTERS:
        raise CheckpointFormatError(f"unknown quant_method {q.get('quant_method')!r} in {model_dir}; supported: "
                                    f"{', '.join(IMPORTERS)}")
    return IMPORTERS[method](_open_tensors(model_dir, shard), q, hints or {})


class PermutedInput(nn.Module):
    """``inner(x[..., k_perm])``: runs an act-order layer through a module that does not carry ``k_perm``."""

    def __init__(self, k_perm: torch.Tensor, inner: nn.Module):
        super().__init__()
        self.register_buffer("k_perm", k_perm)
        self.inner = inner

    def forward(self, x):
        return self.inner(x.index_select(-1, self.k_perm))


def _linear_module(qw: QuantWeight, backend: str):
    from ..nn import QuantLinear
    m = QuantLinear.from_quant_weight(qw, qw.bias, backend)
    if qw.k_perm is not None and getattr(m.quant_weight, "k_perm", None) is None:
        # this QuantLinear does not carry k_perm yet: gather x outside it (same math, see weight.py)
        stored = dataclasses.replace(qw, k_perm=None, cache={})
        m = PermutedInput(qw.k_perm, QuantLinear.from_quant_weight(stored, qw.bias, backend))
    return m


def group_experts(qws: dict[str, QuantWeight]) -> tuple[dict[str, QuantWeight], dict[str, tuple]]:
    """Split ``qws`` into plain layers and ``{experts module: (gate_up, down)}`` (fused 3-D QuantWeights)."""
    plain, parts = {}, {}
    for name, qw in qws.items():
        m = _EXPERT_RE.match(name)
        if m:
            parts.setdefault(m.group(1), {}).setdefault(_ROLES[m.group(3)], {})[int(m.group(2))] = qw
        elif name.endswith(".experts.gate_up_proj") or name.endswith(".experts.down_proj"):
            base, proj = name.rsplit(".", 1)
            parts.setdefault(base, {})[proj] = qw
        else:
            plain[name] = qw
    experts = {}
    for base, p in parts.items():
        if "gate_up_proj" in p:  # already fused (gpt-oss)
            if "down_proj" not in p:
                raise CheckpointFormatError(f"{base}: gate_up_proj without down_proj")
            experts[base] = (p["gate_up_proj"], p["down_proj"])
            continue
        ids = sorted(p.get("down", {}))
        if ids != list(range(len(ids))) or any(sorted(p.get(r, {})) != ids for r in ("gate", "up")):
            raise CheckpointFormatError(f"{base}: per-expert gate/up/down layers are incomplete")
        experts[base] = fuse_experts([p["gate"][e] for e in ids], [p["up"][e] for e in ids],
                                     [p["down"][e] for e in ids], base)
    return plain, experts


def _resolve(model: nn.Module, name: str) -> str:
    """Checkpoint module name -> model module name (Mixtral's ``block_sparse_moe`` is ``mlp`` in HF 5)."""
    names = dict(model.named_modules())
    for cand in (name, name.replace(".block_sparse_moe.", ".mlp.")):
        if cand in names:
            return cand
    raise CheckpointFormatError(f"checkpoint layer {name!r} has no module in the {type(model).__name__} skeleton")


def load_quantized(model_dir: str, dtype: torch.dtype = torch.bfloat16, backend: str = "auto") -> nn.Module:
    """The Hugging Face causal LM of ``model_dir`` with its quantized layers as ``QuantLinear`` / ``QuantMoE``.

    ``dtype``: the dtype of the model's unquantized parameters (embeddings, norms, skipped layers) and so of
    its activations; default bf16.  A checkpoint written by ``save_quantized`` reloads exactly when ``dtype`` is
    the dtype the model was saved in; when the checkpoint's dtype (``config.json``'s ``dtype`` /
    ``torch_dtype``, else that of its unquantized tensors) cannot be held exactly in ``dtype`` (fp32 loaded as
    bf16, fp16 as bf16, ...) this warns: outputs then differ from the saved model's.  ``backend``: the backend of
    every quantized op ("auto" | "triton" | "torch" | "reference").  ``model_dir`` must be a local directory
    (FileNotFoundError otherwise)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ..nn import QuantMoE
    model_dir = _check_dir(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the skeleton is plain; our modules replace its layers
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    hints = {n: (m.out_features, m.in_features) for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    qws = read_quantized_tensors(model_dir, hints)
    plain, experts = group_experts(qws)
    act = "swiglu_oai" if getattr(config, "model_type", "") == "gpt_oss" else "silu"
    for name, qw in plain.items():
        model.set_submodule(_resolve(model, name), _linear_module(qw, backend))
    for name, (gu, dn) in experts.items():
        if gu.k_perm is not None or dn.k_perm is not None:
            raise CheckpointFormatError(f"{name}: act-order (k_perm) MoE experts are not supported by QuantMoE yet")
        model.set_submodule(_resolve(model, name), QuantMoE.from_quant_weights(gu, dn, act, backend))
    stored = _load_rest(model, model_dir, qws, experts)
    saved = recorded_dtype(model_dir) or (stored.most_common(1)[0][0] if stored else None)
    if saved is not None and not exact_cast(saved, dtype):
        warnings.warn(f"humming_triton.load_quantized: {model_dir} was saved in {_name(saved)} and is loaded as "
                      f"dtype={_name(dtype)}: its unquantized tensors are rounded and activations run in "
                      f"{_name(dtype)}, so outputs differ from the saved model's; pass dtype=torch.{_name(saved)} "
                      "for an exact reload", stacklevel=2)
    return model


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def recorded_dtype(model_dir: str) -> torch.dtype | None:
    """The float dtype ``config.json`` records for the model (``dtype`` in transformers >= 5, ``torch_dtype``
    before), None when it records none (a model built in fp32 records null) or something else ("auto")."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    name = cfg.get("dtype") or cfg.get("torch_dtype")
    dt = getattr(torch, str(name).removeprefix("torch."), None) if name else None
    return dt if isinstance(dt, torch.dtype) and dt.is_floating_point else None


def exact_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """True when every ``src`` value is exactly a ``dst`` value (bf16 -> fp32 yes; fp32 -> bf16, fp16 <-> bf16 no)."""
    if src == dst:
        return True
    if not (src.is_floating_point and dst.is_floating_point):
        return False
    a, b = torch.finfo(src), torch.finfo(dst)
    return b.eps <= a.eps and b.max >= a.max and b.smallest_normal <= a.smallest_normal


def _load_rest(model: nn.Module, model_dir: str, qws: dict, experts: dict) -> Counter:
    """Copy every unquantized tensor (embeddings, norms, router, skipped layers) into the model.  Returns how
    many float tensors of each dtype the checkpoint stored (its dtype when config.json records none)."""
    t = _open_tensors(model_dir)
    quant_prefixes = tuple(f"{n}." for n in qws) + tuple(f"{n}_" for n in qws)
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    loaded = 0
    stored = Counter()
    for key in t.keys:
        if key.startswith(quant_prefixes):
            continue
        target = key if key in params else key.replace(".block_sparse_moe.", ".mlp.")
        if target in params:
            with torch.no_grad():
                p = params[target]
                src = t.get(key, "checkpoint")
                if src.is_floating_point():
                    stored[src.dtype] += 1
                p.copy_(src.to(p.dtype))
            loaded += 1
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(model, "tie_weights"):
        model.tie_weights()
    return stored
