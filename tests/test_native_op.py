"""humming_triton::quant_linear_native (cutlass_ext/native_op.py): the planned call's host path in C++.

On the CPU the C++ kernel is exercised with a host function standing in for the native decode launch (a ctypes
callback that reads the launch struct the op patched and writes the output), so hits, misses and invalidation are
all checked here; the GPU test runs the real native decode kernel."""
from __future__ import annotations

import copy
import ctypes
import gc
import shutil
import types
import weakref

import numpy as np
import pytest
import torch
from torch.utils.cpp_extension import is_ninja_available

import humming_triton as ht
import humming_triton.capability
import humming_triton.dispatch
import humming_triton.plans
from cutlass_ext import native_op
from cutlass_ext.decode_mma import NativeLaunch
from humming_triton.nn import QuantLinear
from humming_triton.ops import weight_args
from humming_triton.testing import assert_linear_close

pytestmark = pytest.mark.skipif(shutil.which("c++") is None or not is_ninja_available(),
                                reason="no C++ compiler or no ninja to build the op's kernel (torch.utils.cpp_extension)")


def test_the_kernel_builds():
    """A machine with a C++ compiler and ninja (CI's has both) must build it: a build error is a failure, not a
    skip."""
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


def _native(x, n: int, host: _HostLaunch, tag: int = 7, keep=()) -> NativeLaunch:
    m, k = x.shape
    return NativeLaunch(bytes(_Call(tag=tag, m=m, n=n, k=k)),
                        (_Call.x.offset, _Call.y.offset, _Call.stream.offset, _Call.bias.offset, -1), host.address, 0,
                        (m, n), torch.float32, tuple(keep))


def _add_plan(x, qw, bias, host: _HostLaunch, tag: int = 7, backend: str = "auto", keep=(), made_at=None, args=None):
    """What the Python path does after a full call whose plan is a native launch (here: the host stand-in)."""
    made_at = native_op.epoch() if made_at is None else made_at
    assert native_op.offer(types.SimpleNamespace(native=_native(x, qw.N, host, tag, keep)), x,
                           args or weight_args(qw), bias, backend, None, made_at)


def _hits_misses_since(before):
    now = native_op.stats()
    return now[0] - before[0], now[1] - before[1]


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
                                    "non_contiguous", "misaligned", "x_dtype", "out_dtype", "new_weight_object",
                                    "other_scales_object", "bias_shape", "reset"])
def test_anything_the_plan_was_not_made_for_misses(layer, change):
    x, qw, host = layer
    bias = torch.randn(qw.N)
    _add_plan(x, qw, bias, host)
    backend, out_dtype = "auto", None
    before = native_op.stats()
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
    elif change == "misaligned":  # contiguous, the planned shape, data 4 bytes past a 16-byte boundary
        x = torch.randn(x.numel() + 1)[1:].view(x.shape)
    elif change == "x_dtype":
        x = x.bfloat16()
    elif change == "out_dtype":
        out_dtype = torch.float64
    elif change == "new_weight_object":
        qw = ht.QuantWeight(qw.data.clone(), qw.scales, qw.scheme, qw.shape)
    elif change == "other_scales_object":  # the same data tensor (the table's key), another scales tensor
        qw = ht.QuantWeight(qw.data, qw.scales.clone(), qw.scheme, qw.shape)
    elif change == "bias_shape":
        bias = bias.view(1, -1)
    elif change == "reset":
        native_op.reset()
    if change == "bias_shape":  # the Python path names the problem
        with pytest.raises(ValueError, match="bias"):
            torch.ops.humming_triton.quant_linear_native(x, *weight_args(qw), bias, backend, out_dtype)
    else:
        got = torch.ops.humming_triton.quant_linear_native(x, *weight_args(qw), bias, backend, out_dtype)
        want = torch.ops.humming_triton.quant_linear_nograd(x, *weight_args(qw), bias, backend, out_dtype)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert host.calls == 0, change
    assert _hits_misses_since(before) == (0, 1), change


