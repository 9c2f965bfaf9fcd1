"""Issue 16, CUTLASS part: the sm_100a block-scaled GEMMs (cutlass_ext/csrc_sm100) compile with nvcc against the
nvidia-cutlass headers, one instantiation per format, to tcgen05 block-scaled MMAs (checked in the SASS).
Time-boxed: the compile of the translation unit (four CUTLASS kernels) takes 4-7 minutes on two cores.  Also (no
compile): the ABI version and the ctypes signature cutlass_ext/blockscaled.py calls agree with the source's."""
import re
import shutil
import subprocess
import time


def _cuobjdump() -> str | None:
    from cutlass_ext.build import cuobjdump
    return cuobjdump()


def test_sm100_blockscaled_gemms_compile_to_block_scaled_mma(tmp_path, cutlass_nvcc):
    nvcc = cutlass_nvcc
    from cutlass_ext.build import SM100_SOURCES, sm100_command
    assert SM100_SOURCES, "no csrc_sm100 sources"
    obj = tmp_path / "blockscaled.o"
    t0 = time.perf_counter()
    r = subprocess.run(sm100_command(SM100_SOURCES[0], obj, nvcc), capture_output=True, text=True, timeout=2400)
    took = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"sm_100a CUTLASS translation unit compiled in {took:.0f} s")
    tool = _cuobjdump()
    assert tool, "no cuobjdump (Triton's bundled one, or the CUDA toolkit's) to read the SASS"
    sass = subprocess.run([tool, "-sass", str(obj)], capture_output=True, text=True, timeout=600).stdout
    kernels = re.findall(r"Function : (\S+)", sass)
    assert len(kernels) == 4, kernels  # NVFP4, MXFP4, MXFP8 x MXFP4, MXFP8 x MXFP8
    ops = set(re.findall(r"\b(UTC[OQ]MMA)", sass))
    assert ops == {"UTCOMMA", "UTCQMMA"}, ops  # fp4 block-scaled (mxf4 / nvf4) and f8f6f4 (W4A8)
    assert "UTCOMMA.4X" in sass  # NVFP4: 16-element scale vectors
    bodies = sass.split("Function : ")[1:]
    per_kernel = [set(re.findall(r"\b(UTC[OQ]MMA(?:\.4X)?)", body)) for body in bodies]
    print("MMA opcodes per kernel:", [sorted(k) for k in per_kernel])
    # fp4 (mxf4 / mxf4nvf4): NVFP4 and MXFP4, one of them with 16-element scale vectors; f8f6f4: W4A8 and MXFP8
    assert sum(any(o.startswith("UTCOMMA") for o in k) for k in per_kernel) == 2, per_kernel
    assert sum("UTCOMMA.4X" in k for k in per_kernel) == 1, per_kernel
    assert sum(k == {"UTCQMMA"} for k in per_kernel) == 2, per_kernel
    nm = shutil.which("nm")
    if nm:  # the C ABI blockscaled.py loads
        syms = subprocess.run([nm, "-g", "--defined-only", str(obj)], capture_output=True, text=True).stdout
        syms = set(syms.split())
        assert {"ht_sm100_blockscaled_abi", "ht_sm100_blockscaled_gemm", "ht_sm100_blockscaled_workspace",
                "ht_sm100_sf_elements"} <= syms, sorted(s for s in syms if s.startswith("ht_"))


class _Fn:
    argtypes = restype = None


class _FakeLib:
    def __init__(self, abi):
        for name in ("ht_sm100_blockscaled_gemm", "ht_sm100_blockscaled_workspace", "ht_sm100_sf_elements"):
            setattr(self, name, _Fn())
        self.ht_sm100_blockscaled_abi = lambda: abi


def _c_params(src: str, name: str) -> list[str]:
    sig = re.search(rf"\b{name}\(([^)]*)\)\s*{{", src)
    assert sig, name
    return [p.strip() for p in sig.group(1).split(",")]


def test_abi_and_ctypes_signature_match_the_source(monkeypatch):
    """A changed C signature must bump ht_sm100_blockscaled_abi() and blockscaled.ABI together (a stale library is
    refused, not mis-called), and the argtypes blockscaled.py declares must be the signature's, type for type."""
    import ctypes
    from cutlass_ext import blockscaled
    from cutlass_ext.build import SM100_SOURCES
    src = SM100_SOURCES[0].read_text()
    m = re.search(r"int ht_sm100_blockscaled_abi\(\) \{ return (\d+); \}", src)
    assert m and int(m.group(1)) == blockscaled.ABI, (m and m.group(0), blockscaled.ABI)
    fake = _FakeLib(blockscaled.ABI)
    monkeypatch.setattr(blockscaled, "_native", lambda: (fake, None))
    blockscaled._lib()
    ctype = {"int": ctypes.c_int, "float": ctypes.c_float, "size_t": ctypes.c_size_t, "long long*": None}
    for name in ("ht_sm100_blockscaled_gemm", "ht_sm100_blockscaled_workspace", "ht_sm100_sf_elements"):
        params = _c_params(src, name)
        declared = getattr(fake, name).argtypes
        assert len(declared) == len(params), (name, params, declared)
        for p, t in zip(params, declared):
            kind = p.rsplit(" ", 1)[0].replace("const ", "")
            if kind.endswith("*") and kind != "long long*":
                assert t is ctypes.c_void_p, (name, p, t)
            elif kind == "long long*":
                assert t is ctypes.POINTER(ctypes.c_longlong), (name, p, t)
            else:
                assert t is ctype[kind], (name, p, t)
    monkeypatch.setattr(blockscaled, "_native", lambda: (_FakeLib(blockscaled.ABI - 1), None))
    assert "stale" in blockscaled.unavailable()
