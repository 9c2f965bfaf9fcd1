"""What the ``triton`` and ``torch`` backends share: their candidates are the kernel families registered for
them (``kernels/families/``), and a call runs the family dispatch chose."""
from __future__ import annotations

import dataclasses

from ..calls import Call, Candidate, KernelConfig
from . import Backend


def stored_k_order(x, qw):
    """An act-order weight runs in its stored K order: gather x's K once per call instead (formats/weight.py)."""
    if qw.k_perm is None:
        return x, qw
    state = qw.cache.setdefault("triton", {})
    stored = state.get("stored_k_order")
    if stored is None:  # its own cache: the stored-order weight must not see the logical one's state
        stored = state["stored_k_order"] = dataclasses.replace(qw, k_perm=None, cache={})
    return x.index_select(-1, qw.k_perm), stored


def family_reason(fam, call: Call) -> str | None:
    """Why a kernel family cannot run a call: its own reason, else the device lacking the MMA it needs."""
    why = fam.reason(call)
    if why is None and call.facts is not None:
        from ..capability import mma_reason
        why = mma_reason(fam.mma(call), call.facts)
    return why


def config_of(cand: Candidate | None) -> KernelConfig | None:
    """The config a candidate runs: its own, or its family's defaults (never the heuristic's other family)."""
    if cand is None:
        return None
    return cand.config if cand.config is not None else KernelConfig(cand.family)


class FamilyBackend(Backend):
    def _families(self, op: str):
        from ..kernels import families
        return families.registered(op, self.name)

    def family_reasons(self, call: Call) -> dict[str, str | None]:
        return {f.name: family_reason(f, call) for f in self._families(call.op)}

    def reason(self, call: Call) -> str | None:
        reasons = self.family_reasons(call)
        if not reasons:
            return f"no {self.name} kernel family for {call.op}"
        if any(r is None for r in reasons.values()):
            return None
        return "; ".join(f"{name}: {why}" for name, why in reasons.items())

    def candidates(self, call: Call) -> list[Candidate]:
        return [Candidate(self.name, f.name, cfg) for f in self._families(call.op) if family_reason(f, call) is None
                for cfg in f.candidates(call)]

    def quant_linear(self, x, qw, bias, out_dtype, cand):
        from ..kernels.dense import triton_linear
        x, qw = stored_k_order(x, qw)
        return triton_linear(x, qw, bias, out_dtype, config=config_of(cand))

    def plan_linear(self, x, qw, bias, out_dtype, cand):
        if qw.k_perm is not None:  # the per-call gather of x stays on the full path
            return None
        from ..kernels.dense import linear_runner
        return linear_runner(x, qw, bias, out_dtype, config_of(cand))

    @staticmethod
    def family(cand: Candidate):
        from ..kernels import families
        return families.get(cand.family)
