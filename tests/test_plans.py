"""Call plans (``humming_triton.plans``): a repeated call signature skips the checks and the dispatch, and its result
is the full path's, bit for bit; anything the plan was derived from changing -- the weight edited in place, another
bias, dispatch's caches, batch-invariant mode, another memory layout of x -- takes the full path again.

CPU (interpreter): the Triton backend's plans.  GPU (``-m gpu``): the native decode kernel's lean runner, eager and
captured in a CUDA graph, against the full path and the reference.
"""
import pytest
import torch

import humming_triton as ht
from humming_triton import dispatch, plans
from humming_triton.testing import assert_linear_close


def _layer(rng, scheme="w4a16", n=96, k=256, bias=True, backend="triton", device="cpu"):
    w = torch.randn(n, k, generator=rng) * 0.05
    b = torch.randn(n, generator=rng) if bias else None
    qw = ht.quantize_weight(w.to(device), scheme)
    return qw, None if b is None else b.to(device)


def _planned(qw) -> dict:
    return qw.cache.get("plans", {})


class _Counting:
    """Wraps every plan's runner of a weight to count the calls that took a plan."""

    def __init__(self, qw):
        self.calls = 0
        for plan in _planned(qw).values():
            inner = plan.runner

            def run(x, bias, inner=inner):
                self.calls += 1
                return inner(x, bias)
            plan.runner = run


def test_repeat_runs_the_plan_bit_for_bit(rng):
    qw, bias = _layer(rng)
    x = torch.randn(2, 3, 256, generator=rng)
    first = ht.quant_linear(x, qw, bias, backend="triton")
    assert len(_planned(qw)) == 1
    counter = _Counting(qw)
    again = ht.quant_linear(x.clone(), qw, bias, backend="triton")
    assert counter.calls == 1
    assert again.shape == (2, 3, 96) and torch.equal(first, again)
    assert dispatch.last_plan() is not None and dispatch.last_plan().startswith("triton/")
    ref = ht.quant_linear(x, qw, bias, backend="reference")
    assert_linear_close(again, ref, x.reshape(-1, 256), ht.dequantize_weight(qw), torch.float32, "planned")


def test_in_place_weight_edit_drops_the_plan(rng):
    qw, bias = _layer(rng, bias=False)
    x = torch.randn(4, 256, generator=rng)
    before = ht.quant_linear(x, qw, backend="triton")
    ht.quant_linear(x, qw, backend="triton")
    qw.scales.mul_(2)  # a plan made before the edit must not run after it
    after = ht.quant_linear(x, qw, backend="triton")
    torch.testing.assert_close(after, 2 * before, rtol=1e-6, atol=1e-6)


def test_plan_made_without_bias_is_not_used_with_one(rng):
    qw, bias = _layer(rng)
    x = torch.randn(2, 256, generator=rng)
    plain = ht.quant_linear(x, qw, backend="triton")  # planned with no bias: the kernel was built without one
    got = ht.quant_linear(x, qw, bias, backend="triton")
    torch.testing.assert_close(got, plain + bias, rtol=1e-6, atol=1e-5)


def test_find_checks_every_input_of_the_plan(rng):
    """The mechanism itself: a stored runner comes back only while the weight's versions, the bias object and
    dispatch's state are the ones it was made under."""
    qw, bias = _layer(rng)
    key = ("quant_linear", "probe")
    plans.offer(qw, key, bias, (None, None), lambda: "runner")
    assert plans.find(qw, key, bias) == "runner"
    assert plans.find(qw, key, None) is None and plans.find(qw, key, bias.clone()) is None
    qw.data.add_(0)  # an in-place op bumps the version counter
    assert plans.find(qw, key, bias) is None
    plans.offer(qw, key, bias, (None, None), lambda: "runner")
    dispatch.clear_caches()
    assert plans.find(qw, key, bias) is None
    plans.offer(qw, key, bias, (None, None), lambda: None)  # no runner: nothing stored
    assert plans.find(qw, key, bias) is None


