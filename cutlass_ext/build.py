"""``python3 -m cutlass_ext.build [--arch 80,90[,100a]] [--out PATH]``: compile the native library.

Plain nvcc, static CUDA runtime (the library needs only the driver at run time).  ``csrc/*.cu`` (the decode
kernels): one cubin per numeric architecture named, plus PTX of the newest so that later GPUs can JIT it.
``90a`` adds ``csrc_sm90/mixed_gemm.cu``: the CUTLASS mixed-input WGMMA GEMMs for sm_90a, one translation unit
per format (``-DHT_SM90_FMT``), compiled in parallel, and ``csrc_sm90_grouped/grouped_gemm.cu``: their grouped
(MoE) counterparts, one unit per kernel; ``100a`` adds ``csrc_sm100/*.cu``: the CUTLASS tcgen05
block-scaled GEMMs for sm_100a.  Both build against the nvidia-cutlass package's headers (``pip install
nvidia-cutlass``; minutes of compile time).  ``--jobs`` compiles that many translation units at once.

Object files are cached in ``_build/obj/`` under a hash of the command line and the sources (and the CUTLASS
headers' version), so a rebuild compiles only what changed -- or what a partial build left out.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .native import library_path

HERE = Path(__file__).resolve().parent
SOURCES = sorted((HERE / "csrc").glob("*.cu"))
SM100_SOURCES = sorted((HERE / "csrc_sm100").glob("*.cu"))
SM90_SOURCE = HERE / "csrc_sm90" / "mixed_gemm.cu"
SM90_GROUPED_SOURCE = HERE / "csrc_sm90_grouped" / "grouped_gemm.cu"  # its own folder: its edits leave the
# dense kernels' cache keys alone (a key hashes every file of its source's folder)
SM90_GROUPED_FP8_SOURCE = HERE / "csrc_sm90_grouped_fp8" / "grouped_fp8_gemm.cu"
DEFAULT_ARCHS = "80,90"
SM90A = "90a"
SM100 = "100a"
CUTLASS_ARCHS = (SM90A, SM100)


def cuobjdump() -> str | None:
    """Triton's bundled cuobjdump, else the CUDA toolkit's (None: neither), to read compiled SASS."""
    try:
        import triton
        path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


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


def command(archs: list[str], out: Path, nvcc: str = "nvcc", defines: tuple = ()) -> list[str]:
    """The decode kernels' compile (numeric architectures) -> one object file ``out``; ``defines``: an
    experiment's macros (``--decode-defines``), part of the object's cache key."""
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return [nvcc, "-O3", "-std=c++17", "-c", "-Xcompiler", "-fPIC", "-lineinfo", *[f"-D{d}" for d in defines],
            *gencode, "-o", str(out), *map(str, SOURCES)]


def cutlass_command(source: Path, out: Path, arch: str, nvcc: str = "nvcc", defines: tuple = ()) -> list[str]:
    """One CUTLASS translation unit for ``arch`` (90a / 100a) -> an object file."""
    incs = [f"-I{d}" for d in cutlass_includes()]
    return [nvcc, "-O3", "-std=c++17", "-c", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "-DNDEBUG",
            *(f"-D{d}" for d in defines), f"-gencode=arch=compute_{arch},code=sm_{arch}", *incs, "-o", str(out),
            str(source)]


def sm100_command(source: Path, out: Path, nvcc: str = "nvcc") -> list[str]:
    """One CUTLASS sm_100a translation unit -> an object file."""
    return cutlass_command(source, out, SM100, nvcc)


def sm90_variants() -> list[int]:
    """The variant ids of csrc_sm90/mixed_gemm.cu (its default HT_SM90_VARIANTS rows)."""
    import re
    text = SM90_SOURCE.read_text()
    table = text[text.index("#define HT_SM90_VARIANTS"):]
    table = table[:table.index("#endif")]
    return [int(i) for i in re.findall(r"^\s*X\((\d+),", table, re.M)]


def sm90_formats() -> list[int]:
    """The format ids of csrc_sm90/mixed_gemm.cu (its HT_SM90_FORMATS rows)."""
    import re
    text = SM90_SOURCE.read_text()
    table = text[text.index("#define HT_SM90_FORMATS"):text.index("#define COMMA")]
    return [int(i) for i in re.findall(r"^\s*X\((\d+),", table, re.M)]


def sm90_grouped_kernels() -> list[tuple[int, int]]:
    """Every (format, variant) of csrc_sm90_grouped/grouped_gemm.cu: its ``HT_SM90G_FMT == <id>`` branches x its
    HT_SM90G_VARIANTS rows."""
    import re
    text = SM90_GROUPED_SOURCE.read_text()
    fmts = [int(i) for i in re.findall(r"HT_SM90G_FMT == (\d+)", text)]
    table = text[text.index("#define HT_SM90G_VARIANTS"):]
    table = table[:table.index("\n\n")]
    return [(f, int(v)) for f in fmts for v in re.findall(r"^\s*X\((\d+),", table, re.M)]


def sm90_grouped_fp8_variants() -> list[int]:
    """The variant ids of csrc_sm90_grouped_fp8/grouped_fp8_gemm.cu (its HT_SM90F8_VARIANTS rows)."""
    import re
    text = SM90_GROUPED_FP8_SOURCE.read_text()
    table = text[text.index("#define HT_SM90F8_VARIANTS"):]
    table = table[:table.index("\n\n")]
    return [int(v) for v in re.findall(r"^\s*X\((\d+),", table, re.M)]


def parse_grouped(spec: str) -> list[tuple[int, int]]:
    """``--sm90-grouped``: ``none``, or FORMATS:VARIANTS groups as in ``--sm90-kernels`` (e.g. ``10:0-5/0:2``)."""
    if spec.strip() == "none":
        return []
    pairs = _pairs(spec, "--sm90-grouped")
    unknown = sorted(set(pairs) - set(sm90_grouped_kernels()))
    if unknown:
        raise ValueError(f"--sm90-grouped names kernels the source lacks: {unknown} (it has {sm90_grouped_kernels()})")
    return pairs


def _compile_all(commands: list[list[str]], jobs: int, quiet: bool) -> None:
    """Run compiles ``jobs`` at a time; the first failure stops the build with its output."""
    from concurrent.futures import ThreadPoolExecutor
    done = 0

    def one(cmd):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"compile failed: {' '.join(cmd[-3:])}\n{r.stderr[-4000:]}")
        return cmd[cmd.index("-o") + 1]

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for obj in pool.map(one, commands):
            done += 1
            if not quiet:
                print(f"  [{done}/{len(commands)}] {Path(obj).name}", flush=True)


def _cutlass_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("nvidia-cutlass")
    except PackageNotFoundError:
        return ""


def _portable(arg: str) -> str:
    """A compile argument with its machine's folders left out: the cache key must match on another machine
    (the device gets this machine's objects), where the repository and the CUTLASS package live elsewhere."""
    if arg.startswith("-I"):
        return "-I" + "/".join(Path(arg[2:]).parts[-3:])
    if arg.endswith((".cu", ".cuh", ".h")):
        return "/".join(Path(arg).parts[-2:])
    return arg


def cached_object(cmd: list[str], cache: Path) -> Path:
    """Where the object of a compile command lives in the cache: named by a hash of the command (output path,
    nvcc and the machine's folders left out), the contents of every file in its sources' folders and the
    CUTLASS version."""
    o = cmd.index("-o")
    args = cmd[1:o] + cmd[o + 2:]
    h = hashlib.sha1("\0".join(map(_portable, args)).encode())
    for folder in sorted({Path(a).parent for a in args if a.endswith(".cu")}):
        for f in sorted(folder.iterdir()):
            if f.is_file():
                h.update(f.name.encode() + f.read_bytes())
    h.update(_cutlass_version().encode())
    return cache / f"{Path(cmd[o + 1]).stem}.{h.hexdigest()[:16]}.o"


def _pairs(spec: str, option: str) -> list[tuple[int, int]]:
    """``FORMATS:VARIANTS`` groups joined by ``/`` -> (format, variant) pairs, each named once."""
    def ids(text):
        out = []
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            out += list(range(int(a), int(b) + 1)) if b else [int(a)]
        return out
    pairs = []
    for group in spec.split("/"):
        fmts, sep, variants = group.partition(":")
        if not sep:
            raise ValueError(f"bad {option} group {group!r}: expected FORMATS:VARIANTS, e.g. 0,2:0-9")
        pairs += [(f, v) for f in ids(fmts) for v in ids(variants) if (f, v) not in pairs]
    return pairs


def parse_kernels(spec: str) -> list[tuple[int, int]]:
    """``--sm90-kernels`` -> (format, variant) pairs: groups ``FORMATS:VARIANTS`` joined by ``/``, each side a
    comma list of ids or ranges (``0-9``), e.g. ``0,2,4:0-9/1,3:0,3,4`` (every variant of the bf16 formats 0, 2,
    4; three of the fp16 formats 1, 3)."""
    pairs = _pairs(spec, "--sm90-kernels")
    unknown = sorted({f for f, _ in pairs} - set(sm90_formats())) + sorted({v for _, v in pairs} - set(sm90_variants()))
    if unknown:
        raise ValueError(f"--sm90-kernels names ids the source lacks: {unknown} (formats {sm90_formats()}, "
                         f"variants {sm90_variants()})")
    return pairs


def build(archs: list[str], out: Path | None = None, quiet: bool = False, jobs: int | None = None,
          sm90_formats_only: list[int] | None = None, split_variants: bool = False,
          sm90_variants_only: list[int] | None = None, sm90_kernels: list[tuple[int, int]] | None = None,
          sm90_grouped: list[tuple[int, int]] | None = None, decode_defines: tuple = (),
          sm90_grouped_fp8: list[int] | None = None) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc is not on PATH: the native library needs the CUDA toolkit to build")
    out = out or library_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    numeric = [a for a in archs if a not in CUTLASS_ARCHS]
    if not numeric:
        raise ValueError("name at least one numeric architecture for the decode kernels (e.g. --arch 90,100a)")
    t0 = time.perf_counter()
    objs = [out.with_suffix(".decode.o")]
    commands = [command(numeric, objs[0], nvcc, decode_defines)]
    if SM90A in archs:
        # one unit per format, or (split_variants, sm90_kernels) per kernel: more parallelism, finer caching
        units = sm90_kernels or [(fmt, v) for fmt in sm90_formats_only or sm90_formats()
                                 for v in ((sm90_variants_only or sm90_variants()) if split_variants else [None])]
        for fmt, v in units:
            tag = f"{fmt}" if v is None else f"{fmt}_v{v}"
            objs.append(out.with_suffix(f".sm90_mixed_{tag}.o"))
            defines = (f"HT_SM90_FMT={fmt}",) + (() if v is None else (f"HT_SM90_VARIANT={v}",))
            commands.append(cutlass_command(SM90_SOURCE, objs[-1], SM90A, nvcc, defines))
        for fmt, v in sm90_grouped_kernels() if sm90_grouped is None else sm90_grouped:
            objs.append(out.with_suffix(f".sm90_grouped_{fmt}_v{v}.o"))
            commands.append(cutlass_command(SM90_GROUPED_SOURCE, objs[-1], SM90A, nvcc,
                                            (f"HT_SM90G_FMT={fmt}", f"HT_SM90G_VARIANT={v}")))
        for v in sm90_grouped_fp8_variants() if sm90_grouped_fp8 is None else sm90_grouped_fp8:
            objs.append(out.with_suffix(f".sm90_grouped_fp8_v{v}.o"))
            commands.append(cutlass_command(SM90_GROUPED_FP8_SOURCE, objs[-1], SM90A, nvcc, (f"HT_SM90F8_VARIANT={v}",)))
    if SM100 in archs:
        for src in SM100_SOURCES:
            objs.append(out.with_suffix(f".{src.stem}.o"))
            commands.append(sm100_command(src, objs[-1], nvcc))
    cache = out.parent / "obj"
    cache.mkdir(exist_ok=True)
    cached = [cached_object(c, cache) for c in commands]
    for c, obj in zip(commands, cached):
        c[c.index("-o") + 1] = str(obj)
    todo = [c for c, obj in zip(commands, cached) if not obj.exists()]
    if not quiet and len(todo) < len(commands):
        print(f"{len(commands) - len(todo)} of {len(commands)} objects are cached in {cache}", flush=True)
    _compile_all(todo, jobs or os.cpu_count() or 1, quiet)
    subprocess.run([nvcc, "-shared", "-cudart", "static", "-o", str(out), *map(str, cached)], check=True)
    if not quiet:
        print(f"built {out} for sm_{', sm_'.join(archs)} in {time.perf_counter() - t0:.0f} s")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=DEFAULT_ARCHS, help="comma-separated SM versions (default %(default)s)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--jobs", type=int, default=None, help="translation units compiled at once (default: CPUs)")
    ap.add_argument("--sm90-formats", default=None,
                    help="comma-separated csrc_sm90 format ids to build (default: all; the others are then absent)")
    ap.add_argument("--split-variants", action="store_true",
                    help="compile each sm_90a kernel in its own unit (for machines with many cores)")
    ap.add_argument("--sm90-variants", default=None,
                    help="with --split-variants: only these csrc_sm90 variant ids (an experiment's subset)")
    ap.add_argument("--sm90-kernels", default=None,
                    help="exactly these (format, variant) kernels, one unit each: FORMATS:VARIANTS groups joined by "
                         "'/', e.g. 0,2,4,6,8:0-9/1,3,5,7,9:0,1,3,4,6 (overrides --sm90-formats / --sm90-variants)")
    ap.add_argument("--sm90-grouped", default=None,
                    help="the grouped (MoE) sm_90a kernels to build: FORMATS:VARIANTS groups as in --sm90-kernels, "
                         "or 'none' (default: all of them)")
    ap.add_argument("--sm90-grouped-fp8", default=None,
                    help="the grouped fp8 (MoE, e4m3 x e4m3) sm_90a kernels to build: comma-separated variant ids, "
                         "or 'none' (default: all of them)")
    ap.add_argument("--decode-defines", default="",
                    help="comma-separated NAME=VALUE macros for the decode kernels' compile (an experiment's "
                         "build, e.g. HT_GROUPED_NT1_REGS=0 (the 64-register bound before session 30) with --out "
                         "elsewhere)")
    args = ap.parse_args(argv)
    only = [int(f) for f in args.sm90_formats.split(",")] if args.sm90_formats else None
    variants = [int(v) for v in args.sm90_variants.split(",")] if args.sm90_variants else None
    if variants and not args.split_variants:
        ap.error("--sm90-variants needs --split-variants (one unit per kernel)")
    unknown = sorted(set(variants or []) - set(sm90_variants()))
    if unknown:
        ap.error(f"unknown sm90 variants {unknown} (the source has {sm90_variants()})")
    try:
        kernels = parse_kernels(args.sm90_kernels) if args.sm90_kernels else None
    except ValueError as e:
        ap.error(str(e))
    try:
        grouped = parse_grouped(args.sm90_grouped) if args.sm90_grouped else None
    except ValueError as e:
        ap.error(str(e))
    fp8 = None
    if args.sm90_grouped_fp8 is not None:
        fp8 = [] if args.sm90_grouped_fp8.strip() == "none" else [int(v) for v in args.sm90_grouped_fp8.split(",")]
        unknown = sorted(set(fp8) - set(sm90_grouped_fp8_variants()))
        if unknown:
            ap.error(f"--sm90-grouped-fp8 names variants the source lacks: {unknown} "
                     f"(it has {sm90_grouped_fp8_variants()})")
    build([a.strip() for a in args.arch.split(",") if a.strip()], args.out, jobs=args.jobs, sm90_formats_only=only,
          split_variants=args.split_variants, sm90_variants_only=variants, sm90_kernels=kernels,
          sm90_grouped=grouped, decode_defines=tuple(d for d in args.decode_defines.split(",") if d),
          sm90_grouped_fp8=fp8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
