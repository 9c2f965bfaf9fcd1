"""A scheme's structure as kernel constexprs: what every Triton kernel is specialised on."""
from __future__ import annotations

from ..formats.dtypes import FloatType, IntType, WideFloat
from ..formats.scheme import QuantScheme

SPECIAL_IDS = {"finite": 0, "fn": 1, "ieee": 2, "e8m0": 3}
ZERO_IDS = {"none": 0, "int": 1, "float": 2}


def _elem_constexprs(t, prefix: str) -> dict:
    if isinstance(t, IntType):
        return {f"{prefix}IS_FLOAT": False, f"{prefix}SIGNED": t.signed, f"{prefix}EXP": 0, f"{prefix}MAN": 0,
                f"{prefix}BIAS": 0, f"{prefix}SPECIAL": 0}
    assert isinstance(t, FloatType)
    return {f"{prefix}IS_FLOAT": True, f"{prefix}SIGNED": t.signed, f"{prefix}EXP": t.exp, f"{prefix}MAN": t.man,
            f"{prefix}BIAS": t.exp_bias, f"{prefix}SPECIAL": SPECIAL_IDS[t.special]}


def format_constexprs(scheme: QuantScheme, n: int, k: int) -> dict:
    """Everything structural about a weight format, as kernel constexprs (one compiled variant per format).
    Kernels list them as explicit parameters -- the repeated signatures are deliberate: a constexpr bundle
    (tuple/dataclass) is not portable across the Triton versions we run (3.6 on the H200, 3.8 in CI)."""
    sd = scheme.scale.dtype
    out = {"BITS": scheme.bits, "GROUP_K": scheme.group_k(k), "GROUP_N": scheme.group_n(n),
           "SCALE_IS_CODE": not isinstance(sd, WideFloat), "ZERO_KIND": ZERO_IDS[scheme.zero],
           "HAS_GLOBAL": scheme.scale.global_scale}
    out.update(_elem_constexprs(scheme.weight, "W_"))
    out.update(_elem_constexprs(sd if not isinstance(sd, WideFloat) else IntType(8, False), "S_"))
    return out
