"""Every kernel variant the launchers can pick compiles for sm_80, sm_89, sm_90(a), sm_100(a) and sm_120(a), without
a GPU (``scripts/compile_check.py``: ``dump`` the variants, ``compile`` them arch by arch in 2+ processes).

Covered: the full matrix, no sampling -- every distinct variant of the dump (each preset at M = 1..256 with the
built-in configs, the first candidate of every registered dense family those configs never pick, the grouped
kernel incl. act-order, the dequantize kernel, the four activation quantizers; 143 distinct variants when this
was written) for each of the five archs, except the variants whose MMA an arch lacks per capability.py (fp8
activations on sm_80: 20; int8 MMA on sm_100: 10; the block-scaled dot_scaled family on sm_80 / 89 / 90: 3), which
must be the only ones left out.  Any compile failure fails the test -- on sm_100 / sm_120 that includes a
dot_scaled variant whose PTX lacks the block-scaled MMA (compile_check.py); sm_90 variants with a >= 64-row MMA
side but no wgmma in their PTX are reported as a warning.

Cost, measured on a 2-core CPU machine shared with other jobs (fresh Triton cache, --jobs 2, 143 variants):
Triton 3.8.0 231 s wall with the machine mostly free, 422 s under load (~470 s of CPU either way); Triton 3.6.0
338 s under load; both cases in one session 12 min 48 s under load.  The second Triton runs only where one is
installed: ``HT_TRITON_ALT_PYTHON`` (a python whose triton differs, e.g. 3.6.0; it needs no torch), else
``.venv-triton36/bin/python`` if ``HT_BOOTSTRAP_TRITON_ALT=1 bash scripts/bootstrap.sh`` made it; otherwise that
case is skipped (reported as a skip, never as a pass).  Each run compiles into a temporary Triton cache
(~300 MB), removed afterwards.
"""
import json
import os
import subprocess
import sys
import tempfile
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "compile_check.py")
ARCHS = (80, 89, 90, 100, 120)
# the only MMAs an arch may lack among our variants (capability.py); every other arch compiles everything.
# "block-scaled": the dot_scaled family (tl.dot_scaled), SM 10.0+ only
MISSING = {80: ("fp8", "block-scaled"), 89: ("block-scaled",), 90: ("block-scaled",), 100: ("int8",)}


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile for real, not interpret
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def jobs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("compile_matrix") / "jobs.json"
    out = subprocess.run([sys.executable, SCRIPT, "dump", str(path)], capture_output=True, text=True, env=_env(),
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return path


def _alt_python() -> str | None:
    path = os.environ.get("HT_TRITON_ALT_PYTHON")
    if path:
        assert os.access(path, os.X_OK), f"HT_TRITON_ALT_PYTHON={path} is not an executable python"
        return path
    path = os.path.join(ROOT, ".venv-triton36", "bin", "python")
    return path if os.access(path, os.X_OK) else None


@pytest.mark.parametrize("which", ["installed", "alt"])
def test_every_variant_compiles_for_every_arch(jobs_file, which):
    python = sys.executable if which == "installed" else _alt_python()
    if python is None:
        pytest.skip("no second Triton: set HT_TRITON_ALT_PYTHON or run HT_BOOTSTRAP_TRITON_ALT=1 scripts/bootstrap.sh")
    workers = max(2, min(os.cpu_count() or 1, 8))
    with tempfile.TemporaryDirectory() as cache:
        result_path = os.path.join(cache, "result.json")
        out = subprocess.run([python, SCRIPT, "compile", str(jobs_file), "--arch", ",".join(map(str, ARCHS)),
                              "--jobs", str(workers), "--json", result_path],
                             capture_output=True, text=True, env=_env(TRITON_CACHE_DIR=os.path.join(cache, "tc")),
                             cwd=ROOT, timeout=1800)
        print(out.stdout)
        assert os.path.exists(result_path), f"compile_check did not finish:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
        with open(result_path) as f:
            result = json.load(f)
    archs = {int(a): s for a, s in result["archs"].items()}
    assert sorted(archs) == list(ARCHS)
    failures = [f"sm_{a} {f['variant']}: {f['error']}" for a, s in archs.items() for f in s["failures"]]
    assert not failures, (f"triton {result['triton']}: {len(failures)} variant x arch compiles failed:\n"
                          + "\n".join(failures[:30]) + ("\n..." if len(failures) > 30 else ""))
    assert out.returncode == 0, out.stderr[-3000:]
    for arch, s in archs.items():
        assert s["attempted"] > 0 and s["compiled"] == s["attempted"], (arch, s)
        skipped = s["not_applicable"]
        if arch in MISSING:
            assert skipped and all(any(kind in why for kind in MISSING[arch]) for why in skipped), (arch, skipped)
        else:
            assert not skipped and s["attempted"] == result["variants"], (arch, skipped)
    if archs[90]["no_wgmma"]:
        warnings.warn(f"triton {result['triton']}: sm_90 variants with a >= 64-row MMA side without wgmma: "
                      f"{archs[90]['no_wgmma']}")
