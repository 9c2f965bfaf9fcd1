import os

import torch

# Without a GPU, Triton kernels run in the interpreter on CPU tensors; it must be set before any kernel module
# is imported (triton.jit reads it at decoration time).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# hypothesis profiles: "ci" (the default), "nightly" (10x the examples: HYPOTHESIS_PROFILE=nightly), "dev" (quick).
# Tests that set their own count scale it with humming_triton.testing.examples().
settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("nightly", parent=settings.get_profile("ci"), max_examples=1000)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=10)
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
