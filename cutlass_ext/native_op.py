"""The C++ kernels of ``humming_triton::quant_linear_native`` and ``grouped_linear_native``
(csrc_op/native_op.cpp): a planned decode call with no Python on its host path, for compiled graphs (issue 14).
A switch (humming_triton/switches.py): on where the device's measured table says so (the H100's, from session 35;
not yet the H200's), or by ``HUMMING_TRITON_NATIVE_OP=1`` at import / ``set_enabled(True)``.

The kernels are built against the running torch on first use (``torch.utils.cpp_extension``: a C++ compiler and
ninja, ~20 s on 2 cores, cached per torch version and source); a build that fails leaves the ops on their Python
kernels, which are the ``_nograd`` twins'.  On a miss the C++ kernel calls the op's Python side
(``humming_triton.ops._quant_linear_native_miss`` / ``_grouped_linear_native_miss``), which runs the full path and
calls ``offer``: a plan whose runner is a native decode kernel's is copied into the C++ table, which the next call
with that signature and weight (same tensors, same version counters) runs from C++ -- output, struct copy, launch."""
from __future__ import annotations

import functools
import hashlib
import re
import warnings
import weakref
from pathlib import Path

import torch

from humming_triton import switches

__all__ = ["ENV", "ON", "set_enabled", "enabled", "built", "unavailable", "epoch", "offer", "reset", "plans_count",
           "stats"]

ENV = "HUMMING_TRITON_NATIVE_OP"
SOURCE = Path(__file__).resolve().parent / "csrc_op" / "native_op.cpp"


@functools.lru_cache(maxsize=None)
def _load() -> str | None:
    """Build (or find cached) and load the C++ kernel: None when loaded, else why not."""
    try:
        from torch.utils.cpp_extension import load
        # per torch version and source text: two checkouts (or versions) never share, or fight over, a build
        digest = hashlib.sha1(SOURCE.read_bytes()).hexdigest()[:10]
        name = f"ht_native_op_{re.sub(r'[^0-9A-Za-z]', '_', torch.__version__)}_{digest}"
        load(name=name, sources=[str(SOURCE)], extra_cflags=["-O2"], is_python_module=False, verbose=False)
    except Exception as e:  # no compiler / ninja, or a torch without the C++ headers
        return f"the native op's C++ kernel did not build ({type(e).__name__}: {str(e)[:400]})"
    from humming_triton import state_watch
    state_watch.watch(reset)
    return None


def unavailable() -> str | None:
    return _load()


# The switch (humming_triton/switches.py): the environment's at import, ``set_enabled`` after; None: the device's
# measured table decides.  Modules call ``enabled()``, which dynamo inlines: it guards the module global's value, so
# graphs traced with the switch on and off coexist and each call runs the one of the switch's value now.  (A read
# of os.environ, or a function of it folded as a constant, is not guarded: a module compiled with the switch off
# kept its graph when it was turned on -- and so did every copy of it, whose graphs dynamo shares -- which is how
# benchmarks.e2e's A/B of session 20 timed the default twice.)
ON = switches.from_env(ENV)


def set_enabled(on: bool | None) -> None:
    """True / False: the native ops on / off from now on; None: as the device's measured table says."""
    global ON
    ON = None if on is None else bool(on)


def _table_tokens(scheme: str) -> int:
    return switches.table_tokens("native_op", scheme)


# the device's verdict, folded by torch.compile as a constant at trace time (one device kind per process)
table_tokens = torch._dynamo.assume_constant_result(_table_tokens)


def _built() -> bool:
    why = _load()
    if why is not None and not _WARNED:  # asked for (switched on): say once why the Python host path runs instead
        _WARNED.append(why)
        warnings.warn(f"{why}; the Python host path runs instead", RuntimeWarning, stacklevel=3)
    return why is None


_WARNED: list[str] = []


# torch.compile evaluates this once, at trace time, as a constant (the first call may build the kernel)
built = torch._dynamo.assume_constant_result(_built)


def enabled(tokens: int, scheme: str) -> bool:
    """Whether modules call the native ops for a call of ``tokens`` tokens of ``scheme``: the switch is on (or,
    unset, the device's table turns it on for that scheme and token count) and the kernel built (the first call
    may build it)."""
    return (ON if ON is not None else 0 < tokens <= table_tokens(scheme)) and built()


def _loaded() -> bool:  # without building: a table exists only once the kernel was loaded
    return _load.cache_info().currsize > 0 and _load() is None


def reset() -> None:
    """Void every C++ plan (dispatch's state changed: ``humming_triton.state_watch``)."""
    if _loaded():
        torch.ops.humming_triton._native_plans_reset()


def epoch() -> int:
    """The C++ table's epoch now: read it before the Python path plans, pass it to ``offer`` (a reset in between
    voids the plan)."""
    return int(torch.ops.humming_triton._native_plans_epoch()) if _loaded() else -1


def plans_count() -> int:
    return int(torch.ops.humming_triton._native_plans_count()) if _loaded() else 0


def stats() -> tuple[int, int]:
    """(hits, misses) of ``quant_linear_native`` and ``grouped_linear_native`` in this process."""
    return tuple(torch.ops.humming_triton._native_plans_stats()) if _loaded() else (0, 0)


_WATCHED: dict[int, weakref.ref] = {}  # id -> weak reference of each weight tensor whose plans go with it


def _watch(data: torch.Tensor) -> None:
    """Drop ``data``'s plans (and the tensors they hold) when it is collected.  Once per tensor object, keyed by
    identity: a deepcopy or a loaded copy is another object, so no copyable mark is used."""
    key = id(data)
    held = _WATCHED.get(key)
    if held is not None and held() is data:
        return

    def gone(ref, key=key, impl=data._cdata):  # runs while the TensorImpl is still alive: drop by its address
        if _WATCHED.get(key) is ref:
            del _WATCHED[key]
        if _loaded():
            torch.ops.humming_triton._native_plans_drop(impl)
    _WATCHED[key] = weakref.ref(data, gone)


def offer(runner, x: torch.Tensor, args: tuple, bias: torch.Tensor | None, backend: str,
          out_dtype: torch.dtype | None, made_at: int, offsets: torch.Tensor | None = None) -> bool:
    """Copy ``runner`` (the Python plan of this call) into the C++ table if it carries a native launch
    (``decode_mma.NativeLaunch``); ``args``: the op's weight arguments (``humming_triton.ops.weight_args``);
    ``made_at``: ``epoch()`` before the plan was made; ``offsets``: a grouped_linear call's row offsets (its plan
    then serves ``grouped_linear_native``, and the launch must name where the offsets go).  Returns whether it was
    offered (the table still refuses a plan of an older epoch or of inference-tensor weights).  The table holds the
    weight weakly and the launch's own tensors strongly: when the weight is collected, its plans and those tensors
    go at once."""
    native = getattr(runner, "native", None)
    if native is None or _load() is not None or (offsets is not None) != (native.offsets[4] >= 0):
        return False
    call = torch.frombuffer(bytearray(native.call), dtype=torch.uint8)
    torch.ops.humming_triton._native_plan_add(x, *args, offsets, bias, backend, out_dtype, call, native.launch,
                                              native.error_string, list(native.offsets), list(native.out_shape),
                                              native.out_dtype, list(native.keep), native.weight_bias, made_at)
    _watch(args[0])
    return True