def test_another_bias_object_is_not_the_planned_one(rng):
    qw, bias = _layer(rng)
    x = torch.randn(1, 256, generator=rng)
    ht.quant_linear(x, qw, bias, backend="triton")
    other = bias + 1.0
    got = ht.quant_linear(x, qw, other, backend="triton")
    want = ht.quant_linear(x, qw, bias, backend="triton") + 1.0
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("make_x", ["transposed", "misaligned"])
def test_an_x_the_runner_was_not_made_for_takes_the_full_path(make_x, rng):
    qw, bias = _layer(rng)
    x = torch.randn(3, 256, generator=rng)
    ht.quant_linear(x, qw, bias, backend="triton")
    if make_x == "transposed":  # same shape and dtype, columns not contiguous
        other = torch.randn(256, 3, generator=rng).t()
    else:  # same shape, contiguous, data 4 bytes past a 16-byte boundary
        other = torch.randn(3 * 256 + 1, generator=rng)[1:].view(3, 256)
        assert other.data_ptr() % 16 != x.data_ptr() % 16
    counter = _Counting(qw)
    got = ht.quant_linear(other, qw, bias, backend="triton")
    assert counter.calls == 1  # the plan was asked and declined
    ref = ht.quant_linear(other, qw, bias, backend="reference")
    assert_linear_close(got, ref, other, ht.dequantize_weight(qw), torch.float32, make_x)


def test_dispatch_state_changes_drop_the_plan(rng):
    qw, bias = _layer(rng)
    x = torch.randn(2, 256, generator=rng)
    ht.quant_linear(x, qw, bias, backend="triton")
    counter = _Counting(qw)
    dispatch.clear_caches()  # e.g. a new measured table
    ht.quant_linear(x, qw, bias, backend="triton")
    assert counter.calls == 0
    counter = _Counting(qw)
    with ht.batch_invariant():
        ht.quant_linear(x, qw, bias, backend="triton")
    assert counter.calls == 0


def test_quant_linear_module_plans_and_sees_load_state_dict(rng):
    lin = torch.nn.Linear(256, 64)
    mod = ht.QuantLinear.from_linear(lin, "w4a16", backend="triton").eval()
    x = torch.randn(2, 256, generator=rng)
    with torch.no_grad():
        first = mod(x)
        assert _planned(mod.quant_weight)
        other = ht.QuantLinear.from_linear(torch.nn.Linear(256, 64), "w4a16", backend="triton")
        mod.load_state_dict(other.state_dict())  # copies into the buffers in place
        got = mod(x)
        want = other.eval()(x)
    assert not torch.equal(got, first)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_no_plan_for_fake_tensors_or_reference(rng):
    qw, _ = _layer(rng, bias=False)
    x = torch.randn(2, 256, generator=rng)
    ht.quant_linear(x, qw, backend="reference")
    assert not _planned(qw)  # the reference has no plan: it runs in full
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        assert not plans.usable(fx)


def test_quantized_activation_decode_has_no_lean_runner(rng):
    """The weight-only runner would skip the activation quantization: the act family must not inherit it."""
    from humming_triton.calls import KernelConfig
    from humming_triton.kernels import families
    qw, bias = _layer(rng, "w4a8-mxfp4", n=64, k=256)
    x2 = torch.randn(2, 256, generator=rng)
    cfg = KernelConfig("mma_decode_act", 16, 32, 64, 8, 8, 16, 1)
    assert families.get("mma_decode_act").runner(x2, qw, bias, torch.float32, cfg, (2, 64)) is None


class _RecordingLibrary:
    """Stands in for the native library on the CPU: records each launch struct's bytes, launches nothing."""

    def __init__(self):
        import ctypes
        self.calls = []
        self.ht_decode_mma = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(self._record)
        self.ht_error_string = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_int)(lambda e: b"?")

    def _record(self, ptr):
        from cutlass_ext.native import DecodeCall
        self.calls.append(bytes(DecodeCall.from_address(ptr)))
        return 0


@pytest.mark.parametrize("family,rows,bias", [("mma_decode_grouped", 24, "none"), ("mma_decode_grouped", 24, "call"),
                                              ("mma_decode_grouped_rows", 3, "weight"),
                                              ("mma_decode_grouped_passes", 24, "weight")])
