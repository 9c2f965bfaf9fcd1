"""humming_triton: quantized LLM GEMM kernels in Triton, one library for every format.

Importing this package is light: it imports torch, never touches CUDA, and loads Triton kernels lazily.
"""
from .batch_invariant import batch_invariant, is_batch_invariant, set_batch_invariant
from .dispatch import last_backend, select_backend
from .formats import (PRESETS, ActQuant, FloatType, IntType, QuantActivation, QuantScheme, QuantWeight, ScaleSpec,
                      dequantize_activation, dequantize_weight, pack_codes, parse_element_type, quantize_activation,
                      quantize_weight, unpack_codes)
from .formats.quantize import QuantizationWarning
from .linear import fused_moe, grouped_linear, quant_linear
from .reference import reference_fused_moe, reference_grouped_linear, reference_linear
from .checkpoints import CheckpointFormatError, load_quantized, read_quantized_tensors
from .checkpoints.export import ExportError, save_quantized
from .nn import QuantLinear, QuantMoE, replace_linear

__version__ = "0.1.0"
__all__ = [
    "PRESETS", "ActQuant", "FloatType", "IntType", "QuantActivation", "QuantScheme", "QuantWeight", "ScaleSpec",
    "dequantize_activation", "dequantize_weight", "pack_codes", "parse_element_type", "quantize_activation",
    "quantize_weight", "unpack_codes", "quant_linear", "grouped_linear", "fused_moe", "reference_linear",
    "reference_grouped_linear", "reference_fused_moe", "last_backend", "select_backend",
    "set_batch_invariant", "is_batch_invariant", "batch_invariant",
    "QuantLinear", "QuantMoE", "replace_linear",
    "load_quantized", "read_quantized_tensors", "CheckpointFormatError",
    "save_quantized", "ExportError", "QuantizationWarning",
]
