#!/usr/bin/env bash
# One-time set-up, idempotent: installs what humming_triton needs without replacing an installed torch/triton
# (so a GPU machine keeps its CUDA build).  On a fresh CPU machine: torch 2.13.0 (the local CPU build) and
# triton 3.8.0 (whose interpreter runs our kernels on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pipi() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
"$PY" -c "import torch" 2>/dev/null || pipi "torch==2.13.0"
"$PY" -c "import triton" 2>/dev/null || pipi "triton==3.8.0"
missing=$("$PY" - <<'PYEOF'
import importlib.util as u
need = {"numpy": "numpy", "pytest": "pytest>=8", "hypothesis": "hypothesis>=6", "transformers": "transformers>=4.56",
        "safetensors": "safetensors>=0.4", "tqdm": "tqdm", "matplotlib": "matplotlib"}
print(" ".join(v for k, v in need.items() if u.find_spec(k) is None))
PYEOF
)
[ -z "$missing" ] || pipi $missing
# the package itself, editable, without letting pip touch torch/triton
"$PY" -c "import humming_triton" 2>/dev/null || pipi --no-deps --no-build-isolation -e .
# Optional, off by default (HT_BOOTSTRAP_TRITON_ALT=1): a second Triton -- 3.6.0, the H200's -- alone in
# .venv-triton36 (no torch: compile_check's compile step needs only triton), so that
# tests/test_compile_matrix.py also compiles every kernel variant with it.  Cost measured on the CPU machine:
# ~10 s with pip's cache warm, 667 MB of disk; the test then takes ~4-7 more minutes on 2 cores.
if [ "${HT_BOOTSTRAP_TRITON_ALT:-0}" = 1 ]; then
  if ! .venv-triton36/bin/python -c "import triton" 2>/dev/null; then
    "$PY" -m venv .venv-triton36
    .venv-triton36/bin/python -m pip install -q --disable-pip-version-check "triton==3.6.0"
  fi
fi
