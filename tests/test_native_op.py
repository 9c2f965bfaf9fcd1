"""humming_triton::quant_linear_native (cutlass_ext/native_op.py): the planned call's host path in C++.

On the CPU the C++ kernel is exercised with a host function standing in for the native decode launch (a ctypes
callback that reads the launch struct the op patched and writes the output), so hits, misses and invalidation are
all checked here; the GPU test runs the real native decode kernel."""
from __future__ import annotations

import ctypes
import gc
import shutil
import types
import weakref

import numpy as np
import pytest
import torch

import humming_triton as ht
import humming_triton.capability
import humming_triton.dispatch
from cutlass_ext import native_op
from cutlass_ext.decode_mma import NativeLaunch
from humming_triton.nn import QuantLinear
from humming_triton.ops import weight_args
from humming_triton.testing import assert_linear_close

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the op's kernel")


def test_the_kernel_builds():
    """A machine with a C++ compiler (CI's has one) must build it: a build error is a failure, not a skip."""
    assert native_op.unavailable() is None, native_op.unavailable()


class _Call(ctypes.Structure):  # the stand-in launch struct: the op patches x / y / stream / bias, keeps the rest
    _fields_ = [("tag", ctypes.c_int), ("m", ctypes.c_int), ("n", ctypes.c_int), ("k", ctypes.c_int),
                ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("stream", ctypes.c_void_p), ("bias", ctypes.c_void_p)]


_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class _HostLaunch:
    """y = x @ w.T (+ bias) in float32 from the struct's pointers; counts its calls; fails with ``error`` if set."""

    def __init__(self, w: torch.Tensor):
        self.w, self.calls, self.error, self.seen = w.double().numpy(), 0, 0, None
        self.fn = _LAUNCH(self._run)

    def _run(self, ptr):
        c = _Call.from_address(ptr)
        self.calls += 1
        self.seen = (c.tag, c.x, c.y, c.stream, c.bias)
        if self.error:
            return self.error
        x = np.ctypeslib.as_array(ctypes.cast(c.x, ctypes.POINTER(ctypes.c_float)), shape=(c.m, c.k))
        y = np.ctypeslib.as_array(ctypes.cast(c.y, ctypes.POINTER(ctypes.c_float)), shape=(c.m, c.n))
        y[:] = x.astype(np.float64) @ self.w.T
        if c.bias:
            y += np.ctypeslib.as_array(ctypes.cast(c.bias, ctypes.POINTER(ctypes.c_float)), shape=(c.n,))
        return 0

    @property
    def address(self) -> int:
        return ctypes.cast(self.fn, ctypes.c_void_p).value


def _add_plan(x, qw, bias, host: _HostLaunch, tag: int = 7, backend: str = "auto", keep=()):
    """What the Python path does after a full call whose plan is a native launch (here: the host stand-in)."""
    m, k = x.shape
    launch = NativeLaunch(bytes(_Call(tag=tag, m=m, n=qw.N, k=k)),
                          (_Call.x.offset, _Call.y.offset, _Call.stream.offset, _Call.bias.offset), host.address, 0,
                          (m, qw.N), torch.float32, tuple(keep))
    assert native_op.offer(types.SimpleNamespace(native=launch), x, weight_args(qw), bias, backend, None)


def _op(x, qw, bias=None, backend="auto"):
    return torch.ops.humming_triton.quant_linear_native(x, *weight_args(qw), bias, backend, None)


@pytest.fixture
def layer(rng):
    assert native_op.unavailable() is None, native_op.unavailable()
    native_op.reset()
    w = torch.randn(24, 256, generator=rng)
    qw = ht.quantize_weight(w, "w4a16")
    x = torch.randn(3, 256, generator=rng)
    host = _HostLaunch(ht.dequantize_weight(qw).float())
    yield x, qw, host
    native_op.reset()


