"""Host-side cost of one quantized linear call, per path: ``python3 -m benchmarks.overhead [--out FILE.json]``.

Decode steps are short (tens of µs of GPU work per layer), so the CPU time to get a kernel launched decides
eager and torch.compile speed unless the step is replayed as a CUDA graph.  For one W4A16 4096x4096 layer at
M = 1 this prints the CPU µs per call (no sync inside the timed loop), all in one run: bf16 ``F.linear`` and the
``nn.Linear`` module (the baselines); ``ht.quant_linear`` and the ``QuantLinear`` module in eager inference with
call plans (humming_triton/plans.py, the default) and without (every call the full path); the module's custom
ops (``quant_linear`` with its autograd layer, ``quant_linear_nograd``); a ``backend="triton"`` module with Triton's
compiled-kernel replay (the default) and through Triton's launcher (``HUMMING_TRITON_LAUNCH_REPLAY=0``); both
modules under ``torch.compile(fullgraph=True)``, the module compiled onto the C++ host path
(``quant_linear_native``, opt-in: cutlass_ext/native_op.py) and that op's planned call; a QuantMoE decode step
eager, compiled, and compiled onto ``grouped_linear_native``; the GPU µs of one call (CUDA-graph replay); whether
the compiled path rebuilt QuantWeights or recompiled; and profiles of the compiled and the eager call.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

import humming_triton as ht
from cutlass_ext import native_op
from humming_triton import ops, plans

from .e2e import every_switch_off, switched_on


def _cpu_us(fn, reps: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


def _fresh(mod) -> None:
    """Forget a module's planned calls and cached Triton launches (the next call plans again)."""
    for w in (mod.quant_weight, getattr(mod.quant_weight.data, ops._CACHE_ATTR, (None, None))[1]):
        if w is not None:
            w.cache.pop("plans", None)
            w.cache.get("triton", {}).pop("launches", None)


def _moe_rows(rows: dict) -> None:
    """A compiled QuantMoE decode step (Qwen3-30B-A3B's expert shapes, one token, top 8) on ``auto``: the default
    graph (two grouped_linear_nograd ops) and, where the C++ kernel builds, the opt-in grouped_linear_native."""
    e, h, i, k = 128, 2048, 768, 8
    w13 = ht.quantize_weight(torch.randn(e, 2 * i, h, device="cuda") / 8, "w4a16")
    w2 = ht.quantize_weight(torch.randn(e, h, i, device="cuda") / 8, "w4a16")
    moe = ht.QuantMoE(w13, w2, backend="auto")
    hidden = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)
    wts, ids = torch.topk(torch.softmax(torch.randn(1, e, device="cuda"), -1), k)
    rows["QuantMoE eager"] = _cpu_us(lambda: moe(hidden, ids, wts))
    compiled = torch.compile(moe, fullgraph=True)
    compiled(hidden, ids, wts)
    rows["QuantMoE compiled"] = _cpu_us(lambda: compiled(hidden, ids, wts))
    if native_op.unavailable() is None:
        with switched_on(native_op):
            native = torch.compile(copy.deepcopy(moe), fullgraph=True)
            native(hidden, ids, wts)
            before = native_op.stats()
            rows["QuantMoE compiled (native op)"] = _cpu_us(lambda: native(hidden, ids, wts))
            hits, misses = (a - b for a, b in zip(native_op.stats(), before))
            print(f"compiled QuantMoE on the native op: {hits} C++ hits, {misses} misses")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the rows as JSON here")
    args_ = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.overhead needs a CUDA GPU", file=sys.stderr)
        return 2
    with every_switch_off():  # the default rows on the Python host path; the native rows switch it on themselves
        return _measure(args_)


