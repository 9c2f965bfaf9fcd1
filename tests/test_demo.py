"""The README's main job runs end to end: ``python3 -m humming_triton.demo --quick`` exits 0 and prints both
tables (layer presets with their backend; tiny models saved, reloaded exactly and generating)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_demo_quick_runs_and_prints_tables():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # conftest sets it for kernel tests; the demo must run the plain CPU path
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "humming_triton.demo", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "rel err vs bf16" in out and "logit rel err vs bf16" in out, out
    for preset in ("w4a16", "w4a16-asym", "w8a16", "w3a16", "mxfp4", "nvfp4", "w8a8-fp8"):
        assert f"\n{preset} " in out, preset
    rows = [line for line in out.splitlines() if line.startswith(("llama ", "qwen3_moe "))]
    assert len(rows) >= 4 and {r.split()[0] for r in rows} == {"llama", "qwen3_moe"}, out
    # the reloaded model reproduces the in-memory one exactly (or an NVFP4 global scale is 1 ulp off, flagged)
    assert all(" yes " in r or " 1ulp-gs " in r for r in rows), out
    assert "gptq" in out and "compressed-tensors" in out
    if "cuda" not in out.splitlines()[0]:
        assert "reference" in out
