"""Checkpoint importers: producers' packed tensors -> our canonical ``QuantWeight``, exactly (no re-quantization).

One module per producer family (gptq, awq, compressed_tensors, fp8_block, gpt_oss, modelopt, hqq); each
docstring states the producer layout it reads and how it maps onto a QuantScheme.  ``loader`` reads a model
directory and builds the Hugging Face model with our modules; ``fuse`` stacks per-expert layers; ``sharding``
(``ShardSpec``) makes ``read_quantized_tensors`` read one tensor / expert parallel rank's shard of each layer.
"""
from ._common import CheckpointFormatError
from .awq import import_awq_layer
from .compressed_tensors import import_fp4, import_pack_quantized, import_unpacked
from .export import EXPORT_FORMATS, ExportError, save_quantized
from .fp8_block import import_fp8_layer
from .fuse import concat_n, fuse_experts, stack_experts
from .gpt_oss import import_experts_proj
from .gptq import import_gptq_layer
from .hqq import import_hqq_layer
from .loader import IMPORTERS, PermutedInput, load_quantized, quantization_config, read_quantized_tensors
from .modelopt import import_nvfp4_layer
from .sharding import DEFAULT_PLAN, ShardSpec

__all__ = [
    "CheckpointFormatError", "import_awq_layer", "import_fp4", "import_pack_quantized", "import_unpacked",
    "import_fp8_layer", "concat_n", "fuse_experts", "stack_experts", "import_experts_proj", "import_gptq_layer",
    "import_hqq_layer", "IMPORTERS", "PermutedInput", "load_quantized", "quantization_config",
    "read_quantized_tensors", "import_nvfp4_layer", "save_quantized", "ExportError", "EXPORT_FORMATS",
    "ShardSpec", "DEFAULT_PLAN",
]