def test_a_miss_is_the_python_op(layer):
    x, qw, host = layer
    want = torch.ops.humming_triton.quant_linear_nograd(x, *weight_args(qw), None, "auto", None)
    torch.testing.assert_close(_op(x, qw), want, rtol=0, atol=0)
    assert native_op.plans_count() == 0  # the reference backend leaves no native plan
    assert host.calls == 0


def test_a_hit_runs_the_planned_launch_with_this_calls_pointers(layer):
    x, qw, host = layer
    bias = torch.randn(qw.N)
    _add_plan(x, qw, bias, host)
    assert native_op.plans_count() == 1
    y = _op(x, qw, bias)
    assert host.calls == 1
    tag, xp, yp, stream, bp = host.seen
    assert (tag, xp, yp, stream, bp) == (7, x.data_ptr(), y.data_ptr(), None, bias.data_ptr())
    want = x.double() @ ht.dequantize_weight(qw).double().T + bias.double()
    torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-6)
    # another bias tensor of the same kind: the same plan, that bias's pointer
    other = torch.randn(qw.N)
    _op(x, qw, other)
    assert host.calls == 2 and host.seen[4] == other.data_ptr()


@pytest.mark.parametrize("change", ["in_place_scales", "other_rows", "no_bias", "bias_dtype", "backend",
                                    "non_contiguous", "new_weight_object", "reset"])
def test_anything_the_plan_was_not_made_for_misses(layer, change):
    x, qw, host = layer
    bias = torch.randn(qw.N)
    _add_plan(x, qw, bias, host)
    backend = "auto"
    if change == "in_place_scales":
        qw.scales.mul_(2)  # version counter: the plan is stale; the Python path sees the edit
    elif change == "other_rows":
        x = torch.randn(5, x.shape[1])
    elif change == "no_bias":
        bias = None
    elif change == "bias_dtype":
        bias = bias.double()
    elif change == "backend":
        backend = "reference"
    elif change == "non_contiguous":
        x = torch.randn(x.shape[1], x.shape[0]).T
    elif change == "new_weight_object":
        qw = ht.QuantWeight(qw.data.clone(), qw.scales, qw.scheme, qw.shape)
    elif change == "reset":
        native_op.reset()
    got = _op(x, qw, bias, backend)
    assert host.calls == 0, change
    want = torch.ops.humming_triton.quant_linear_nograd(x, *weight_args(qw), bias, backend, None)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_plan_offered_under_an_older_state_is_dropped(layer):
    x, qw, host = layer
    stale = native_op._EPOCH[0]
    ht.dispatch.clear_caches()  # state_watch: the C++ table is voided and its epoch moves on
    assert native_op._EPOCH[0] == stale + 1
    native_op._EPOCH[0] = stale  # as if offered by a call that ran before the change
    try:
        _add_plan(x, qw, None, host)
    finally:
        native_op._EPOCH[0] = stale + 1
    assert native_op.plans_count() == 0


@pytest.mark.parametrize("change", ["clear_caches", "pose_as", "batch_invariant"])
def test_a_change_of_dispatch_state_voids_the_table(layer, change):
    """What plans.py compares per call (the table's generation, a posed device, batch-invariant mode) the C++
    table cannot see: each change is pushed to it (humming_triton.state_watch)."""
    x, qw, host = layer
    _add_plan(x, qw, None, host)
    if change == "clear_caches":
        ht.dispatch.clear_caches()
        assert native_op.plans_count() == 0
    elif change == "pose_as":
        with ht.capability.pose_as((8, 0)):
            assert native_op.plans_count() == 0
    else:
        with ht.batch_invariant():
            assert native_op.plans_count() == 0
    _op(x, qw)
    assert host.calls == 0


