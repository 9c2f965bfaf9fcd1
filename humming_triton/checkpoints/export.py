"""``save_quantized``: a model holding our modules -> a Hugging Face style checkpoint in an external format.

Why: a model quantized with ``replace_linear`` should leave this library in a form other tools (vLLM, HF,
llm-compressor consumers) and ``ht.load_quantized`` read -- without re-quantizing.  Formats:

* ``"gptq"`` -- GPTQ with ``checkpoint_format: "gptq_v2"`` (true zeros; v1's ``zero - 1`` cannot hold zero 0),
  2/3/4/8-bit integer weights with per-channel or per-group scales, act-order via ``g_idx``;
* ``"compressed-tensors"`` -- ``pack-quantized`` (integer weights, any 1-8 bits), ``float-quantized`` (fp8),
  ``nvfp4-pack-quantized`` and ``mxfp4-pack-quantized``, one config group per distinct scheme.

Layout written: ``config.json`` (the model config + ``quantization_config``) and one ``model.safetensors``.
``QuantLinear`` layers keep their module name; fused ``QuantMoE`` experts are written per expert
(``<experts>.<e>.gate_proj`` / ``up_proj`` / ``down_proj``), the way Qwen3-MoE / Mixtral checkpoints store
them and the loader (``fuse.py``) stacks them back.  Every other tensor (embeddings, norms, router, lm_head,
unconverted layers) is saved as is.  The per-layer writers (``writers.py``) are exact inverses of the
importers; a pair that cannot be expressed raises ``ExportError`` naming the layer and scheme.
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings

import torch
from torch import nn

from ..formats.weight import QuantWeight
from .writers import ExportError, ct_layer, gptq_layer

__all__ = ["save_quantized", "quantized_layers", "ExportError", "EXPORT_FORMATS"]

EXPORT_FORMATS = ("gptq", "compressed-tensors")
_ALIASES = {"gptq": "gptq", "gptq_v2": "gptq", "compressed-tensors": "compressed-tensors",
            "compressed_tensors": "compressed-tensors", "ct": "compressed-tensors"}


def _rows(qw: QuantWeight, a: int, b: int, name: str) -> QuantWeight:
    """Rows ``[a, b)`` of a 2-D QuantWeight (splitting a fused gate_up into gate and up)."""
    bn = qw.scheme.group_n(qw.N)
    if a % bn or (b % bn and b != qw.N):
        raise ExportError(f"{name}: cannot split gate/up rows [{a}, {b}) out of {qw.scheme.scale.granularity} scales "
                          f"(scheme {qw.scheme.name})")
    sl = slice(a // bn, -(-b // bn))
    pick = lambda t, s: None if t is None else t[s]  # noqa: E731
    return QuantWeight(qw.data[a:b], qw.scales[sl], qw.scheme, (b - a, qw.K), pick(qw.zeros, sl), qw.global_scale,
                       qw.input_scale, pick(qw.bias, slice(a, b)))


def quantized_layers(model: nn.Module) -> tuple[dict[str, QuantWeight], list[str]]:
    """``({checkpoint layer name: 2-D QuantWeight}, [names of our modules])`` -- experts split per expert."""
    from ..nn import QuantLinear, QuantMoE
    from .loader import PermutedInput
    layers, modules = {}, []
    for name, m in model.named_modules():
        if any(name.startswith(p + ".") for p in modules):
            continue  # the QuantLinear inside a PermutedInput
        if isinstance(m, PermutedInput):
            inner = m.inner.quant_weight
            layers[name] = dataclasses.replace(inner, bias=m.inner.bias, k_perm=m.k_perm, cache={})
        elif isinstance(m, QuantLinear):
            layers[name] = dataclasses.replace(m.quant_weight, bias=m.bias, cache={})
        elif isinstance(m, QuantMoE):
            if m.activation != "silu":
                raise ExportError(f"{name}: {m.activation} experts (gpt-oss layout) cannot be written per expert; "
                                  "only SwiGLU experts (Qwen3-MoE / Mixtral / DeepSeek style) are exported")
            if not name.endswith(".experts") and name != "experts":
                raise ExportError(f"{name}: the loader finds per-expert layers under a module named 'experts'")
            gu, dn = m.gate_up_weight, m.down_weight
            if gu.k_perm is not None or dn.k_perm is not None:
                raise ExportError(f"{name}: act-order (k_perm) experts cannot be exported")
            inter = m.intermediate_dim
            for e in range(m.num_experts):
                g = gu.expert(e)
                layers[f"{name}.{e}.gate_proj"] = _rows(g, 0, inter, name)
                layers[f"{name}.{e}.up_proj"] = _rows(g, inter, 2 * inter, name)
                layers[f"{name}.{e}.down_proj"] = dn.expert(e)
        else:
            continue
        modules.append(name)
    return layers, modules


def _gptq(layers: dict[str, QuantWeight]) -> tuple[dict, dict]:
    tensors, seen = {}, {}
    for name, qw in layers.items():
        t, st = gptq_layer(qw, name)
        tensors.update(t)
        seen.setdefault((st["bits"], st["group_size"]), []).append((name, st))
    if len(seen) > 1:
        desc = "; ".join(f"bits={b} group_size={g}: {v[0][0]} (+{len(v) - 1})" for (b, g), v in seen.items())
        raise ExportError(f"a GPTQ checkpoint has one bits/group_size for every layer; this model mixes {desc}. "
                          "Use format='compressed-tensors' (one config group per scheme)")
    (bits, group), entries = next(iter(seen.items()))
    qcfg = {"quant_method": "gptq", "bits": bits, "group_size": group,
            "desc_act": any(st["desc_act"] for _, st in entries), "sym": all(st["sym"] for _, st in entries),
            "checkpoint_format": "gptq_v2"}
    return tensors, qcfg


def _compressed_tensors(layers: dict[str, QuantWeight], ignore: list[str]) -> tuple[dict, dict]:
    from .compressed_tensors import DENSE_SINCE
    tensors, groups, inexact = {}, {}, []
    for name, qw in layers.items():
        t, form, wcfg, acfg = ct_layer(qw, name, inexact)
        tensors.update(t)
        key = json.dumps([form, wcfg, acfg], sort_keys=True)
        groups.setdefault(key, (form, wcfg, acfg, []))[3].append(name)
    if inexact:
        warnings.warn(f"compressed-tensors stores the reciprocal of the NVFP4 global scale; for {len(inexact)} "
                      f"layer(s) (first: {inexact[0]}) no float32 value has our global scale as its exact reciprocal, "
                      "so they reload with a global scale 1 ulp off", stacklevel=3)
    config_groups = {}
    for i, (form, wcfg, acfg, names) in enumerate(groups.values()):
        # one group: target the Linear class, as llm-compressor writes; several: the exact layer names
        config_groups[f"group_{i}"] = {"targets": ["Linear"] if len(groups) == 1 else names, "weights": wcfg,
                                       "input_activations": acfg, "output_activations": None, "format": form}
    forms = {g["format"] for g in config_groups.values()}
    qcfg = {"quant_method": "compressed-tensors", "format": forms.pop() if len(forms) == 1 else "mixed-precision",
            "quantization_status": "compressed", "config_groups": config_groups, "ignore": ignore,
            # the writer packs 3/5/6/7-bit codes densely; declare a version the importer reads as dense
            "version": ".".join(map(str, DENSE_SINCE))}
    return tensors, qcfg


def _plain_tensors(model: nn.Module, skip: list[str]) -> dict[str, torch.Tensor]:
    out, ptrs = {}, set()
    prefixes = tuple(f"{p}." for p in skip)
    for key, v in model.state_dict().items():
        if v is None or key.startswith(prefixes):
            continue
        v = v.detach().cpu().contiguous()
        if v.data_ptr() in ptrs:  # tied weights (lm_head / embeddings): safetensors refuses shared storage
            v = v.clone()
        ptrs.add(v.data_ptr())
        out[key] = v
    return out


def save_quantized(model: nn.Module, out_dir: str, format: str = "gptq") -> str:
    """Write ``model`` (quantized with ``ht.replace_linear`` or loaded with ``ht.load_quantized``) to
    ``out_dir`` as ``config.json`` + ``model.safetensors`` in ``format`` (``"gptq"`` or
    ``"compressed-tensors"``); ``ht.load_quantized(out_dir)`` reads it back exactly.  Returns ``out_dir``."""
    from safetensors.torch import save_file
    fmt = _ALIASES.get(str(format).lower())
    if fmt is None:
        raise ValueError(f"unknown export format {format!r}; expected one of {EXPORT_FORMATS}")
    if not hasattr(model, "config") or not hasattr(model.config, "to_dict"):
        raise TypeError("save_quantized needs a Hugging Face model (with .config) so the checkpoint can be rebuilt")
    layers, modules = quantized_layers(model)
    if not layers:
        raise ValueError("the model has no QuantLinear / QuantMoE modules; quantize it first with ht.replace_linear")
    layers = {n: qw.to("cpu") for n, qw in layers.items()}
    if fmt == "gptq":
        qtensors, qcfg = _gptq(layers)
    else:
        ignore = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        qtensors, qcfg = _compressed_tensors(layers, ignore)
    tensors = _plain_tensors(model, modules)
    clash = sorted(set(tensors) & set(qtensors))
    if clash:
        raise ExportError(f"quantized layer tensors collide with model tensors: {clash[:5]}")
    tensors.update(qtensors)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    if not cfg.get("architectures"):
        cfg["architectures"] = [type(model).__name__]
    cfg["quantization_config"] = qcfg
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True, default=str)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return out_dir