def test_grouped_decode_plan_launches_what_the_full_path_does(family, rows, bias, rng, monkeypatch):
    """The grouped decode kernel's lean plan (decode_mma.grouped_runner) hands the kernel the very launch struct
    the full path (run_grouped) builds for the same call -- byte for byte, with this call's x / y / offsets /
    bias -- and so does the copy it leaves for the C++ table (NativeLaunch, patched as native_op.cpp patches it).
    On the CPU with a recording stand-in for the library."""
    import ctypes
    from cutlass_ext import decode_mma as dm
    from cutlass_ext.native import DecodeCall
    from humming_triton.calls import KernelConfig
    from humming_triton.kernels import families
    lib = _RecordingLibrary()
    monkeypatch.setattr(dm, "library", lambda: lib)
    monkeypatch.setattr(dm, "current_stream", lambda dev: 1234)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1234, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    e = 4
    wbias = torch.randn(e, 64, generator=rng) if bias == "weight" else None
    qw = ht.quantize_weight(torch.randn(e, 64, 256, generator=rng), "w4a16")
    if wbias is not None:
        qw = ht.QuantWeight(qw.data, qw.scales, qw.scheme, qw.shape, bias=wbias)
    call_bias = torch.randn(e, 64, generator=rng) if bias == "call" else None
    fam = families.get(family)
    cfg = KernelConfig(family, 8 if rows < e else 16, 32, 64, 2, 8, 4, 2)
    x = torch.randn(rows, 256, generator=rng).bfloat16()
    offsets = torch.tensor([0, rows // 3, rows // 3, rows - 1, rows])
    lean = fam.grouped_runner(x, offsets, qw, call_bias, torch.float32, cfg)
    assert lean is not None
    fam.run(x, offsets, qw, call_bias, torch.float32, cfg, None)
    y = lean(x, offsets, call_bias)
    full, planned = lib.calls
    got, want = DecodeCall.from_buffer_copy(planned), DecodeCall.from_buffer_copy(full)
    assert got.y == y.data_ptr() and got.offsets == offsets.data_ptr() and got.stream == 1234
    want.y = got.y  # the two calls' outputs are two tensors; everything else must be equal
    assert bytes(got) == bytes(want)
    native = lean.native  # the C++ table's copy, patched as native_op.cpp's run_plan patches it
    table = bytearray(native.call)
    for field, value in zip(native.offsets, (x.data_ptr(), y.data_ptr(), 1234, None, offsets.data_ptr())):
        if value is not None:
            table[field:field + 8] = ctypes.c_uint64(value).value.to_bytes(8, "little")
    assert native.weight_bias == (wbias is not None)  # the C++ table patches the weight's bias per call
    given = call_bias if call_bias is not None else wbias
    if given is not None:
        table[native.offsets[3]:native.offsets[3] + 8] = given.data_ptr().to_bytes(8, "little")
    assert bytes(table) == bytes(got)
    assert native.out_shape == (rows, 64) and native.out_dtype == torch.float32
    if wbias is not None:  # `t.data = other` keeps the tensor and its version: the pointer is read per call
        wbias.data = wbias.data + 1
        lean(x, offsets, call_bias)
        assert DecodeCall.from_buffer_copy(lib.calls[-1]).bias == wbias.data_ptr()
    # a runner refuses the calls it was not made for (the full path takes them)
    assert lean(x, offsets.int(), call_bias) is None
    assert lean(x, offsets.view(1, -1), call_bias) is None
    assert lean(x, offsets.to("meta"), call_bias) is None
    assert lean(torch.randn(rows, 512, generator=rng).bfloat16()[:, :256], offsets, call_bias) is None


def test_quantized_activation_grouped_decode_has_no_lean_runner(rng):
    """As the dense act family: the weight-only grouped runner would skip the activations' quantization."""
    from humming_triton.calls import KernelConfig
    from humming_triton.kernels import families
    qw = ht.quantize_weight(torch.randn(4, 64, 256, generator=rng), "w4a8-mxfp4")
    x, offsets = torch.randn(8, 256, generator=rng), torch.tensor([0, 2, 2, 5, 8])
    for name in ("mma_decode_grouped_act", "mma_decode_grouped_act_passes"):
        cfg = KernelConfig(name, 8, 32, 64, 2, 8, 4, 1)
        assert families.get(name).grouped_runner(x, offsets, qw, None, torch.float32, cfg) is None


# --- GPU: the native decode kernel's lean runner -------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("scheme,dtype", [("w4a16", torch.bfloat16), ("w4a16", torch.float16),
                                          ("w8a16", torch.bfloat16), ("mxfp4", torch.bfloat16),
                                          ("nvfp4", torch.bfloat16)])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_native_runner_on_gpu(scheme, dtype, m, rng):
    from cutlass_ext.native import unavailable
    if unavailable():
        pytest.fail(f"the native library is needed for this test: {unavailable()}")
    qw, bias = _layer(rng, scheme, n=200, k=512, device="cuda")
    bias = bias.to(dtype)
    x = torch.randn(m, 512, generator=rng).to("cuda", dtype)
    full = ht.quant_linear(x, qw, bias, backend="cuda")
    (plan,) = _planned(qw).values()
    assert getattr(plan.runner, "packed", None) is not None, "the cuda backend's plan is the lean runner"
    counter = _Counting(qw)
    planned = ht.quant_linear(x, qw, bias, backend="cuda")
    assert counter.calls == 1 and torch.equal(full, planned)
    cpu = qw.to("cpu")
    ref = ht.quant_linear(x.cpu().float(), cpu, bias.cpu().float(), backend="reference")
    assert_linear_close(planned.float().cpu(), ref, x.cpu().float(), ht.dequantize_weight(cpu), dtype,
                        f"{scheme} M={m}")
    # captured in a CUDA graph: the plan launches on the capture stream
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = ht.quant_linear(static_x, qw, bias, backend="cuda")
    static_x.copy_(x * 2)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_y.float(), ht.quant_linear(x * 2, qw, bias, backend="cuda").float(),
                               rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w8a8-fp8", "w4a8-mxfp4", "w8a8-int8", "w4a8-fp8"])
