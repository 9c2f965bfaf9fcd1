"""What the bits mean: element types, schemes, the canonical packed weight, reference (de)quantization."""
from .activation import QuantActivation, dequantize_activation, quantize_activation
from .dtypes import ElementType, FloatType, IntType, WideFloat, parse_element_type, parse_scale_type
from .packing import pack_codes, packed_words, unpack_codes
from .quantize import dequantize_weight, quantize_weight
from .scheme import PRESETS, WEIGHT_ONLY_PRESETS, ActQuant, QuantScheme, ScaleSpec
from .weight import LAYOUT, QuantWeight

__all__ = [
    "QuantActivation", "dequantize_activation", "quantize_activation", "ElementType", "FloatType", "IntType",
    "WideFloat", "parse_element_type", "parse_scale_type", "pack_codes", "packed_words", "unpack_codes",
    "dequantize_weight", "quantize_weight", "PRESETS", "WEIGHT_ONLY_PRESETS", "ActQuant", "QuantScheme",
    "ScaleSpec", "LAYOUT", "QuantWeight",
]