def test_a_plan_made_under_an_older_state_is_dropped(layer):
    x, qw, host = layer
    stale = native_op.epoch()
    ht.dispatch.clear_caches()  # state_watch: the C++ table is voided and its epoch moves on
    assert native_op.epoch() == stale + 1
    _add_plan(x, qw, None, host, made_at=stale)  # planned before the change, offered after it
    assert native_op.plans_count() == 0
    _add_plan(x, qw, None, host)
    assert native_op.plans_count() == 1


def test_inference_tensor_weights_are_not_planned(layer):
    """No version counter: an in-place edit in inference mode could not void the plan, so there is none."""
    x, qw, host = layer
    with torch.inference_mode():
        frozen = ht.QuantWeight(qw.data.clone(), qw.scales.clone(), qw.scheme, qw.shape)
    _add_plan(x, frozen, None, host)
    assert native_op.plans_count() == 0


class _PlannedRunner:
    """A Python plan whose launch is native (as ``decode_mma.runner``'s): callable like a runner, with ``native``."""

    def __init__(self, qw, host):
        self.qw, self.host = qw, host

    def __call__(self, x, bias):
        return ht.quant_linear(x, self.qw, bias, backend="reference")

    @property
    def native(self):
        return _native(self.x, self.qw.N, self.host)


def test_the_python_path_hands_its_plans_to_the_table(layer, monkeypatch):
    """The miss op (Python) offers what quant_linear planned; the next call of that signature is a C++ hit.  A
    second signature of the same weight, an edit and a reset re-plan -- each offer after the first included."""
    x, qw, host = layer
    runner = _PlannedRunner(qw, host)
    real_find = ht.plans.find

    def find(q, key, bias):  # what a native backend would have planned for this call on "auto"
        return runner if key[:2] == ("quant_linear", "auto") else real_find(q, key, bias)
    monkeypatch.setattr(ht.plans, "find", find)
    for rows in (3, 1, 3):
        xs = torch.randn(rows, x.shape[1])
        runner.x = xs
        before, calls = native_op.stats(), host.calls
        miss = _op(xs, qw)  # planned (for rows 3 the second time: after the edit below)
        hit = _op(xs, qw)
        assert _hits_misses_since(before) == (1, 1) and host.calls == calls + 1, rows
        torch.testing.assert_close(hit, miss, rtol=1e-5, atol=1e-5)
        qw.scales.mul_(2)
        host.w = ht.dequantize_weight(qw).double().numpy()  # the stand-in kernel reads the weight as it is now
    native_op.reset()
    before = native_op.stats()
    _op(xs, qw)
    _op(xs, qw)
    assert _hits_misses_since(before) == (1, 1)


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
    doomed_host = _HostLaunch(ht.dequantize_weight(doomed).float())  # held: the plan points at its function
    _add_plan(x, doomed, None, doomed_host, keep=(repacked,))
    _add_plan(x, qw, None, host)
    weight_ref, repacked_ref = weakref.ref(doomed.data), weakref.ref(repacked)
    del repacked
    assert repacked_ref() is not None and native_op.plans_count() == 2
    del doomed
    gc.collect()
    assert weight_ref() is None  # the C++ table held the weight weakly
    assert native_op.plans_count() == 1  # its plan went when it did ...
    assert repacked_ref() is None  # ... and with it what the plan held
    # a deep copy of a planned weight (another module's buffers) is watched as well
    twin = copy.deepcopy(qw)
    twin_keep = torch.zeros(1000)
    _add_plan(x, twin, None, host, keep=(twin_keep,))
    twin_ref, keep_ref = weakref.ref(twin.data), weakref.ref(twin_keep)
    del twin, twin_keep
    gc.collect()
    assert twin_ref() is None and keep_ref() is None and native_op.plans_count() == 1


def test_a_failed_launch_raises_with_its_error(layer):
    x, qw, host = layer
    _add_plan(x, qw, None, host)
    host.error = 7
    with pytest.raises(RuntimeError, match="native decode kernel failed: error 7"):
        _op(x, qw)