def _measure(args_) -> int:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4096, 4096, bias=False, device="cuda", dtype=torch.bfloat16)
    mod = ht.QuantLinear.from_linear(lin, "w4a16").eval()
    tmod = ht.QuantLinear.from_linear(lin, "w4a16", backend="triton").eval()
    qw = mod.quant_weight
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    builds = [0]
    orig_init = ops.QuantWeight.__init__

    def counting_init(self, *a, **k):
        builds[0] += 1
        orig_init(self, *a, **k)

    rows = {}
    with torch.no_grad():
        rows["bf16 F.linear (cuBLAS)"] = _cpu_us(lambda: torch.nn.functional.linear(x, lin.weight))
        rows["bf16 nn.Linear (module)"] = _cpu_us(lambda: lin(x))
        plans.ENABLED = False
        try:
            rows["ht.quant_linear (full path)"] = _cpu_us(lambda: ht.quant_linear(x, qw))
            rows["QuantLinear eager (full path)"] = _cpu_us(lambda: mod(x))
        finally:
            plans.ENABLED = True
        rows["ht.quant_linear (planned)"] = _cpu_us(lambda: ht.quant_linear(x, qw))
        rows["QuantLinear eager (planned)"] = _cpu_us(lambda: mod(x))
        args = mod._weight_args("weight", None)
        rows["torch.ops quant_linear"] = _cpu_us(
            lambda: torch.ops.humming_triton.quant_linear(x, *args, mod.bias, mod.backend, None))
        rows["torch.ops quant_linear_nograd"] = _cpu_us(
            lambda: torch.ops.humming_triton.quant_linear_nograd(x, *args, mod.bias, mod.backend, None))
        if native_op.unavailable() is None:  # the C++ host path (opt-in): its hit once the first call planned
            torch.ops.humming_triton.quant_linear_native(x, *args, mod.bias, mod.backend, None)
            rows["torch.ops quant_linear_native"] = _cpu_us(
                lambda: torch.ops.humming_triton.quant_linear_native(x, *args, mod.bias, mod.backend, None))
            print(f"native op: {native_op.plans_count()} C++ plan(s) (0: every call a miss, i.e. the Python body)")
        rows["QuantLinear triton eager (replay)"] = _cpu_us(lambda: tmod(x))
        os.environ["HUMMING_TRITON_LAUNCH_REPLAY"] = "0"  # Triton's launcher binds every argument per call
        _fresh(tmod)
        try:
            rows["QuantLinear triton eager (launcher)"] = _cpu_us(lambda: tmod(x))
        finally:
            os.environ.pop("HUMMING_TRITON_LAUNCH_REPLAY")
            _fresh(tmod)
        compiled_lin = torch.compile(lin, fullgraph=True)
        compiled_lin(x)
        rows["bf16 nn.Linear compiled"] = _cpu_us(lambda: compiled_lin(x))
        compiled = torch.compile(mod, fullgraph=True)
        compiled(x)
        torch._dynamo.utils.counters.clear()
        ops.QuantWeight.__init__ = counting_init
        try:
            rows["QuantLinear compiled"] = _cpu_us(lambda: compiled(x))
        finally:
            ops.QuantWeight.__init__ = orig_init
        if native_op.unavailable() is None:
            with switched_on(native_op):  # a guarded global: this copy's graph calls the native op
                compiled_native = torch.compile(copy.deepcopy(mod), fullgraph=True)
                compiled_native(x)
                before = native_op.stats()
                rows["QuantLinear compiled (native op)"] = _cpu_us(lambda: compiled_native(x))
                hits, misses = (a - b for a, b in zip(native_op.stats(), before))
                print(f"compiled QuantLinear on the native op: {hits} C++ hits, {misses} misses")
        _moe_rows(rows)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            mod(x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(100):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        gpu_us = start.elapsed_time(end) / 100 * 1e3
    print(f"path: {ht.dispatch.last_plan()}")
    for name, us in rows.items():
        print(f"{name:28s} {us:8.1f} µs CPU per call")
    print(f"{'GPU time (graph replay)':28s} {gpu_us:8.1f} µs")
    eager_ratio = rows["QuantLinear eager (planned)"] / rows["bf16 nn.Linear (module)"]
    compiled_ratio = rows["QuantLinear compiled"] / rows["bf16 nn.Linear compiled"]
    print(f"QuantLinear / nn.Linear host time: eager {eager_ratio:.2f}x, compiled {compiled_ratio:.2f}x")
    print(f"compiled calls: QuantWeight rebuilds {builds[0]}, dynamo counters {dict(torch._dynamo.utils.counters)}")
    if args_.out:
        with open(args_.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows_us": rows,
                       "gpu_us": gpu_us, "path": ht.dispatch.last_plan(), "eager_ratio": eager_ratio,
                       "compiled_ratio": compiled_ratio, "quantweight_rebuilds": builds[0]}, f, indent=1)
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            compiled(x)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    import cProfile
    import pstats
    with torch.no_grad():
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(200):
            mod(x)
        profiler.disable()
    torch.cuda.synchronize()
    print("Python time of 200 eager QuantLinear calls:")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
