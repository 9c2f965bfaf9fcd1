"""replace_linear: convert a loaded model in place, following Hugging Face's naming conventions.

Why a pattern matcher of our own: ``modules_to_not_convert`` lists in HF configs mix three kinds of entry --
a module path prefix (``model.layers.0``), a regex (``model.layers.*.self_attn``) and a bare suffix
(``lm_head``, ``mlp.gate``).  All three match only at module boundaries, so ``layers.1`` never catches
``layers.11`` and ``gate`` never catches ``gate_proj``.

Why experts are first-class: in transformers >= 5 MoE experts are fused 3-D parameters, not ``nn.Linear``; a
converter that walks only linears leaves the bulk of an MoE model's weights unquantized without a word.
"""
from __future__ import annotations

import logging
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from torch import nn

from ..formats.scheme import QuantScheme
from .linear import QuantLinear
from .moe import QuantMoE, experts_weights, is_experts_module

__all__ = ["replace_linear", "ReplaceReport", "matches_any"]

log = logging.getLogger("humming_triton")
PROGRESS_THRESHOLD = 64  # candidate modules above which a progress bar is shown (progress=None)


def _matches(name: str, pattern: str) -> bool:
    if name == pattern or name.startswith(pattern + ".") or name.endswith("." + pattern) or f".{pattern}." in f".{name}.":
        return True
    try:  # regex anchored at the start and ending at a module boundary
        return re.match(rf"(?:{pattern})(?=\.|$)", name) is not None
    except re.error:
        return False


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    """True when ``name`` is caught by a prefix, suffix, inner path or regex pattern (module boundaries only)."""
    return any(_matches(name, p) for p in patterns)


@dataclass
class ReplaceReport:
    scheme: str
    backend: str
    replaced: dict[str, str] = field(default_factory=dict)   # name -> "linear" | "experts"
    skipped: dict[str, str] = field(default_factory=dict)    # name -> why (pattern or incompatible shape)

    def __str__(self) -> str:
        n_lin = sum(k == "linear" for k in self.replaced.values())
        n_exp = len(self.replaced) - n_lin
        by_pattern = sum(r.startswith("skip pattern") for r in self.skipped.values())
        lines = [f"humming_triton.replace_linear: scheme={self.scheme} backend={self.backend}: replaced {n_lin} "
                 f"linear and {n_exp} experts modules; skipped {by_pattern} by pattern, "
                 f"{len(self.skipped) - by_pattern} incompatible"]
        lines += [f"  not converted {n}: {r}" for n, r in self.skipped.items() if not r.startswith("skip pattern")]
        return "\n".join(lines)

    def skip_summary(self, limit: int = 5) -> str:
        """The skip reasons grouped with counts, most common first: "2 x group size 128 does not divide K=500,
        1 x skip pattern".  Why: the warning a user sees must say why, not only how many (issue 18)."""
        groups = Counter(self.skipped.values()).most_common()
        parts = [f"{n} x {why}" for why, n in groups[:limit]]
        if len(groups) > limit:
            parts.append(f"{sum(n for _, n in groups[limit:])} more with {len(groups) - limit} other reasons")
        return ", ".join(parts)


def _incompatible(scheme: QuantScheme, n: int, k: int) -> str | None:
    """Why an [N, K] weight cannot take this scheme (None if it can) -- checked before spending time quantizing."""
    bk = scheme.scale.block_k
    if bk and scheme.scale.block_n == 1 and k % bk:
        return f"group size {bk} does not divide K={k}"
    if scheme.act is not None and scheme.act.group_k and k % scheme.act.group_k:
        return f"activation group size {scheme.act.group_k} does not divide K={k}"
    return None


def _convert(module: nn.Module, scheme: QuantScheme, backend: str) -> tuple[nn.Module | None, str]:
    if isinstance(module, nn.Linear):
        why = _incompatible(scheme, module.out_features, module.in_features)
        return (None, why) if why else (QuantLinear.from_linear(module, scheme, backend), "linear")
    try:
        gu, dn, *_ = experts_weights(module)
    except ValueError as e:
        return None, str(e)
    why = _incompatible(scheme, gu.shape[1], gu.shape[2]) or _incompatible(scheme, dn.shape[1], dn.shape[2])
    return (None, why) if why else (QuantMoE.from_experts(module, scheme, backend), "experts")


def _progress(items: list, enabled: bool | None):
    if enabled is False or (enabled is None and len(items) <= PROGRESS_THRESHOLD):
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc="humming_triton: quantizing", unit="module")


def replace_linear(model: nn.Module, scheme: "QuantScheme | str", skip: Iterable[str] = ("lm_head",),
                   modules_to_not_convert: Iterable[str] | None = None, backend: str = "auto", *,
                   experts: bool = True, progress: bool | None = None, verbose: bool = False) -> nn.Module:
    """Quantize every ``nn.Linear`` (and, with ``experts=True``, every fused 3-D experts module) of ``model`` in
    place with ``scheme``, except names matched by ``skip`` or ``modules_to_not_convert``.

    Layers the scheme cannot take (a group size that does not divide K, ...) are left as they are and listed.
    Returns the model; the replaced names are in ``model._humming_triton_replaced`` and the full
    :class:`ReplaceReport` in ``model._humming_triton_report``.  Warns when nothing was replaced.
    """
    scheme = QuantScheme.parse(scheme)
    patterns = [*(skip or ()), *(modules_to_not_convert or ())]
    report = ReplaceReport(scheme.name, backend)
    candidates = []
    for name, m in model.named_modules():
        if not (isinstance(m, nn.Linear) or (experts and is_experts_module(m))):
            continue
        if name == "":
            raise ValueError("replace_linear converts sub-modules; wrap a bare nn.Linear with QuantLinear.from_linear")
        if matches_any(name, patterns):
            report.skipped[name] = "skip pattern"
            continue
        candidates.append(name)
    for name in _progress(candidates, progress):
        new, what = _convert(model.get_submodule(name), scheme, backend)
        if new is None:
            report.skipped[name] = what
            continue
        model.set_submodule(name, new)
        report.replaced[name] = what
    model._humming_triton_replaced = list(report.replaced)
    model._humming_triton_report = report
    if not report.replaced:
        why = f": {report.skip_summary()}" if report.skipped else ""
        warnings.warn(f"humming_triton.replace_linear replaced nothing (scheme {scheme.name}; "
                      f"{len(report.skipped)} candidates skipped{why}; patterns {patterns}); is this the right model?",
                      stacklevel=2)
    (print if verbose else log.info)(str(report))
    return model