def test_bad_plan_structs_are_refused(layer):
    x, qw, host = layer
    bad = NativeLaunch(bytes(8), (0, 8, 0, 0, -1), host.address, 0, (3, qw.N), torch.float32, ())
    with pytest.raises(RuntimeError, match="outside the 8-byte launch struct"):
        native_op.offer(types.SimpleNamespace(native=bad), x, weight_args(qw), None, "auto", None, native_op.epoch())


def test_quant_linear_compiles_to_the_native_op(layer, monkeypatch):
    """With the opt-in set, a compiled QuantLinear's graph calls quant_linear_native (fullgraph), and its
    results are eager's."""
    x, qw, host = layer
    monkeypatch.setattr(native_op, "ON", True)
    mod = QuantLinear(qw, torch.randn(qw.N))
    with torch.no_grad():
        eager = mod(x)
        torch._dynamo.reset()
        seen = []
        compiled = torch.compile(mod, fullgraph=True, backend=lambda gm, _: seen.append(gm) or gm)
        got = compiled(x)
        assert any("quant_linear_native" in str(n.target) for gm in seen for n in gm.graph.nodes)
        torch.testing.assert_close(got, eager, rtol=0, atol=0)
        # a plan for the module's own buffers: the compiled graph's call is then a C++ hit
        _add_plan(x, ht.QuantWeight(*mod._weight_args("weight", None)[:2], qw.scheme, qw.shape), mod.bias, host,
                  args=mod._weight_args("weight", None))
        hit = compiled(x)
    assert host.calls == 1
    torch.testing.assert_close(hit, eager, rtol=1e-4, atol=1e-4)


# --- grouped_linear_native ------------------------------------------------------------------------------------
class _GroupedCall(ctypes.Structure):  # the grouped stand-in's struct: x / y / stream / bias / offsets patched
    _fields_ = [("tag", ctypes.c_int), ("rows", ctypes.c_int), ("n", ctypes.c_int), ("k", ctypes.c_int),
                ("experts", ctypes.c_int), ("i64", ctypes.c_int), ("x", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("stream", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("offsets", ctypes.c_void_p)]


class _GroupedHostLaunch(_HostLaunch):
    """y[r] = x[r] @ w[e].T (+ bias[e]) for offsets[e] <= r < offsets[e + 1], from the struct's pointers."""

    def _run(self, ptr):
        c = _GroupedCall.from_address(ptr)
        self.calls += 1
        self.seen = (c.tag, c.x, c.y, c.stream, c.bias, c.offsets)
        if self.error:
            return self.error
        f32 = ctypes.POINTER(ctypes.c_float)
        x = np.ctypeslib.as_array(ctypes.cast(c.x, f32), shape=(c.rows, c.k)).astype(np.float64)
        y = np.ctypeslib.as_array(ctypes.cast(c.y, f32), shape=(c.rows, c.n))
        index = ctypes.POINTER(ctypes.c_int64 if c.i64 else ctypes.c_int32)
        o = np.ctypeslib.as_array(ctypes.cast(c.offsets, index), shape=(c.experts + 1,))
        b = np.ctypeslib.as_array(ctypes.cast(c.bias, f32), shape=(c.experts, c.n)) if c.bias else None
        for e in range(c.experts):
            y[o[e]:o[e + 1]] = x[o[e]:o[e + 1]] @ self.w[e].T + (0 if b is None else b[e])
        return 0


def _grouped_native(x, offsets, qw, host, weight_bias=False) -> NativeLaunch:
    call = _GroupedCall(tag=9, rows=x.shape[0], n=qw.N, k=qw.K, experts=qw.num_experts,
                        i64=int(offsets.dtype == torch.int64))
    return NativeLaunch(bytes(call), (_GroupedCall.x.offset, _GroupedCall.y.offset, _GroupedCall.stream.offset,
                                      _GroupedCall.bias.offset, _GroupedCall.offsets.offset),
                        host.address, 0, (x.shape[0], qw.N), torch.float32, (), weight_bias)


def _grouped_op(x, qw, offsets, bias=None, backend="auto", out_dtype=None):
    return torch.ops.humming_triton.grouped_linear_native(x, *weight_args(qw), offsets, bias, backend, out_dtype)


def _offsets(rng, rows: int, experts: int, dtype=torch.int64) -> torch.Tensor:
    cuts = torch.randint(0, rows + 1, (experts - 1,), generator=rng).sort().values
    return torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([rows])]).to(dtype)