@pytest.mark.parametrize("m", [1, 16])
def test_quantized_activation_repeats_on_gpu(scheme, m, rng):
    """A repeated call of a quantized-activation scheme on the native decode kernel (the call plan's path) gives the
    first call's result bit for bit, and the reference's (activations quantized as the scheme says)."""
    from cutlass_ext.native import unavailable
    if unavailable():
        pytest.fail(f"the native library is needed for this test: {unavailable()}")
    qw, bias = _layer(rng, scheme, n=256, k=512, device="cuda")
    x = torch.randn(m, 512, generator=rng).to("cuda", torch.bfloat16)
    bias = bias.to(torch.bfloat16)
    first = ht.quant_linear(x, qw, bias, backend="cuda")
    again = ht.quant_linear(x, qw, bias, backend="cuda")
    assert torch.equal(first, again)
    cpu = qw.to("cpu")
    ref = ht.quant_linear(x.cpu().float(), cpu, bias.cpu().float(), backend="reference")
    xq = ht.dequantize_activation(ht.quantize_activation(x.cpu().float(), cpu.scheme.act, cpu.input_scale))
    assert_linear_close(again.cpu(), ref, xq, ht.dequantize_weight(cpu), torch.float32, f"{scheme} M={m}")



def test_grouped_linear_plans_skip_dispatch_only(rng):
    """grouped_linear's plan is dispatch's choice, run again on the new rows and offsets (never the old ones)."""
    qw = ht.quantize_weight(torch.randn(3, 64, 128, generator=rng) / 8, "w4a16")
    x = torch.randn(7, 128, generator=rng)
    first = ht.grouped_linear(x, qw, torch.tensor([0, 2, 2, 7]), backend="triton")
    assert _planned(qw)
    x2, offsets2 = torch.randn(7, 128, generator=rng), torch.tensor([0, 5, 6, 7])
    got = ht.grouped_linear(x2, qw, offsets2, backend="triton")
    ref = ht.grouped_linear(x2, qw, offsets2, backend="reference")
    torch.testing.assert_close(got, ref, rtol=2e-3, atol=2e-3)
    assert not torch.equal(got, first)
    with pytest.raises(ValueError, match="offsets"):  # another offsets shape is another signature: checked
        ht.grouped_linear(x2, qw, torch.tensor([0, 7]), backend="triton")


