"""No host sync on the hot path (issue 14): every registered path -- each backend x kernel family candidate that
can run the call -- serves a decode / mid-M step of ``quant_linear``, and the MoE paths a step of ``grouped_linear``
and ``fused_moe``, under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any implicit
device-to-host synchronization (``.item()``, a host read of a device tensor, a blocking copy, ``nonzero`` ...).

The first call of each path may sync (compilation, the one-time weight repack); the checked call is the second.
GPU only (``-m gpu``)."""
import contextlib

import pytest
import torch

import humming_triton as ht
from humming_triton import backends
from humming_triton.dispatch import call_for

pytestmark = pytest.mark.gpu

SCHEMES = ["w4a16", "w4a16-asym", "w8a16", "mxfp4", "nvfp4", "w8a16-fp8", "w8a8-fp8", "w8a8-int8", "w4a8-mxfp4",
           "w4a4-nvfp4", "w8a8-mxfp8"]
MAX_CANDIDATES = 4  # per backend and call: the families differ, not their tiles


@contextlib.contextmanager
def sync_is_an_error():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _families(b, call):
    """Up to MAX_CANDIDATES candidates of a backend, one per family first."""
    seen, out = set(), []
    for cand in b.candidates(call):
        if cand.family not in seen:
            seen.add(cand.family)
            out.append(cand)
    return out[:MAX_CANDIDATES]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m", [1, 16, 256])
def test_quant_linear_paths_do_not_sync(scheme, m, rng):
    qw = ht.quantize_weight(torch.randn(512, 1024, generator=rng) * 0.05, scheme,
                            bias=torch.randn(512, generator=rng)).to("cuda")
    x = torch.randn(m, 1024, generator=rng).to(torch.bfloat16).cuda()
    call = call_for("quant_linear", x, qw)  # with the device's facts: only paths this GPU can run
    ran = []
    for name, b in backends.registered().items():
        if name == "reference" or b.reason(call) is not None:
            continue
        for cand in _families(b, call):
            b.quant_linear(x, qw, qw.bias, x.dtype, cand)  # warm: compile, repack
            with sync_is_an_error():
                b.quant_linear(x, qw, qw.bias, x.dtype, cand)
            ran.append(f"{name}/{cand.family}")
    with sync_is_an_error():  # and the op users call, through auto dispatch
        ht.quant_linear(x, qw)
    assert ran, f"no backend ran {scheme} M={m}"


@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4", "w8a8-fp8"])
@pytest.mark.parametrize("tokens", [1, 16, 300])
def test_moe_paths_do_not_sync(scheme, tokens, rng):
    e, h, inter, topk = 8, 256, 128, 2
    w13 = ht.quantize_weight(torch.randn(e, 2 * inter, h, generator=rng) * 0.05, scheme).to("cuda")
    w2 = ht.quantize_weight(torch.randn(e, h, inter, generator=rng) * 0.05, scheme).to("cuda")
    hidden = torch.randn(tokens, h, generator=rng).to(torch.bfloat16).cuda()
    logits = torch.randn(tokens, e, generator=rng).cuda()
    topk_w, topk_ids = torch.topk(torch.softmax(logits, -1), topk, dim=-1)
    ht.fused_moe(hidden, w13, w2, topk_w, topk_ids)
    with sync_is_an_error():
        ht.fused_moe(hidden, w13, w2, topk_w, topk_ids)
    counts = torch.bincount(topk_ids.flatten().cpu(), minlength=e)
    offsets = torch.zeros(e + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(counts, 0)
    offsets = offsets.cuda()
    x = torch.randn(tokens * topk, h, generator=rng).to(torch.bfloat16).cuda()
    ht.grouped_linear(x, w13, offsets)
    with sync_is_an_error():
        ht.grouped_linear(x, w13, offsets)