@pytest.fixture
def experts(rng):
    assert native_op.unavailable() is None, native_op.unavailable()
    native_op.reset()
    qw = ht.quantize_weight(torch.randn(4, 24, 128, generator=rng), "w4a16")
    x = torch.randn(6, 128, generator=rng)
    host = _GroupedHostLaunch(ht.dequantize_weight(qw).float())
    yield x, qw, host
    native_op.reset()


def _add_grouped_plan(x, offsets, qw, bias, host, backend="auto", made_at=None, weight_bias=False):
    made_at = native_op.epoch() if made_at is None else made_at
    native = _grouped_native(x, offsets, qw, host, weight_bias)
    assert native_op.offer(types.SimpleNamespace(native=native), x, weight_args(qw), bias, backend, None, made_at,
                           offsets=offsets)


def test_a_grouped_hit_runs_the_planned_launch_with_this_calls_offsets(experts, rng):
    """The row offsets are data (device memory the kernel reads): a hit patches this call's pointer, so other
    routings of the same shape run the same plan, each right."""
    x, qw, host = experts
    bias = torch.randn(qw.num_experts, qw.N, generator=rng)
    _add_grouped_plan(x, _offsets(rng, x.shape[0], 4), qw, bias, host)
    for _ in range(3):
        offsets = _offsets(rng, x.shape[0], 4)
        before = native_op.stats()
        y = _grouped_op(x, qw, offsets, bias)
        assert _hits_misses_since(before) == (1, 0)
        assert host.seen == (9, x.data_ptr(), y.data_ptr(), None, bias.data_ptr(), offsets.data_ptr())
        w, o = ht.dequantize_weight(qw).double(), offsets.tolist()
        want = torch.cat([x[o[e]:o[e + 1]].double() @ w[e].T + bias[e].double() for e in range(4)])
        torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("change", ["offsets_dtype", "offsets_strided", "offsets_2d", "other_rows", "bias_shape",
                                    "no_bias", "in_place_scales", "scales_memory_swapped", "backend", "reset"])
def test_anything_the_grouped_plan_was_not_made_for_misses(experts, rng, change):
    x, qw, host = experts
    bias = torch.randn(qw.num_experts, qw.N, generator=rng)
    offsets = _offsets(rng, x.shape[0], 4)
    _add_grouped_plan(x, offsets, qw, bias, host)
    backend = "auto"
    if change == "offsets_dtype":
        offsets = offsets.int()
    elif change == "offsets_strided":  # the planned dtype and count, every other element of a longer tensor
        offsets = torch.stack([offsets, offsets], 1).reshape(-1)[::2]
    elif change == "other_rows":
        x = torch.randn(x.shape[0] + 1, x.shape[1], generator=rng)
        offsets = offsets.clone()
        offsets[-1] += 1
    elif change == "bias_shape":  # the planned dtype and element count, another shape
        bias = bias.reshape(-1)
    elif change == "no_bias":
        bias = None
    elif change == "offsets_2d":  # the planned dtype and count, another shape
        offsets = offsets.view(1, -1)
    elif change == "in_place_scales":
        qw.scales.mul_(2)
    elif change == "scales_memory_swapped":  # `t.data = other`: the same tensor and version, other memory
        qw.scales.data = qw.scales.data * 2
    elif change == "backend":
        backend = "reference"
    elif change == "reset":
        native_op.reset()
    before = native_op.stats()
    if change in ("bias_shape", "offsets_2d"):  # the Python path names the problem
        with pytest.raises(ValueError, match="bias" if change == "bias_shape" else "offsets"):
            _grouped_op(x, qw, offsets, bias, backend)
    else:
        got = _grouped_op(x, qw, offsets, bias, backend)
        want = torch.ops.humming_triton.grouped_linear_nograd(x, *weight_args(qw), offsets, bias, backend, None)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert host.calls == 0, change
    assert _hits_misses_since(before) == (0, 1), change


