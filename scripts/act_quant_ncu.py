"""One launch of the per-token e4m3 quantizer at 4096 x 8192 and at the MoE rows (32768 x 2048), for ncu."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import humming_triton as ht  # noqa: E402
from humming_triton.kernels import dense  # noqa: E402

fp8 = ht.PRESETS["w8a8-fp8"].act
for m, k in ((4096, 8192), (32768, 2048)):
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    dense.triton_quantize_activation(x, fp8)
    torch.cuda.synchronize()
