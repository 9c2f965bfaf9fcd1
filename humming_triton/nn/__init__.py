"""nn integration: QuantLinear, QuantMoE (transformers >= 5 fused experts) and replace_linear.

Importing this needs only torch; transformers is never imported (experts are recognised by their tensors).
"""
from .linear import QuantLinear
from .moe import QuantMoE, experts_weights, is_experts_module
from .replace import ReplaceReport, matches_any, replace_linear

__all__ = ["QuantLinear", "QuantMoE", "ReplaceReport", "replace_linear", "matches_any", "is_experts_module",
           "experts_weights"]