def test_a_grouped_plan_reads_the_weights_own_bias_per_call(rng):
    """A launch marked ``weight_bias`` (decode_mma.grouped_runner for a weight with its own expert bias, e.g.
    gpt-oss) gets the weight's bias pointer patched in per call; when that tensor's memory is swapped
    (``t.data = other``: same tensor, same version) the plan misses and the Python path answers."""
    assert native_op.unavailable() is None, native_op.unavailable()
    native_op.reset()
    plain = ht.quantize_weight(torch.randn(4, 24, 128, generator=rng), "w4a16")
    qw = ht.QuantWeight(plain.data, plain.scales, plain.scheme, plain.shape,
                        bias=torch.randn(4, 24, generator=rng))
    x = torch.randn(6, 128, generator=rng)
    offsets = _offsets(rng, 6, 4)
    host = _GroupedHostLaunch(ht.dequantize_weight(qw).float())
    _add_grouped_plan(x, offsets, qw, None, host, weight_bias=True)
    before = native_op.stats()
    y = _grouped_op(x, qw, offsets)
    assert _hits_misses_since(before) == (1, 0) and host.seen[4] == qw.bias.data_ptr()
    want = torch.ops.humming_triton.grouped_linear_nograd(x, *weight_args(qw), offsets, None, "auto", None)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    qw.bias.data = qw.bias.data + 1
    again = _grouped_op(x, qw, offsets)
    assert _hits_misses_since(before) == (1, 1) and host.calls == 1
    want = torch.ops.humming_triton.grouped_linear_nograd(x, *weight_args(qw), offsets, None, "auto", None)
    torch.testing.assert_close(again, want, rtol=0, atol=0)
    native_op.reset()


def test_dense_and_grouped_plans_never_serve_each_other(experts, rng):
    """One table, keyed by the weight's data tensor: a plan made for one op misses the other, and a launch
    without an offsets field is not offered for a grouped call (nor one with it for a dense call)."""
    x, qw, host = experts
    offsets = _offsets(rng, x.shape[0], 4)
    dense = types.SimpleNamespace(native=_native(x, qw.N, host))
    assert not native_op.offer(dense, x, weight_args(qw), None, "auto", None, native_op.epoch(), offsets=offsets)
    grouped = types.SimpleNamespace(native=_grouped_native(x, offsets, qw, host))
    assert not native_op.offer(grouped, x, weight_args(qw), None, "auto", None, native_op.epoch())
    assert native_op.plans_count() == 0
    native_op.offer(dense, x, weight_args(qw), None, "auto", None, native_op.epoch())  # as a dense plan
    before = native_op.stats()
    _grouped_op(x, qw, offsets)
    assert _hits_misses_since(before) == (0, 1) and host.calls == 0


