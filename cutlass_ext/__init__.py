"""Native CUDA kernels of humming_triton, for the rows where Triton is measured to be slower.

Built with nvcc into one shared library (``python3 -m cutlass_ext.build``) and called through ctypes on torch's
current stream (CUDA-graph capture works).  Importing this package touches no CUDA and needs no build: the library
is loaded on first use, and a missing library is a reason (``native.unavailable()``), never an import error.
"""