def test_grouped_linear_reads_strided_offsets_by_their_stride(rng):
    """Offsets that are a strided view (every other element of a longer tensor): the kernels read offsets[e] at
    base + e, so grouped_linear makes them contiguous first -- on the full path and on a planned repeat (found in
    session 34: the Triton path read the view's neighbours, 1e19-sized garbage)."""
    qw = ht.quantize_weight(torch.randn(3, 64, 128, generator=rng) / 8, "w4a16")
    x = torch.randn(7, 128, generator=rng)
    offsets = torch.tensor([0, 2, 2, 7])
    strided = torch.stack([offsets, offsets.flip(0)], 1).reshape(-1)[::2]
    assert not strided.is_contiguous() and torch.equal(strided, offsets)
    ref = ht.grouped_linear(x, qw, offsets, backend="reference")
    for _ in range(2):  # the full path, then the plan it left
        got = ht.grouped_linear(x, qw, strided, backend="triton")
        torch.testing.assert_close(got, ref, rtol=2e-3, atol=2e-3)


# --- the opt-in triton_op path under torch.compile (kernels/compiled.py) ------------------------------------------
def test_quant_linear_triton_op_falls_back_off_cuda(rng):
    """Called on CPU tensors (or wherever no Triton launch applies) the triton_op is quant_linear_nograd."""
    from humming_triton import ops
    qw, bias = _layer(rng)
    x = torch.randn(3, 256, generator=rng)
    args = (x, *ops.weight_args(qw)[:9], bias, "reference")
    got = torch.ops.humming_triton.quant_linear_triton(*args)
    want = ops.quant_linear_nograd_op(x, *ops.weight_args(qw), bias, "reference", None)
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 40])
def test_compiled_quant_linear_launches_triton_from_inductor(m, rng, monkeypatch):
    """The triton_op switch on: a compiled QuantLinear's calls run no Python of ours (inductor launches the
    Triton kernel the table picked), and match eager within the kernels' own rounding."""
    import humming_triton.linear as linear_mod
    from humming_triton.kernels import compiled as compiled_mod
    monkeypatch.setattr(compiled_mod, "ON", True)
    torch._dynamo.reset()
    lin = torch.nn.Linear(1024, 384, bias=True, device="cuda", dtype=torch.bfloat16)
    mod = ht.QuantLinear.from_linear(lin, "w4a16").eval()
    x = torch.randn(m, 1024, generator=rng).to("cuda", torch.bfloat16)
    compiled = torch.compile(mod, fullgraph=True, dynamic=False)
    with torch.no_grad():
        eager = mod(x)
        got = compiled(x)
        calls = []
        orig = linear_mod.quant_linear
        monkeypatch.setattr(linear_mod, "quant_linear", lambda *a, **k: calls.append(1) or orig(*a, **k))
        again = compiled(x)
    assert not calls, "the compiled call went through our Python"
    assert torch.equal(got, again)
    ref = ht.quant_linear(x.float().cpu(), mod.quant_weight.to("cpu"), lin.bias.float().cpu(), backend="reference")
    assert_linear_close(got.float().cpu(), ref, x.float().cpu(), ht.dequantize_weight(mod.quant_weight.to("cpu")),
                        torch.bfloat16, f"compiled triton M={m}")
    torch.testing.assert_close(got, eager, rtol=2 ** -6, atol=2 ** -6)


@pytest.mark.parametrize("scheme,m", [("w4a16", 1), ("w4a16", 20), ("w8a16-asym", 3), ("mxfp4", 2), ("nvfp4", 7)])
def test_triton_plan_launch_matches_triton_linear(scheme, m, rng):
    """The launch the triton_op traces -- chosen from shapes and the table, arguments from shapes and strides --
    computes what triton_linear computes (interpreter: the kernel launched directly instead of via wrap_triton)."""
    from humming_triton.kernels import compiled
    qw, bias = _layer(rng, scheme, n=80, k=256)
    x = torch.randn(m, 256, generator=rng)
    spec = compiled.triton_plan(x, qw.scheme, 80, 256, True, "auto")
    assert spec is not None
    got = compiled.run_planned(x, qw.data, qw.scales, qw.zeros, qw.global_scale, bias, 80, 256, spec, lambda k: k)
    ref = ht.quant_linear(x, qw, bias, backend="reference")
    assert_linear_close(got, ref, x, ht.dequantize_weight(qw), torch.float32, f"{scheme} M={m}")