def test_plans_of_dropped_weights_go_and_none_keeps_them_alive(layer):
    x, qw, host = layer
    doomed = ht.quantize_weight(torch.randn(8, 256), "w4a16")
    repacked = torch.zeros(1000)  # stands for the kernel's repacked weight: the plan holds it
    _add_plan(x, doomed, None, _HostLaunch(ht.dequantize_weight(doomed).float()), keep=(repacked,))
    _add_plan(x, qw, None, host)
    weight_ref, repacked_ref = weakref.ref(doomed.data), weakref.ref(repacked)
    del repacked
    assert repacked_ref() is not None and native_op.plans_count() == 2
    del doomed
    gc.collect()
    assert weight_ref() is None  # the C++ table held the weight weakly
    assert native_op.plans_count() == 1  # its plan went when it did ...
    assert repacked_ref() is None  # ... and with it what the plan held


def test_a_failed_launch_raises_with_its_error(layer):
    x, qw, host = layer
    _add_plan(x, qw, None, host)
    host.error = 7
    with pytest.raises(RuntimeError, match="native decode kernel failed: error 7"):
        _op(x, qw)


def test_bad_plan_structs_are_refused(layer):
    x, qw, host = layer
    bad = NativeLaunch(bytes(8), (0, 8, 0, 0), host.address, 0, (3, qw.N), torch.float32, ())
    with pytest.raises(RuntimeError, match="outside the 8-byte launch struct"):
        native_op.offer(types.SimpleNamespace(native=bad), x, weight_args(qw), None, "auto", None)


def test_quant_linear_compiles_to_the_native_op(layer, monkeypatch):
    """With the opt-in set, a compiled QuantLinear's graph calls quant_linear_native (fullgraph), and its
    results are eager's."""
    x, qw, host = layer
    monkeypatch.setenv(native_op.ENV, "1")
    mod = QuantLinear(qw, torch.randn(qw.N))
    with torch.no_grad():
        eager = mod(x)
        torch._dynamo.reset()
        seen = []
        compiled = torch.compile(mod, fullgraph=True, backend=lambda gm, _: seen.append(gm) or gm)
        got = compiled(x)
    assert any("quant_linear_native" in str(n.target) for gm in seen for n in gm.graph.nodes)
    torch.testing.assert_close(got, eager, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4", "w8a16"])
def test_native_op_on_gpu(scheme, rng):
    """The real thing: the second call of a signature runs from the C++ table (the native decode kernel), equal
    to the Python path's result and to the reference; an in-place edit of the scales is seen; a CUDA graph captured
    on the C++ path replays it."""
    from cutlass_ext import native
    if native.unavailable():
        pytest.fail(native.unavailable())  # asked for GPU tests: a missing build is a failure, not a skip
    native_op.reset()
    qw = ht.quantize_weight(torch.randn(512, 1024, generator=rng), scheme)
    x = torch.randn(4, 1024, generator=rng).bfloat16()

    def check(y, what):
        ref = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
        assert_linear_close(y.cpu(), ref, x.float(), ht.dequantize_weight(qw), torch.bfloat16, f"{scheme} {what}")

    qg, xg = qw.to("cuda"), x.cuda()
    with torch.no_grad():
        first = _op(xg, qg, None, "cuda")
        assert native_op.plans_count() == 1, "the native decode plan was not handed to the C++ table"
        second = _op(xg, qg, None, "cuda")
        torch.testing.assert_close(second, first, rtol=0, atol=0)
        check(second, "C++ hit")
        qg.scales.copy_(qg.scales.roll(1, 0))  # an in-place edit (any scale dtype): the plan must not hit
        qw.scales.copy_(qw.scales.roll(1, 0))
        edited = _op(xg, qg, None, "cuda")
        assert (edited != second).any()
        check(edited, "after an in-place edit")
        _op(xg, qg, None, "cuda")  # planned again
        static = xg.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _op(static, qg, None, "cuda")
        x = torch.randn(4, 1024, generator=rng).bfloat16()
        static.copy_(x.cuda())
        graph.replay()
        check(captured, "CUDA-graph replay")
    native_op.reset()
