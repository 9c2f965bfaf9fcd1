import os

import torch

# Without a GPU, Triton kernels run in the interpreter on CPU tensors; it must be set before any kernel module
# is imported (triton.jit reads it at decoration time).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


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
    """Fresh random inputs each run; the seed is printed (shown with a failure's captured output)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed: {seed}")
    return torch.Generator().manual_seed(seed)
