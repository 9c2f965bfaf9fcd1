"""``python3 -m humming_triton.doctor``: what this machine is and what humming_triton can run on it -- the text a
user pastes into a bug report.

Printed: versions (python, torch, triton, humming_triton and where it is imported from), CUDA and the GPU (name,
SM, SM count), the MMA kinds its tensor cores have, which backends and kernel families can run a few probe calls
here and why not, whether ``TRITON_INTERPRET`` is set, and which measured dispatch table ``backend="auto"``
reads.

Why every section catches its own errors: the report is most needed on a broken set-up (no triton, a CUDA
build without a driver, a corrupt table), so a failing probe becomes a line of the report, never a traceback.
Nothing here compiles or launches a kernel.
"""
from __future__ import annotations

import json
import os
import sys

# probe calls: one weight-only and three activation-quantized schemes cover every kernel family
PROBE_SCHEMES = ("w4a16", "w8a8-fp8", "w8a8-int8", "w4a4-nvfp4")
PROBE_M, PROBE_N, PROBE_K, PROBE_EXPERTS = 16, 4096, 4096, 8

__all__ = ["report", "main"]


def _error(e: BaseException) -> str:
    return f"error: {type(e).__name__}: {e}"


def _section(title: str, body) -> list[str]:
    """``title`` and the lines ``body()`` returns, indented; an exception is reported as the section's line."""
    try:
        lines = body()
    except Exception as e:  # noqa: BLE001 -- the report must never crash
        lines = [_error(e)]
    return [title] + [f"  {line}" for line in lines]


def _versions() -> list[str]:
    import importlib.metadata as md

    import torch

    import humming_triton as ht
    lines = [f"python          {sys.version.split()[0]} ({sys.executable})",
             f"torch           {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})"]
    try:
        import triton
        lines.append(f"triton          {triton.__version__}")
    except Exception as e:  # noqa: BLE001
        lines.append(f"triton          not importable ({type(e).__name__}: {e})")
    where = os.path.dirname(os.path.abspath(ht.__file__))
    try:
        installed = f"installed as {md.version('humming_triton')}"
    except md.PackageNotFoundError:
        # the case of issue 18: importable only from the repo root (current folder) or through PYTHONPATH
        installed = "NOT installed (run scripts/bootstrap.sh, or pip install -e .)"
    lines.append(f"humming_triton  {ht.__version__} from {where}; {installed}")
    return lines


def _interpreter() -> list[str]:
    value = os.environ.get("TRITON_INTERPRET")
    if value is None:
        return ["TRITON_INTERPRET unset: Triton kernels need CUDA tensors"]
    from .calls import interpreting
    state = "on: Triton kernels run on CPU tensors in the interpreter" if interpreting() else "off"
    return [f"TRITON_INTERPRET={value!r} ({state})"]


def _facts():
    from .capability import device_facts
    return device_facts()


def _device() -> list[str]:
    import torch

    from .capability import capability
    cuda = torch.cuda.is_available()
    lines = [f"CUDA available  {cuda}" + (f" ({torch.cuda.device_count()} device(s))" if cuda else "")]
    f = _facts()
    if cuda:
        lines.append(f"GPU             {f.name}")
    else:
        like = " (the interpreter's H200-like facts)" if f.slug is None and f.name == "cpu-interpreter" else ""
        lines.append(f"GPU             none; capability checks below use the facts of {f.name!r}{like}")
    lines += [f"SM              {f.sm[0]}.{f.sm[1]}", f"SM count        {f.num_sms}",
              f"shared memory   {f.smem_per_block // 1024} KiB per block (opt-in)",
              f"capability row  {capability(f).notes}"]
    return lines


def _mma() -> list[str]:
    from .capability import MMA_KINDS, mma_reason
    f = _facts()
    lines = []
    for kind in MMA_KINDS:
        try:
            why = mma_reason(kind, f)
            lines.append(f"{kind:13s}{'yes' if why is None else 'no: ' + why}")
        except Exception as e:  # noqa: BLE001
            lines.append(f"{kind:13s}{_error(e)}")
    return lines


def _call(op: str, scheme: str):
    import torch

    from .calls import Call
    from .formats.scheme import QuantScheme
    f = _facts()
    experts = PROBE_EXPERTS if op != "quant_linear" else 0
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return Call(op, QuantScheme.parse(scheme), torch.bfloat16, PROBE_M, PROBE_N, PROBE_K, experts,
                device_type=device_type, facts=f)


def _verdict(results: list[tuple[str, str | None]]) -> list[str]:
    """One line when every probe agrees ("runs w4a16, ..." / "no: <why>"), else the runs line and one line per
    probe that cannot run."""
    ok = [s for s, why in results if why is None]
    bad = [(s, why) for s, why in results if why is not None]
    if not bad:
        return [f"runs {', '.join(ok)}"]
    if not ok and len({why for _, why in bad}) == 1:
        return [f"no: {bad[0][1]}"]
    return [f"runs {', '.join(ok) or 'none of the probes'}"] + [f"  {s}: {why}" for s, why in bad]


