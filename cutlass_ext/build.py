"""``python3 -m cutlass_ext.build [--arch 80,90] [--out PATH]``: compile ``csrc/*.cu`` into the native library.

Plain nvcc, static CUDA runtime (the library needs only the driver at run time).  One cubin per architecture
named, plus PTX of the newest so that later GPUs can JIT it.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .native import library_path

SOURCES = sorted((Path(__file__).resolve().parent / "csrc").glob("*.cu"))
DEFAULT_ARCHS = "80,90"


def command(archs: list[str], out: Path, nvcc: str = "nvcc") -> list[str]:
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "-cudart", "static",
            *gencode, "-o", str(out), *map(str, SOURCES)]


def build(archs: list[str], out: Path | None = None, quiet: bool = False) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc is not on PATH: the native library needs the CUDA toolkit to build")
    out = out or library_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = command(archs, out, nvcc)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    if not quiet:
        print(f"built {out} for sm_{', sm_'.join(archs)} in {time.perf_counter() - t0:.0f} s")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=DEFAULT_ARCHS, help="comma-separated SM versions (default %(default)s)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    build([a.strip() for a in args.arch.split(",") if a.strip()], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
