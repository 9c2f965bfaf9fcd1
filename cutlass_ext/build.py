"""``python3 -m cutlass_ext.build [--arch 80,90[,100a]] [--out PATH]``: compile the native library.

Plain nvcc, static CUDA runtime (the library needs only the driver at run time).  ``csrc/*.cu`` (the decode
kernels): one cubin per numeric architecture named, plus PTX of the newest so that later GPUs can JIT it.
``100a`` adds ``csrc_sm100/*.cu``: the CUTLASS tcgen05 block-scaled GEMMs for sm_100a, built against the
nvidia-cutlass package's headers (``pip install nvidia-cutlass``; minutes of compile time).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .native import library_path

HERE = Path(__file__).resolve().parent
SOURCES = sorted((HERE / "csrc").glob("*.cu"))
SM100_SOURCES = sorted((HERE / "csrc_sm100").glob("*.cu"))
DEFAULT_ARCHS = "80,90"
SM100 = "100a"


def cutlass_includes() -> list[Path]:
    """The CUTLASS / CuTe header folders of the installed nvidia-cutlass package."""
    try:
        import cutlass_library
    except ImportError as e:
        raise RuntimeError("the sm_100a GEMMs need the CUTLASS headers: pip install nvidia-cutlass") from e
    root = Path(cutlass_library.__file__).resolve().parent / "source"
    dirs = [root / "include", root / "tools" / "util" / "include"]
    if not (dirs[0] / "cutlass" / "cutlass.h").exists():
        raise RuntimeError(f"nvidia-cutlass is installed but {dirs[0]} holds no cutlass/cutlass.h")
    return [d for d in dirs if d.exists()]


def command(archs: list[str], out: Path, nvcc: str = "nvcc") -> list[str]:
    """The decode kernels' compile (numeric architectures) -> one object file ``out``."""
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return [nvcc, "-O3", "-std=c++17", "-c", "-Xcompiler", "-fPIC", "-lineinfo", *gencode, "-o", str(out),
            *map(str, SOURCES)]


def sm100_command(source: Path, out: Path, nvcc: str = "nvcc") -> list[str]:
    """One CUTLASS sm_100a translation unit -> an object file."""
    incs = [f"-I{d}" for d in cutlass_includes()]
    return [nvcc, "-O3", "-std=c++17", "-c", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "-DNDEBUG",
            f"-gencode=arch=compute_{SM100},code=sm_{SM100}", *incs, "-o", str(out), str(source)]


def build(archs: list[str], out: Path | None = None, quiet: bool = False) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc is not on PATH: the native library needs the CUDA toolkit to build")
    out = out or library_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    numeric = [a for a in archs if a != SM100]
    if not numeric:
        raise ValueError("name at least one numeric architecture for the decode kernels (e.g. --arch 90,100a)")
    t0 = time.perf_counter()
    objs = [out.with_suffix(".decode.o")]
    subprocess.run(command(numeric, objs[0], nvcc), check=True)
    if SM100 in archs:
        for src in SM100_SOURCES:
            objs.append(out.with_suffix(f".{src.stem}.o"))
            subprocess.run(sm100_command(src, objs[-1], nvcc), check=True)
    subprocess.run([nvcc, "-shared", "-cudart", "static", "-o", str(out), *map(str, objs)], check=True)
    for o in objs:
        o.unlink()
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
