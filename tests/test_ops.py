"""The torch.library custom ops: schema/fake/aot checks (opcheck), agreement with the Python API, the
per-weight cache, and torch.compile(fullgraph=True) on CPU with the reference backend."""
import shutil

import pytest
import torch

import humming_triton as ht
from humming_triton import ops
from humming_triton.nn import QuantLinear

LINEAR_PRESETS = ["w4a16", "w4a16-asym", "nvfp4", "w8a8-fp8"]  # plain, zero points, global scale, act quant


def _qw(rng, shape, preset, bias=False):
    w = torch.randn(*shape, generator=rng) * 0.1
    b = torch.randn(*shape[:-1], generator=rng) if bias else None
    return ht.quantize_weight(w, preset, bias=b)


@pytest.mark.parametrize("preset", LINEAR_PRESETS)
def test_quant_linear_op(preset, rng):
    qw = _qw(rng, (64, 256), preset)
    x = torch.randn(2, 3, 256, generator=rng)
    bias = torch.randn(64, generator=rng)
    args = (x, *ops.weight_args(qw), bias, "reference", torch.float32)
    torch.library.opcheck(torch.ops.humming_triton.quant_linear.default, args)
    torch.testing.assert_close(ops.quant_linear_op(*args), ht.quant_linear(x, qw, bias, backend="reference"),
                               rtol=0, atol=0)
    # the inference twin (no autograd layer): same schema checks, same result
    torch.library.opcheck(torch.ops.humming_triton.quant_linear_nograd.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    torch.testing.assert_close(ops.quant_linear_nograd_op(*args), ops.quant_linear_op(*args), rtol=0, atol=0)


def test_compiled_module_calls_the_nograd_op_without_grad_and_the_differentiable_one_with(rng):
    """QuantLinear under torch.compile: inference graphs call quant_linear_nograd (no Python autograd layer per
    call), a graph that needs the activation's gradient calls quant_linear -- and gets it."""
    from torch._dynamo.testing import CompileCounterWithBackend
    mod = QuantLinear(_qw(rng, (32, 128), "w4a16"), backend="reference")
    x = torch.randn(3, 128, generator=rng)
    seen = []

    def backend(gm, example_inputs):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm
    compiled = torch.compile(mod, backend=backend, fullgraph=True)
    with torch.no_grad():
        y = compiled(x)
    assert any("quant_linear_nograd" in t for t in seen[-1]), seen[-1]
    xg = x.clone().requires_grad_(True)
    compiled(xg).sum().backward()
    assert any(t.startswith("humming_triton.quant_linear") and "nograd" not in t for t in seen[-1]), seen[-1]
    torch.testing.assert_close(y, mod(x), rtol=0, atol=0)
    w = ht.dequantize_weight(mod.quant_weight)
    torch.testing.assert_close(xg.grad, torch.ones(3, 32) @ w, rtol=1e-5, atol=1e-5)


def test_quant_linear_op_out_dtype(rng):
    qw = _qw(rng, (64, 128), "w8a16")
    x = torch.randn(5, 128, generator=rng)
    y = ops.quant_linear_op(x, *ops.weight_args(qw), None, "reference", torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == (5, 64)


def test_grouped_linear_op(rng):
    qw = _qw(rng, (3, 64, 128), "mxfp4", bias=True)
    x = torch.randn(7, 128, generator=rng)
    offsets = torch.tensor([0, 2, 2, 7])
    args = (x, *ops.weight_args(qw), offsets, None, "reference", None)
    torch.library.opcheck(torch.ops.humming_triton.grouped_linear.default, args)
    torch.testing.assert_close(ops.grouped_linear_op(*args), ht.grouped_linear(x, qw, offsets, backend="reference"),
                               rtol=0, atol=0)


@pytest.mark.parametrize("activation,preset", [("silu", "w4a16"), ("swiglu_oai", "nvfp4")])
def test_fused_moe_op(activation, preset, rng):
    e, h, i, t, k = 4, 128, 128, 6, 2
    w13 = _qw(rng, (e, 2 * i, h), preset, bias=activation == "swiglu_oai")
    w2 = _qw(rng, (e, h, i), preset, bias=activation == "swiglu_oai")
    hidden = torch.randn(t, h, generator=rng)
    ids = torch.stack([torch.randperm(e, generator=rng)[:k] for _ in range(t)])
    wts = torch.rand(t, k, generator=rng)
    args = (hidden, *ops.weight_args(w13), *ops.weight_args(w2), wts, ids, activation, "reference")
    torch.library.opcheck(torch.ops.humming_triton.fused_moe.default, args)
    want = ht.fused_moe(hidden, w13, w2, wts, ids, activation, backend="reference")
    torch.testing.assert_close(ops.fused_moe_op(*args), want, rtol=0, atol=0)
    torch.library.opcheck(torch.ops.humming_triton.fused_moe_nograd.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    torch.testing.assert_close(ops.fused_moe_nograd_op(*args), want, rtol=0, atol=0)


def test_grouped_linear_nograd_op(rng):
    qw = _qw(rng, (3, 64, 128), "mxfp4", bias=True)
    x = torch.randn(7, 128, generator=rng)
    offsets = torch.tensor([0, 2, 2, 7])
    args = (x, *ops.weight_args(qw), offsets, None, "reference", None)
    torch.library.opcheck(torch.ops.humming_triton.grouped_linear_nograd.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    torch.testing.assert_close(ops.grouped_linear_nograd_op(*args), ops.grouped_linear_op(*args), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["auto", "reference", "auto-native"])
def test_compiled_moe_module_inference_graph(backend, rng, monkeypatch):
    """QuantMoE under torch.compile without gradients: with ``auto`` the routing, activation and reduction are
    in the graph around two grouped_linear_nograd ops (grouped_linear_native with the native op's switch on); a
    named backend calls fused_moe_nograd.  Each matches eager."""
    from humming_triton.nn import QuantMoE
    from cutlass_ext import native_op
    native = backend == "auto-native"
    if native:
        from torch.utils.cpp_extension import is_ninja_available
        if shutil.which("c++") is None or not is_ninja_available():
            pytest.skip("no C++ compiler or no ninja to build the native op's kernel")
        assert native_op.unavailable() is None, native_op.unavailable()
        backend = "auto"
    monkeypatch.setattr(native_op, "ON", native)
    torch._dynamo.reset()
    e, h, i, t, k = 4, 128, 128, 5, 2
    mod = QuantMoE(_qw(rng, (e, 2 * i, h), "w4a16"), _qw(rng, (e, h, i), "w4a16"), backend=backend)
    hidden = torch.randn(t, h, generator=rng)
    wts, ids = torch.topk(torch.softmax(torch.randn(t, e, generator=rng), -1), k)
    seen = []

    def capture(gm, example_inputs):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm
    with torch.no_grad():
        got = torch.compile(mod, backend=capture, fullgraph=True)(hidden, ids, wts)
        want = mod(hidden, ids, wts)
    ops_called = {t for t in seen[-1] if t.startswith("humming_triton.")}
    if native:
        assert ops_called == {"humming_triton.grouped_linear_native"}, ops_called
    elif backend == "auto":
        assert ops_called == {"humming_triton.grouped_linear_nograd"}, ops_called
    else:
        assert ops_called == {"humming_triton.fused_moe_nograd"}, ops_called
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["e4m3fn/fp32:token", "e4m3fn/fp32:g128", "e2m1/e4m3fn:g16+global",
                                  "e2m1/e8m0:g32", "int8/fp32:tensor", "e4m3fn/fp32:tensor:static"])
def test_quantize_activation_op(spec, rng):
    x = torch.randn(3, 4, 256, generator=rng)
    static = spec.endswith(":static")
    input_scale = torch.tensor(0.02) if static else None
    torch.library.opcheck(torch.ops.humming_triton.quantize_activation.default, (x, spec, input_scale))
    got = ops.quantize_activation(x, spec, input_scale)
    want = ht.quantize_activation(x, ht.ActQuant.parse(spec), input_scale)
    assert torch.equal(got.codes, want.codes) and torch.equal(got.scales, want.scales.contiguous())
    assert (got.global_scale is None) == (want.global_scale is None)
    if want.global_scale is not None:
        assert torch.equal(got.global_scale, want.global_scale)
    torch.testing.assert_close(ht.dequantize_activation(got), ht.dequantize_activation(want), rtol=0, atol=0)


def test_weight_cache_reused_and_invalidated(rng):
    """The QuantWeight rebuilt inside the op is reused (backends keep state in qw.cache) until a tensor changes."""
    qw = _qw(rng, (32, 128), "w4a16")
    args = ops.weight_args(qw)
    first = ops.quant_weight_from_args(*args)
    assert ops.quant_weight_from_args(*args) is first
    x = torch.randn(2, 128, generator=rng)
    y0 = ops.quant_linear_op(x, *args, None, "reference", None)
    other = _qw(rng, (32, 128), "w4a16")
    qw.data.copy_(other.data)  # in place, as load_state_dict does
    qw.scales.copy_(other.scales)
    assert ops.quant_weight_from_args(*args) is not first
    y1 = ops.quant_linear_op(x, *args, None, "reference", None)
    torch.testing.assert_close(y1, ht.quant_linear(x, other, backend="reference"), rtol=0, atol=0)
    assert not torch.equal(y0, y1)


def test_fake_impl_checks_k(rng):
    qw = _qw(rng, (32, 128), "w4a16")
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        x = torch.empty(4, 64)
        fake_args = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in ops.weight_args(qw)]
        with pytest.raises(ValueError, match="K=128"):
            torch.ops.humming_triton.quant_linear(x, *fake_args, None, "reference", None)


def test_compile_quant_linear_fullgraph(rng):
    torch._dynamo.reset()
    lin = torch.nn.Linear(128, 64)
    mod = QuantLinear.from_linear(lin, "w4a16", backend="reference")
    compiled = torch.compile(mod, fullgraph=True, dynamic=False)
    x = torch.randn(3, 128, generator=rng)
    torch.testing.assert_close(compiled(x), mod(x), rtol=0, atol=0)


@pytest.mark.parametrize("preset", ["w4a16", "w8a8-fp8"])
def test_quant_linear_backward_through_frozen_weight(preset, rng):
    """quant_linear differentiates w.r.t. x and the bias (frozen quantized weight; quantized activations pass the
    gradient straight through): dx = dy @ W_hat, dbias = sum(dy).  Module path, eager and compiled."""
    lin = torch.nn.Linear(128, 48)
    mod = ht.QuantLinear.from_linear(lin, preset, backend="reference")
    mod.bias = torch.nn.Parameter(torch.randn(48, generator=rng))
    x = torch.randn(3, 5, 128, generator=rng, requires_grad=True)
    dy = torch.randn(3, 5, 48, generator=rng)
    for fn in (mod, torch.compile(mod, fullgraph=True)):
        x.grad = mod.bias.grad = None
        fn(x).backward(dy)
        w_hat = ht.dequantize_weight(mod.quant_weight).double()
        torch.testing.assert_close(x.grad.double(), dy.double() @ w_hat, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mod.bias.grad.double(), dy.double().sum((0, 1)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act_order", [False, True])
def test_dequantize_op(act_order, rng):
    """Under the interpreter the op runs the Triton dequantize kernel (and, for act-order weights, puts the
    stored columns back in logical order), as on CUDA."""
    import dataclasses
    qw = ht.quantize_weight(torch.randn(24, 128, generator=rng), "w4a16-asym")
    if act_order:
        qw = dataclasses.replace(qw, k_perm=torch.randperm(128, generator=rng), cache={})
    args = (*ops.weight_args(qw), torch.float32)
    torch.library.opcheck(torch.ops.humming_triton.dequantize.default, args)
    assert torch.equal(ops.dequantize_op(*args), ht.dequantize_weight(qw))


def test_quant_linear_backward_act_order_and_own_bias(rng):
    """dx through an act-order weight (logical column order) and the gradient of the weight's own bias."""
    import dataclasses
    qw = ht.quantize_weight(torch.randn(40, 256, generator=rng), "w4a16", bias=torch.randn(40, generator=rng))
    qw = dataclasses.replace(qw, k_perm=torch.randperm(256, generator=rng), cache={})
    wargs = list(ops.weight_args(qw))
    wargs[5] = wargs[5].clone().requires_grad_()  # the weight's own bias (op slot 6)
    x = torch.randn(3, 256, generator=rng, requires_grad=True)
    dy = torch.randn(3, 40, generator=rng)
    ops.quant_linear_op(x, *wargs, None, "reference", None).backward(dy)
    torch.testing.assert_close(x.grad, dy @ ht.dequantize_weight(qw), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wargs[5].grad, dy.sum(0), rtol=1e-5, atol=1e-5)


def test_other_ops_refuse_backward(rng):
    """A backward through grouped_linear raises (eager and compiled), but a compiled forward with a
    grad-requiring input works: torch.compile traces the backward ahead of time."""
    qw = ht.quantize_weight(torch.randn(2, 16, 128, generator=rng), "w4a16")
    x = torch.randn(3, 128, generator=rng, requires_grad=True)
    offsets, wargs = torch.tensor([0, 1, 3]), ops.weight_args(qw)
    fn = lambda x: ops.grouped_linear_op(x * 2, *wargs, offsets, None, "reference", None)  # noqa: E731
    want = fn(x)
    with pytest.raises(NotImplementedError, match="grouped_linear has no backward"):
        want.sum().backward()
    got = torch.compile(fn, fullgraph=True)(x)
    torch.testing.assert_close(got, want)
    with pytest.raises(NotImplementedError, match="grouped_linear has no backward"):
        got.sum().backward()


def test_quant_linear_forward_with_inference_tensor_weights(rng):
    """Weights made under inference_mode (inference tensors) still serve a grad-enabled forward + backward."""
    with torch.inference_mode():
        qw = ht.quantize_weight(torch.randn(24, 128, generator=rng), "w4a16")
    mod = ht.QuantLinear.from_quant_weight(qw, backend="reference")
    x = torch.randn(2, 128, generator=rng, requires_grad=True)
    mod(x).sum().backward()
    torch.testing.assert_close(x.grad, ht.dequantize_weight(qw).sum(0).expand(2, 128), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("preset", ["w4a16", "nvfp4", "w4a4-mxfp4"])
def test_quant_linear_backward_on_gpu(preset, act_order, rng):
    """On CUDA the backward dequantizes with the Triton kernel (and un-permutes act-order columns)."""
    import dataclasses
    n, k = 320, 1024
    qw = ht.quantize_weight(torch.randn(n, k, generator=rng) * 0.05, preset)
    if act_order:
        qw = dataclasses.replace(qw, k_perm=torch.randperm(k, generator=rng), cache={})
    mod = ht.QuantLinear.from_quant_weight(qw).cuda()
    x = torch.randn(4, k, generator=rng).cuda().bfloat16().requires_grad_()
    dy = torch.randn(4, n, generator=rng).cuda().bfloat16()
    mod(x).backward(dy)
    want = dy.double().cpu() @ ht.dequantize_weight(qw).double()
    rel = ((x.grad.double().cpu() - want).norm() / want.norm()).item()
    assert rel < 4 * 2.0 ** -8, f"{preset} act_order={act_order}: dx off by {rel:.3g}"
