import os

import torch

# Without a GPU, Triton kernels run in the interpreter on CPU tensors; it must be set before any kernel module
# is imported (triton.jit reads it at decoration time).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402


def _interpreter_rounds_bf16_to_nearest():
    """Triton's interpreter casts fp32 -> bf16 by truncating the mantissa (its ``cast_impl`` passes no rounding
    mode); the GPU's ``cvt.rn.bf16.f32`` rounds to nearest even.  Truncation biases every rounded weight toward
    zero, and the correlated error can exceed the tolerance a real GPU meets (found by tests/test_fuzz.py: a
    uint4 weight with float zeros, 1.5 bf16 ulps off).  Make the interpreter round as the GPU does; fp32 -> e4m3
    too (the interpreter's numpy cast does not round ties to even; the GPU's cvt.rn.satfinite does, and saturates)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            nan = np.isnan(src.data.astype(np.float32))
            rounded = np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)  # stays a (quiet) NaN
            return interpreter.TensorHandle(rounded, dst_type.scalar)
        return original(self, src, dst_type)

    original_fp = interpreter.InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:  # cvt.rn.satfinite.e4m3x2.f32
            v = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            codes = torch.where(v.isnan(), v, v.clamp(-448.0, 448.0)).to(torch.float8_e4m3fn).view(torch.uint8)
            return interpreter.TensorHandle(codes.numpy().view(np.uint8), dst_type.scalar)
        return original_fp(self, src, dst_type, rounding_mode)

    interpreter.InterpreterBuilder.cast_impl = cast_impl
    interpreter.InterpreterBuilder.create_fp_to_fp = create_fp_to_fp


_interpreter_rounds_bf16_to_nearest()

# hypothesis profiles: "ci" (the default), "nightly" (10x the examples: HYPOTHESIS_PROFILE=nightly), "dev" (quick).
# Tests that set their own count scale it with humming_triton.testing.examples().
# "ci" draws the same examples every run (derandomize): a CI result is reproducible and a red run is a change's
# fault; "nightly" and "dev" draw fresh ones, which is where new failures are found (then pinned with @example).
settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", parent=settings.get_profile("ci"), max_examples=1000, derandomize=False)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=10, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# pytest-xdist runs one process per core: torch's per-process thread pools would oversubscribe the machine
# (16 workers x 16 threads made each CPU-side reference of the GPU tests take minutes)
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """GPU tests run only when asked for (`pytest -m gpu`) and a GPU exists; otherwise they are deselected,
    never reported as passing."""
    marker = config.getoption("-m") or ""
    if "gpu" in marker:
        if not torch.cuda.is_available():
            raise pytest.UsageError("`-m gpu` was asked for but no CUDA GPU is visible")
        return
    keep = [it for it in items if "gpu" not in it.keywords]
    dropped = [it for it in items if "gpu" in it.keywords]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture
def rng():
    """Fresh random inputs each run; the seed is printed (shown with a failure's captured output) and
    ``HT_SEED=<seed>`` replays it."""
    seed = int(os.environ.get("HT_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"random seed: {seed}")
    return torch.Generator().manual_seed(seed)



@pytest.fixture
def cutlass_nvcc():
    """The nvcc path for the CUTLASS compile-only tests; skips (saying what is missing) without nvcc or the
    nvidia-cutlass headers."""
    import shutil
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (the CUDA toolkit): nothing to compile with")
    try:
        import cutlass_library  # noqa: F401
    except ImportError:
        pytest.skip("nvidia-cutlass (the CUTLASS headers) is not installed: pip install nvidia-cutlass")
    return nvcc

def pytest_runtest_logreport(report):
    """GPU runs may be cut off by a time limit before pytest prints its summary, so results are logged as they
    happen: HT_FAILLOG=<file> gets each failure with its traceback tail, HT_TESTLOG=<file> one line per test
    (outcome, seconds)."""
    path = os.environ.get("HT_FAILLOG")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"FAILED {report.nodeid} ({report.when})\n{str(report.longrepr)[-1500:]}\n\n")
    log = os.environ.get("HT_TESTLOG")
    if log and (report.when == "call" or report.outcome != "passed"):
        with open(log, "a") as f:
            f.write(f"{report.outcome.upper()} {report.nodeid} {report.when} {report.duration:.1f}s\n")