def test_the_grouped_python_path_hands_its_plans_to_the_table(experts, rng, monkeypatch):
    x, qw, host = experts
    offsets = _offsets(rng, x.shape[0], 4)
    class Runner:  # a Python plan whose launch is native (as decode_mma.grouped_runner's)
        native = _grouped_native(x, offsets, qw, host)

        def __call__(self, x, offsets, bias):
            return ht.grouped_linear(x, qw, offsets, bias, backend="reference")
    runner = Runner()
    real_find = ht.plans.find

    def find(q, key, bias):  # what the native grouped family would have planned on "auto"
        return runner if key[:2] == ("grouped_linear", "auto") else real_find(q, key, bias)
    monkeypatch.setattr(ht.plans, "find", find)
    before = native_op.stats()
    miss = _grouped_op(x, qw, offsets)
    assert native_op.plans_count() == 1
    hit = _grouped_op(x, qw, offsets)
    assert _hits_misses_since(before) == (1, 1) and host.calls == 1
    torch.testing.assert_close(hit, miss, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("switch", ["native", "triton"])
def test_an_opt_in_switch_selects_its_graph_in_a_compiled_module(layer, monkeypatch, switch):
    """The switches are module globals that dynamo guards: one compiled module (and any copy of it: dynamo shares
    their graphs) runs the default graph with the switch off and the opt-in one with it on, each traced once --
    the same-run A/B of benchmarks.e2e.  (An os.environ read, as before, was not guarded: flipping it after the
    first trace changed nothing, and the A/B timed the default twice.)"""
    from humming_triton.kernels import compiled as compiled_mod
    x, qw, host = layer
    module, op = (native_op, "quant_linear_native") if switch == "native" else (compiled_mod, "quant_linear_triton")
    monkeypatch.setattr(module, "ON", False)
    mod = QuantLinear(qw)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(mod, fullgraph=True, backend=capture)
        twin = torch.compile(copy.deepcopy(mod), fullgraph=True, backend=capture)
        compiled(x)
        module.set_enabled(True)
        twin(x)
        module.set_enabled(False)
        compiled(x)
        twin(x)
        module.set_enabled(True)
        compiled(x)
    assert len(graphs) == 2, graphs  # one trace per switch value, shared by the module and its copy
    ours = [{t for t in g if t.startswith("humming_triton.")} for g in graphs]
    if switch == "native":
        assert ours == [{"humming_triton.quant_linear_nograd"}, {"humming_triton.quant_linear_native"}], ours
    else:  # on the CPU the triton_op path declines (x is not on CUDA), but the switch was read and guarded
        assert ours == [{"humming_triton.quant_linear_nograd"}] * 2, ours


def test_eager_modules_take_the_native_ops_when_switched_on(layer, rng, monkeypatch):
    """With the switch on, an eager QuantLinear calls quant_linear_native (a C++ hit once planned) and the CUDA
    fused MoE's two grouped GEMMs call grouped_linear_native; off, neither does."""
    from humming_triton.kernels import moe as moe_kernels
    x, qw, host = layer
    mod = QuantLinear(qw, torch.randn(qw.N))
    args = mod._weight_args("weight", None)
    with torch.no_grad():
        monkeypatch.setattr(native_op, "ON", False)
        _add_plan(x, ht.QuantWeight(*args[:2], qw.scheme, qw.shape), mod.bias, host, args=args)
        off = mod(x)
        assert host.calls == 0
        monkeypatch.setattr(native_op, "ON", True)
        on = mod(x)
        assert host.calls == 1
        torch.testing.assert_close(on, off, rtol=1e-4, atol=1e-4)
        e, h, i, t, k = 4, 128, 128, 3, 2
        w13 = ht.quantize_weight(torch.randn(e, 2 * i, h, generator=rng), "w4a16")
        w2 = ht.quantize_weight(torch.randn(e, h, i, generator=rng), "w4a16")
        hidden = torch.randn(t, h, generator=rng)
        wts, ids = torch.topk(torch.softmax(torch.randn(t, e, generator=rng), -1), k)
        before = native_op.stats()
        got = moe_kernels.triton_fused_moe(hidden, w13, w2, wts, ids)
        assert _hits_misses_since(before) == (0, 2)  # both GEMMs through the op (the reference plans nothing)
        monkeypatch.setattr(native_op, "ON", False)
        want = moe_kernels.triton_fused_moe(hidden, w13, w2, wts, ids)
        assert _hits_misses_since(before) == (0, 2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _load_op() -> None:
    """Load the C++ op and empty its table.  Until it is loaded, the op is its Python body, which plans nothing in
    C++ (modules load it through ``native_op.enabled()``; a test calling the op directly must do so itself)."""
    why = native_op.unavailable()
    if why is not None:
        pytest.fail(why)
    native_op.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4", "w8a16"])
def test_native_op_on_gpu(scheme, rng):
    """The real thing: the second call of a signature runs from the C++ table (the native decode kernel), equal
    to the Python path's result and to the reference; an in-place edit of the scales is seen; a CUDA graph captured
    on the C++ path replays it."""
    from cutlass_ext import native
    if native.unavailable():
        pytest.fail(native.unavailable())  # asked for GPU tests: a missing build is a failure, not a skip
    _load_op()
    qw = ht.quantize_weight(torch.randn(512, 1024, generator=rng), scheme)
    x = torch.randn(4, 1024, generator=rng).bfloat16()

    def check(y, what):
        ref = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
        assert_linear_close(y.cpu(), ref, x.float(), ht.dequantize_weight(qw), torch.bfloat16, f"{scheme} {what}")

    qg, xg = qw.to("cuda"), x.cuda()
    with torch.no_grad():
        first = _op(xg, qg, None, "cuda")
        assert native_op.plans_count() == 1, "the native decode plan was not handed to the C++ table"
        before = native_op.stats()
        second = _op(xg, qg, None, "cuda")
        assert _hits_misses_since(before) == (1, 0), "the second call was not a C++ hit"
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
        before = native_op.stats()
        with torch.cuda.graph(graph):
            captured = _op(static, qg, None, "cuda")
        assert _hits_misses_since(before) == (1, 0), "the captured call was not a C++ hit"
        x = torch.randn(4, 1024, generator=rng).bfloat16()
        static.copy_(x.cuda())
        graph.replay()
        check(captured, "CUDA-graph replay")
    native_op.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4"])
@pytest.mark.parametrize("rows", [6, 24])
def test_grouped_native_op_on_gpu(scheme, rows, rng):
    """The grouped decode kernel from the C++ table: the second call of a signature is a C++ hit whatever the
    routing (the offsets are read on the device), equal to the Python path and to the reference; an edit of the
    scales is seen; a captured CUDA graph replays new routings."""
    from cutlass_ext import native
    if native.unavailable():
        pytest.fail(native.unavailable())
    _load_op()
    e = 8
    qw = ht.quantize_weight(torch.randn(e, 256, 512, generator=rng), scheme)
    qg = qw.to("cuda")

    def inputs():
        return torch.randn(rows, 512, generator=rng).bfloat16(), _offsets(rng, rows, e)

    def check(y, x, offsets, what):  # each expert's rows against its own weight's tolerance
        ref = ht.reference_grouped_linear(x.float(), qw, offsets, out_dtype=torch.float32).double()
        w_hat, o, y = ht.dequantize_weight(qw), offsets.tolist(), y.cpu()
        for i in range(e):
            assert_linear_close(y[o[i]:o[i + 1]], ref[o[i]:o[i + 1]], x[o[i]:o[i + 1]].float(), w_hat[i],
                                torch.bfloat16, f"{scheme} rows={rows} expert {i} {what}")

    def op(x, offsets):
        return torch.ops.humming_triton.grouped_linear_native(x.cuda(), *weight_args(qg), offsets.cuda(), None,
                                                              "cuda", torch.float32)
    with torch.no_grad():
        x, offsets = inputs()
        first = op(x, offsets)
        assert native_op.plans_count() == 1, "the grouped decode plan was not handed to the C++ table"
        before = native_op.stats()
        second = op(x, offsets)
        assert _hits_misses_since(before) == (1, 0), "the second call was not a C++ hit"
        torch.testing.assert_close(second, first, rtol=0, atol=0)
        check(second, x, offsets, "C++ hit")
        x, offsets = inputs()  # another routing, same signature
        xg, og = x.cuda(), offsets.cuda()
        before = native_op.stats()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # a C++ hit never waits on the device
        try:
            routed = torch.ops.humming_triton.grouped_linear_native(xg, *weight_args(qg), og, None, "cuda",
                                                                    torch.float32)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert _hits_misses_since(before) == (1, 0)
        check(routed, x, offsets, "another routing")
        qg.scales.copy_(qg.scales.roll(1, 1))
        qw.scales.copy_(qw.scales.roll(1, 1))
        check(op(x, offsets), x, offsets, "after an in-place edit")
        op(x, offsets)  # planned again
        static_x, static_o = x.cuda(), offsets.cuda()
        graph = torch.cuda.CUDAGraph()
        before = native_op.stats()
        with torch.cuda.graph(graph):
            captured = torch.ops.humming_triton.grouped_linear_native(static_x, *weight_args(qg), static_o, None,
                                                                      "cuda", torch.float32)
        assert _hits_misses_since(before) == (1, 0), "the captured call was not a C++ hit"
        x, offsets = inputs()
        static_x.copy_(x.cuda())
        static_o.copy_(offsets.cuda())
        graph.replay()
        check(captured, x, offsets, "CUDA-graph replay")
    native_op.reset()
