"""Host-side cost of one quantized linear call, per path: ``python3 -m benchmarks.overhead``.

Decode steps are short (tens of µs of GPU work per layer), so the CPU time to get a kernel launched decides
eager and torch.compile speed unless the step is replayed as a CUDA graph.  For one W4A16 4096x4096 layer at
M = 1 this prints the CPU µs per call (no sync inside the timed loop) of: the raw Triton launcher, ``ht.quant_linear``,
the ``QuantLinear`` module in eager inference (the op's body run directly) and through ``torch.ops`` (the
custom-op layer compile and autograd use), again with the compiled-kernel replay
(``HUMMING_TRITON_LAUNCH_REPLAY=1``), and the module under ``torch.compile(fullgraph=True)``; the GPU µs of
one call (CUDA-graph replay); whether the compiled path rebuilt QuantWeights or recompiled; and the top host
ops of a profiled compiled call.
"""
from __future__ import annotations

import os
import sys
import time

import torch

import humming_triton as ht
from humming_triton import ops


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


def main() -> int:
    if not torch.cuda.is_available():
        print("benchmarks.overhead needs a CUDA GPU", file=sys.stderr)
        return 2
    from humming_triton.kernels.dense import triton_linear
    torch.manual_seed(0)
    lin = torch.nn.Linear(4096, 4096, bias=False, device="cuda", dtype=torch.bfloat16)
    mod = ht.QuantLinear.from_linear(lin, "w4a16").eval()
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
        rows["triton_linear (launcher)"] = _cpu_us(lambda: triton_linear(x, qw))
        rows["ht.quant_linear"] = _cpu_us(lambda: ht.quant_linear(x, qw))
        rows["QuantLinear (eager)"] = _cpu_us(lambda: mod(x))  # inference: the op's body, run directly
        args = mod._weight_args("weight", None)
        rows["QuantLinear via torch.ops"] = _cpu_us(
            lambda: torch.ops.humming_triton.quant_linear(x, *args, mod.bias, mod.backend, None))
        # the same, with Triton's compiled kernel replayed directly (HUMMING_TRITON_LAUNCH_REPLAY=1; fresh plans)
        os.environ["HUMMING_TRITON_LAUNCH_REPLAY"] = "1"
        try:
            cached = (qw, getattr(mod.quant_weight.data, ops._CACHE_ATTR, (None, qw))[1])  # the op's QuantWeight
            for w in cached:
                w.cache.get("triton", {}).pop("launches", None)
            rows["triton_linear (replay)"] = _cpu_us(lambda: triton_linear(x, qw))
            rows["QuantLinear (eager, replay)"] = _cpu_us(lambda: mod(x))
        finally:
            os.environ.pop("HUMMING_TRITON_LAUNCH_REPLAY")
            for w in cached:
                w.cache.get("triton", {}).pop("launches", None)
        compiled = torch.compile(mod, fullgraph=True)
        compiled(x)
        torch._dynamo.utils.counters.clear()
        ops.QuantWeight.__init__ = counting_init
        try:
            rows["QuantLinear compiled"] = _cpu_us(lambda: compiled(x))
        finally:
            ops.QuantWeight.__init__ = orig_init
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
    for name, us in rows.items():
        print(f"{name:28s} {us:8.1f} µs CPU per call")
    print(f"{'GPU time (graph replay)':28s} {gpu_us:8.1f} µs")
    print(f"compiled calls: QuantWeight rebuilds {builds[0]}, dynamo counters {dict(torch._dynamo.utils.counters)}")
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
