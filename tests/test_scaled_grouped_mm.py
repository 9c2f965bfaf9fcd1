"""MoE experts with per-token e4m3 activations on torch's fp8 grouped GEMM (families ``scaled_grouped_mm``,
``scaled_grouped_mm_mx``; torch backend).

CPU: MXFP4 experts become exact e4m3 rows (bit for bit after the row scale), the families' reasons.  GPU
(``-m gpu``): both against the reference over uneven and empty experts; an expert bias, an fp16 output and experts
too wide for e4m3 run the Triton grouped kernel instead (a bias on the bf16 product would round twice)."""
import warnings

import pytest
import torch

import humming_triton as ht
from humming_triton.calls import Call, KernelConfig
from humming_triton.kernels import families
from humming_triton.kernels.families.scaled_grouped_mm import expert_e4m3_rows
from humming_triton.kernels.families.scaled_mm_mx import MAX_SPAN
from humming_triton.testing import assert_linear_close, poison_like


def _experts(scheme, e, n, k, rng, spread=0, bias=True):
    w = torch.randn(e, n, k, generator=rng) * 0.05
    if spread:  # blocks' magnitudes ramp over that many binades along K
        w = w * torch.exp2(torch.linspace(0, spread, k // 32)).repeat_interleave(32)
    return ht.quantize_weight(w, scheme, bias=torch.randn(e, n, generator=rng) if bias else None)


@pytest.mark.parametrize("spread", [0, 6])
def test_expert_rows_are_exact(spread, rng):
    qw = _experts("w4a8-mxfp4", 3, 48, 256, rng, spread)
    w, s = expert_e4m3_rows(qw)
    assert w.dtype == torch.float8_e4m3fn and w.shape == (3, 48, 256) and s.shape == (3, 48)
    assert torch.equal(w.float() * s[..., None], ht.dequantize_weight(qw).float())
    assert expert_e4m3_rows(qw)[0] is w  # cached on the weight


def test_too_wide_experts_are_named(rng):
    why = expert_e4m3_rows(_experts("w4a8-mxfp4", 2, 32, 1024, rng, spread=MAX_SPAN + 4))
    assert isinstance(why, str) and "binades" in why


def test_family_reasons():
    def call(scheme, n=1536, k=2048, dev="cuda", dtype=torch.bfloat16, experts=8, op="grouped_linear"):
        return Call(op, ht.QuantScheme.parse(scheme), dtype, 64, n, k, experts=experts, device_type=dev)

    fp8, mx = families.get("scaled_grouped_mm"), families.get("scaled_grouped_mm_mx")
    assert fp8.backend == mx.backend == "torch" and fp8.op == mx.op == "grouped_linear"
    assert fp8.reason(call("w8a8-fp8")) is None and mx.reason(call("w4a8-mxfp4")) is None
    assert "e4m3 experts" in fp8.reason(call("w4a8-mxfp4"))
    assert "MXFP4" in mx.reason(call("w8a8-fp8"))
    assert "per-token e4m3" in mx.reason(call("w4a8-mx"))
    assert "per-token e4m3" in fp8.reason(call("w4a16"))
    assert "CUDA" in mx.reason(call("w4a8-mxfp4", dev="cpu"))
    assert "bf16 activations only" in mx.reason(call("w4a8-mxfp4", dtype=torch.float16))
    assert "multiple of 16" in mx.reason(call("w4a8-mxfp4", n=1540))
    assert "grouped_linear" in mx.reason(call("w4a8-mxfp4", experts=0, op="quant_linear"))


def _routed(counts, k, rng):
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(counts), 0)
    return torch.randn(int(offsets[-1]), k, generator=rng).to(torch.bfloat16), offsets


@pytest.mark.gpu
@pytest.mark.parametrize("family,scheme", [("scaled_grouped_mm", "w8a8-fp8"), ("scaled_grouped_mm_mx", "w4a8-mxfp4")])
@pytest.mark.parametrize("counts", [[1, 0, 3, 1, 0, 2, 9, 1], [70, 0, 133, 5, 300, 1, 0, 64]], ids=["decode", "prefill"])
@pytest.mark.parametrize("bias", [False, True])
def test_family_matches_reference(family, scheme, counts, bias, rng):
    """Rows of each expert against its own weight, within the fp8 tensor cores' accumulation and the bf16 output.
    With a bias (measured: 1-6 elements in 10^4 off when it was added to the bf16 product) the Triton kernel runs."""
    n, k = 1040, 2048
    qw = _experts(scheme, len(counts), n, k, rng, spread=5 if "mxfp4" in scheme else 0, bias=bias).to("cuda")
    x, offsets = _routed(counts, k, rng)
    out = poison_like(torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda"))
    y = families.get(family).run(x.cuda(), offsets.cuda(), qw, qw.bias, torch.bfloat16, KernelConfig(family), out)
    assert y.data_ptr() == out.data_ptr()
    x_hat = ht.dequantize_activation(ht.quantize_activation(x, qw.scheme.act)).double()
    w_hat = ht.dequantize_weight(qw.to("cpu")).double()
    for i, c in enumerate(counts):
        rows = slice(int(offsets[i]), int(offsets[i + 1]))
        if c:
            ref = x_hat[rows] @ w_hat[i].T + (qw.bias[i].double().cpu() if bias else 0)
            assert_linear_close(y[rows].cpu(), ref, x_hat[rows], w_hat[i], torch.float8_e4m3fn, f"{family} expert {i}")


@pytest.mark.gpu
def test_through_dispatch_and_empty_batch(rng):
    """``backend="torch"`` with the family's candidate: the op's answer, and no rows at all."""
    qw = _experts("w4a8-mxfp4", 4, 256, 512, rng).to("cuda")
    x, offsets = _routed([5, 0, 17, 2], 512, rng)
    from humming_triton.calls import Candidate
    cand = Candidate("torch", "scaled_grouped_mm_mx", KernelConfig("scaled_grouped_mm_mx"))
    from humming_triton import backends
    y = backends.get("torch").grouped_linear(x.cuda(), qw, offsets.cuda(), qw.bias, torch.bfloat16, cand)
    ref = ht.reference_grouped_linear(x, qw.to("cpu"), offsets, out_dtype=torch.float32)
    assert float((y.cpu().float() - ref).norm() / ref.norm()) < 1e-2
    empty = families.get("scaled_grouped_mm_mx").run(x[:0].cuda(), torch.zeros(5, dtype=torch.int64).cuda(), qw,
                                                     None, torch.bfloat16, KernelConfig("scaled_grouped_mm_mx"), None)
    assert empty.shape == (0, 256)


@pytest.mark.gpu
def test_fp16_output_and_too_wide_experts_run_the_triton_kernel(rng):
    fam = families.get("scaled_grouped_mm_mx")
    cfg = KernelConfig("scaled_grouped_mm_mx")
    x, offsets = _routed([3, 0, 6], 1024, rng)
    x, offsets = x.cuda(), offsets.cuda()
    qw = _experts("w4a8-mxfp4", 3, 64, 1024, rng).to("cuda")
    y = fam.run(x, offsets, qw, None, torch.float16, cfg, None)
    assert y.dtype == torch.float16
    assert not bool((y.float() == y.to(torch.bfloat16).float()).all()), "the fp16 output went through bf16"
    wide = _experts("w4a8-mxfp4", 3, 64, 1024, rng, spread=MAX_SPAN + 4).to("cuda")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        y = fam.run(x, offsets, wide, None, torch.bfloat16, cfg, None)
        fam.run(x, offsets, wide, None, torch.bfloat16, cfg, None)
    assert sum("Triton grouped kernel" in str(r.message) for r in rec) == 1  # once per weight
    ref = ht.reference_grouped_linear(x.cpu(), wide.to("cpu"), offsets.cpu(), out_dtype=torch.float32)
    assert float((y.cpu().float() - ref).norm() / ref.norm()) < 1e-2
