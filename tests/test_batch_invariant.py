"""Batch-invariant mode (humming_triton/batch_invariant.py): every output row is bitwise the same whatever the
batch size and whatever the other rows are -- on the Triton path (interpreter here, CUDA with -m gpu) and on the
reference.  Calls that cannot be invariant are refused with the reason."""
import pytest
import torch

import humming_triton as ht
from humming_triton import dispatch

SCHEMES = ["w4a16", "w4a16-asym", "w8a16", "mxfp4", "nvfp4", "w8a8-fp8", "w8a8-int8", "w3a16"]
MS = [1, 2, 3, 7, 16, 17, 64, 129, 300]


def _rows_are_invariant(qw, x, backend="auto"):
    with ht.batch_invariant():
        full = ht.quant_linear(x, qw, backend=backend)
        plan = dispatch.last_plan()
        for m in MS:
            if m > x.shape[0]:
                continue
            for start in {0, x.shape[0] - m}:  # the rows at the front and at the back of the batch
                part = ht.quant_linear(x[start:start + m].clone(), qw, backend=backend)
                assert torch.equal(part, full[start:start + m]), (qw.scheme.name, m, start, plan)
                assert dispatch.last_plan() == plan, "the path must not depend on M"
    return plan


@pytest.mark.interpret
@pytest.mark.parametrize("scheme", SCHEMES)
def test_triton_rows_do_not_depend_on_the_batch(scheme, rng):
    if not torch.cuda.is_available():
        import os
        assert os.environ.get("TRITON_INTERPRET") == "1"
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    qw = ht.quantize_weight(torch.randn(40, 256, generator=rng), scheme).to(dev)
    x = torch.randn(300, 256, generator=rng).to(torch.bfloat16).to(dev)
    plan = _rows_are_invariant(qw, x, backend="triton")
    assert plan.startswith("triton/tiled") or plan.startswith("triton/act_tiled"), plan
    assert " sk=1 " in plan  # no split-K


@pytest.mark.parametrize("scheme", ["w4a16", "w8a8-int8"])
def test_reference_rows_do_not_depend_on_the_batch(scheme, rng):
    qw = ht.quantize_weight(torch.randn(40, 256, generator=rng), scheme)
    x = torch.randn(300, 256, generator=rng)
    assert _rows_are_invariant(qw, x, backend="reference") == "reference"


@pytest.mark.interpret
def test_grouped_rows_do_not_depend_on_the_batch(rng):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    qw = ht.quantize_weight(torch.randn(4, 32, 128, generator=rng), "w4a16").to(dev)
    x = torch.randn(40, 128, generator=rng).to(torch.bfloat16).to(dev)
    offsets = torch.tensor([0, 10, 10, 33, 40], device=dev)
    with ht.batch_invariant():
        full = ht.grouped_linear(x, qw, offsets, backend="triton")
        # expert 2's rows alone (as if the batch held only them)
        alone = ht.grouped_linear(x[10:33].clone(), qw, torch.tensor([0, 0, 0, 23, 23], device=dev), backend="triton")
    assert torch.equal(alone, full[10:33])


def test_refusals_name_the_reason(rng):
    x = torch.randn(3, 256, generator=rng)
    nv = ht.quantize_weight(torch.randn(32, 256, generator=rng), "w4a4-nvfp4")
    with ht.batch_invariant():
        with pytest.raises(RuntimeError, match="one global scale over the whole batch"):
            ht.quant_linear(x, nv)
        w4 = ht.quantize_weight(torch.randn(32, 256, generator=rng), "w4a16")
        with pytest.raises(RuntimeError, match="chooses its kernels by M"):
            ht.quant_linear(x, w4, backend="torch")
    assert not ht.is_batch_invariant()
    ht.set_batch_invariant(True)
    try:
        assert ht.is_batch_invariant()
    finally:
        ht.set_batch_invariant(False)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4", "w8a8-fp8"])
def test_gpu_rows_do_not_depend_on_the_batch_at_llm_shapes(scheme, rng):
    qw = ht.quantize_weight(torch.randn(4096, 4096, generator=rng) * 0.02, scheme).to("cuda")
    x = torch.randn(300, 4096, generator=rng).to(torch.bfloat16).cuda()
    _rows_are_invariant(qw, x)
