"""Probe (H200): which launch of the fp8-activation GEMM matches its exact oracle at M >= 33.

The GPU tests found ~1 % of outputs off by a few % on fp8 wgmma tiles (BLOCK_M >= 64) while M = 1 (mma.sync)
passed.  Since session 3, 64/128-row tiles feed the e4m3 codes to a bf16 wgmma instead (dense.act_kind: 5), so
the bm64 / bm128 variants below now probe that path (the imprecise-accumulation option no longer applies).
Each variant is checked with the tests' own oracle and tolerance (tests/test_act_quant_kernels.py): the kernel's
activation codes dequantized, times the dequantized weight, in float64.  Prints max(err / tolerance) per case.
Usage (repository root): PYTHONPATH=. python3 scripts/fp8_probe.py
"""
import torch

import humming_triton as ht
import humming_triton.kernels.dense as dense
from humming_triton.formats.activation import QuantActivation
from humming_triton.kernels.configs import DenseConfig
from humming_triton.testing import linear_tolerance

KERNEL = dense.dense_tiled_kernel


class _WithOptions:
    """dense_tiled_kernel with extra Triton compile options (e.g. max_num_imprecise_acc_default)."""

    def __init__(self, **opts):
        self.opts = opts

    def __getitem__(self, grid):
        return lambda *a, **k: KERNEL[grid](*a, **k, **self.opts)


def worst(scheme, m, n, k, cfg, opts):
    g = torch.Generator().manual_seed(m * 7 + n)
    qw = ht.quantize_weight(torch.randn(n, k, generator=g), scheme).to("cuda")
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).cuda()
    if cfg is not None:  # keep BLOCK_K inside the scheme's groups, as fp8_config does
        bk = dense.act_config(m, n, k, qw.scheme).block_k
        cfg = DenseConfig(**{**cfg.__dict__, "block_k": min(cfg.block_k, bk)})
    dense.dense_tiled_kernel = _WithOptions(**opts) if opts else KERNEL
    try:
        y = dense.triton_linear(x, qw, config=cfg)
    finally:
        dense.dense_tiled_kernel = KERNEL
    act = qw.scheme.act
    q = dense.triton_quantize_activation(x, act)
    x_hat = ht.dequantize_activation(QuantActivation(q.codes.cpu(), q.scales.cpu(), act))
    w_hat = ht.dequantize_weight(qw.to("cpu"))
    ref = x_hat.double() @ w_hat.double().T
    tol = linear_tolerance(x_hat, w_hat, ref, torch.float32, y.dtype)
    return float(((y.cpu().double() - ref).abs() / tol).max())


def main():
    variants = {
        "default": (None, {}),
        "bm16": (DenseConfig("act_tiled", 16, 64, 128, 1, 8, 4, 3), {}),
        "bm64": (DenseConfig("act_tiled", 64, 64, 128, 1, 8, 4, 3), {}),
        "bm64-acc32": (DenseConfig("act_tiled", 64, 64, 128, 1, 8, 4, 3), {"max_num_imprecise_acc_default": 32}),
        "bm64-bk32": (DenseConfig("act_tiled", 64, 64, 32, 1, 8, 4, 3), {}),
        "bm64-stages1": (DenseConfig("act_tiled", 64, 64, 128, 1, 8, 4, 1), {}),
        "bm128-acc32": (DenseConfig("act_tiled", 128, 128, 128, 1, 8, 8, 3), {"max_num_imprecise_acc_default": 32}),
    }
    cases = [("w8a8-fp8", 33, 1000, 2048), ("w8a8-fp8", 512, 768, 1024), ("w8a8-fp8-block", 512, 768, 1024),
             ("w4a8-mxfp4", 512, 768, 1024), ("w4a8-fp8", 512, 768, 1024)]
    for name, (cfg, opts) in variants.items():
        row = []
        for scheme, m, n, k in cases:
            try:
                row.append(f"{scheme}/{m}: {worst(scheme, m, n, k, cfg, opts):.2f}")
            except Exception as e:  # noqa: BLE001
                row.append(f"{scheme}/{m}: {type(e).__name__} {str(e)[:80]}")
        print(f"{name:14s} " + "  ".join(row), flush=True)


def gpt_oss_capture():
    """Is the *unquantized* tiny gpt-oss (HF code only) capturable in a CUDA graph?  Tells whether the failing
    graph capture of the quantized one comes from HF's forward or from ours."""
    import transformers
    cfg = transformers.GptOssConfig(vocab_size=256, hidden_size=256, num_hidden_layers=2, num_attention_heads=2,
                                    num_key_value_heads=1, head_dim=128, max_position_embeddings=64,
                                    intermediate_size=128, num_local_experts=4, num_experts_per_tok=2,
                                    layer_types=["sliding_attention", "full_attention"], sliding_window=32,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    for quant in (None, "mxfp4"):
        model = transformers.GptOssForCausalLM(cfg).eval()
        if quant:
            ht.replace_linear(model, quant, backend="triton")
        model = model.to("cuda", torch.bfloat16)
        ids = torch.randint(0, 256, (2, 8), device="cuda")
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                model(ids, use_cache=False)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                model(ids, use_cache=False)
            print(f"gpt-oss {quant or 'bf16'}: captured", flush=True)
        except Exception as e:  # noqa: BLE001
            import traceback
            tb = traceback.extract_tb(e.__traceback__)
            print(f"gpt-oss {quant or 'bf16'}: {type(e).__name__}: {str(e)[:120]} at "
                  + " <- ".join(f"{f.filename.split('/')[-1]}:{f.lineno}" for f in tb[-6:]), flush=True)


if __name__ == "__main__":
    gpt_oss_capture()
    main()
