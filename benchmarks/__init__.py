"""The benchmark harness of humming_triton: ``python3 -m benchmarks [--suite headline|decode|full] ...``.

Every performance claim of the project is a ratio against the peers measured in the same run, so this package
runs our kernels and the peers (cuBLAS, ``torch._scaled_mm``, ``torch._grouped_mm``, humming-kernels, gemlite)
side by side, checks each output against a reference before timing it, and writes JSON + markdown + plots.
See benchmarks/README.md.
"""
