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