def _safe_reason(fn, call) -> str | None:
    try:
        return fn(call)
    except Exception as e:  # noqa: BLE001
        return _error(e)


def _backends() -> list[str]:
    from . import backends
    lines = []
    for name, b in backends.registered().items():
        res = [(s, _safe_reason(b.reason, _call("quant_linear", s))) for s in PROBE_SCHEMES]
        verdict = _verdict(res)
        lines.append(f"{name:10s} {verdict[0]}")
        lines += [f"{'':10s} {v}" for v in verdict[1:]]
    return lines


def _family_line(fam) -> str:
    """Which probe schemes the family takes, then whether it runs here: the device's MMA for it and its backend
    (each reason once, not once per scheme)."""
    from . import backends
    from .capability import mma_reason
    takes, refused = [], []
    for s in PROBE_SCHEMES:
        call = _call(fam.op, s)
        why = _safe_reason(fam.reason, call)
        if why is None:
            takes.append((s, call))
        else:
            refused.append(why)
    if not takes:
        return f"no: {refused[0]}" if len(set(refused)) == 1 else f"takes none of the probes (e.g. {refused[0]})"
    names = ", ".join(s for s, _ in takes)
    backend = backends.registered()[fam.backend]
    runs, missing, blocked = [], [], []
    for s, c in takes:
        why = _safe_reason(lambda c: mma_reason(fam.mma(c), c.facts), c)
        if why:
            missing.append(f"{s} ({why})")
        elif _safe_reason(backend.reason, c):
            blocked.append(s)
        else:
            runs.append(s)
    if len(blocked) == len(takes):
        return f"takes {names}; here: no, its backend cannot run here (see backends)"
    if len(runs) == len(takes):
        return f"takes {names}; here: yes"
    parts = [f"yes for {', '.join(runs)}"] if runs else []
    parts += [f"not {m}" for m in missing]
    parts += [f"not {', '.join(blocked)} (its backend cannot, see backends)"] if blocked else []
    return f"takes {names}; here: " + "; ".join(parts)


def _families() -> list[str]:
    from .kernels import families
    lines = []
    for fam in families.registered():
        tag = f"{fam.backend}/{fam.name} ({fam.op})"
        lines.append(f"{tag:42s} {_safe_reason(_family_line, fam)}")
    return lines


def _table() -> list[str]:
    from . import dispatch
    slug = _facts().slug
    if slug is None:
        return ["none: no CUDA device (the interpreter has no tuned table); auto uses the built-in heuristic"]
    path = dispatch.table_path(slug)
    if not path.exists():
        return [f"none: {path} does not exist (an untuned GPU); auto uses the built-in heuristic. Tune with: "
                "python3 -m humming_triton.tune --suite headline,decode --jobs 8"]
    entries = json.loads(path.read_text()).get("dispatch") or {}
    return [f"{path} ({len(entries)} entries in its dispatch section)"]


def _switches() -> list[str]:
    """Each switch (switches.py): on / off here and why -- the environment / set_enabled, or the device's table."""
    from cutlass_ext import native_op

    from . import switches
    from .kernels import compiled, moe
    slug = _facts().slug
    table = switches.measured_switches(slug)
    lines = []
    for name, module in (("native_op", native_op), ("moe_pipeline", moe), ("compile_triton", compiled)):
        if module.ON is not None:
            lines.append(f"{name:15s} {'on' if module.ON else 'off'}: set ({module.ENV} or set_enabled)")
            continue
        entry = table.get(name)
        if entry is None:
            lines.append(f"{name:15s} off: this device's table has no verdict (not timed here)")
        elif entry.get("on") is True and entry.get("max_tokens") and entry.get("schemes"):
            lines.append(f"{name:15s} on for {', '.join(entry['schemes'])} up to {entry['max_tokens']} token(s) per "
                         f"call: this device's table (commit {entry.get('commit')})")
        else:
            lines.append(f"{name:15s} off: this device's table (commit {entry.get('commit')}) measured it slower")
    if native_op.ON is not False and (native_op.ON or table.get("native_op", {}).get("on")):
        state = "loaded" if native_op._loaded() else "built and loaded on first use (~20 s; a C++ compiler and ninja)"
        lines.append(f"{'':15s} the native op's C++ kernel: {state}")
    return lines


def report() -> str:
    """The whole report as text (never raises)."""
    lines = ["humming_triton doctor (paste this into a bug report)", ""]
    probe = f"probe calls: bf16 x, M={PROBE_M} N={PROBE_N} K={PROBE_K} (grouped: {PROBE_EXPERTS} experts)"
    for title, body in (("versions", _versions), ("Triton interpreter", _interpreter), ("device", _device),
                        ("MMA kinds on this device", _mma), (f"backends ({probe})", _backends),
                        ("kernel families (same probes)", _families), ("measured dispatch table", _table),
                        ("switches (paths on where measured faster)", _switches)):
        try:
            lines += _section(title, body) + [""]
        except Exception as e:  # noqa: BLE001
            lines += [title, f"  {_error(e)}", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    print(report(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
