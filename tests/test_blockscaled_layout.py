"""Issue 16, CUTLASS routing, on CPU: the scale-factor layout the sm_100a block-scaled GEMMs read, proven against
CUTLASS itself; the ``blockscaled_cutlass`` family's reasons on posed devices and its opt-in-ness; and the data its
``run`` hands the C function, read back through the layout and multiplied in torch, against the reference.

The layout proof compiles a host-only C++ probe against the CUTLASS / CuTe headers (``csrc_sm100/sf_layout.hpp``,
whose ``Sm1xxBlockScaledConfig`` the kernels static_assert they use) that evaluates
``tile_atom_to_shape_SFA / SFB`` at every (row, K element) of the padded domain and prints the offsets; each is
compared with ``cutlass_ext.blockscaled.sf_offsets``.  Nothing here runs a GPU: the kernels themselves are
compiled, never run (no Blackwell GPU).
"""
import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

import humming_triton as ht
from cutlass_ext import blockscaled as bs
from humming_triton import backends, dispatch
from humming_triton.backends._families import family_reason
from humming_triton.calls import Call, Candidate, KernelConfig, interpreting
from humming_triton.capability import CPU_FACTS, facts_for_sm
from humming_triton.formats import QuantScheme
from humming_triton.formats.activation import dequantize_activation, quantize_activation
from humming_triton.formats.quantize import quantize_weight
from humming_triton.kernels import families
from humming_triton.kernels.dense import default_config
from humming_triton.kernels.families import blockscaled_cutlass as fam_mod
from humming_triton.testing import assert_linear_close

ROOT = Path(__file__).resolve().parents[1]
SM100_DIR = ROOT / "cutlass_ext" / "csrc_sm100"
SCHEMES = fam_mod.SCHEMES
# (M, N, K): aligned; odd M / N with padded rows and scale columns; a single row and column
PROBE_SHAPES = [(128, 256, 512), (200, 72, 320), (1, 1, 64)]
VECS = (16, 32)  # NVFP4; the MX kinds (MXFP4, MXFP8 x MXFP4, MXFP8)

interpreter = pytest.mark.skipif(not interpreting(), reason="CPU interpreter test (TRITON_INTERPRET=1)")

PROBE = r"""
// Host-only: prints, for each case, the offset CUTLASS's SFA / SFB layout gives every (row, scale column) of the
// padded domain, and how many K elements of a group map elsewhere than the group's first (must be 0).
#include <cstdio>
#include "sf_layout.hpp"

template <int Vec, class L>
static void dump(const char* which, L const& l) {
  int rows = int(cute::size<0>(l)), kel = int(cute::size<1>(l));
  long long stray = 0;
  std::printf("%s %d %d %d %lld %lld\n", which, Vec, rows, kel, ht_sm100::SfLayout<Vec>::elements(l),
              (long long)cute::cosize(l));
  for (int r = 0; r < rows; ++r) {
    for (int e = 0; e < kel; e += Vec) {
      long long o = (long long)l(r, e, 0);
      for (int j = 1; j < Vec; ++j) stray += (long long)l(r, e + j, 0) != o;
      std::printf("%lld ", o);
    }
  }
  std::printf("\nstray %lld\n", stray);
}

template <int Vec>
static void run(int m, int n, int k) {
  std::printf("case %d %d %d %d\n", Vec, m, n, k);
  dump<Vec>("SFA", ht_sm100::SfLayout<Vec>::sfa(m, n, k));
  dump<Vec>("SFB", ht_sm100::SfLayout<Vec>::sfb(m, n, k));
}

int main() {
  const int shapes[][3] = {SHAPES};
  for (auto const& s : shapes) {
    run<16>(s[0], s[1], s[2]);
    run<32>(s[0], s[1], s[2]);
  }
  return 0;
}
"""


def _nvcc_includes(nvcc: str) -> list[str]:
    """The include folders nvcc itself passes its host compiler (CUDA 13: ``include`` and ``include/cccl``)."""
    r = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"], capture_output=True,
                       text=True, timeout=60)
    dirs = []
    for line in (r.stdout + r.stderr).splitlines():
        m = re.match(r"#\$ (?:SYSTEM_)?INCLUDES=(.*)", line.strip())
        if m:
            toks = shlex.split(m.group(1))
            dirs += [t[2:] if t.startswith("-I") else t for t in toks if t not in ("-isystem", "-I")]
    return [d for d in dirs if Path(d).is_dir()]


@pytest.fixture(scope="module")
def cutlass_layouts(tmp_path_factory):
    """{(vec, M, N, K): {"SFA": (rows, k_elems, elements, cosize, offsets), "SFB": ...}} from CUTLASS."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (the CUDA toolkit's headers): cannot compile the CUTLASS layout probe")
    try:
        from cutlass_ext.build import cutlass_includes
        incs = cutlass_includes()
    except RuntimeError as e:
        pytest.skip(f"no CUTLASS headers ({e}): cannot compile the CUTLASS layout probe")
    d = tmp_path_factory.mktemp("sf_probe")
    src = d / "probe.cpp"
    src.write_text(PROBE.replace("SHAPES", ", ".join("{%d, %d, %d}" % s for s in PROBE_SHAPES)))
    exe = d / "probe"
    flags = ["-std=c++17", "-O1", f"-I{SM100_DIR}", *(f"-I{i}" for i in incs)]
    cxx, cuda_incs = shutil.which("g++"), _nvcc_includes(nvcc)
    if cxx and cuda_incs:  # the host compiler alone: a quarter of nvcc's time for a host-only program
        cmd = [cxx, "-w", *flags, *(f"-I{i}" for i in cuda_incs), "-o", str(exe), str(src)]
    else:
        cmd = [nvcc, "-x", "cu", "-w", *flags, "-o", str(exe), str(src)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{shlex.join(cmd)}\n{r.stderr[-3000:]}"
    print(f"CUTLASS layout probe compiled in {time.perf_counter() - t0:.1f} s ({Path(cmd[0]).name})")
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    found, i = {}, 0
    while i < len(out):
        _, vec, m, n, k = out[i].split()
        case = found[(int(vec), int(m), int(n), int(k))] = {}
        for j in (1, 4):
            which, _, rows, kel, elems, cosize = out[i + j].split()
            offsets = torch.tensor([int(v) for v in out[i + j + 1].split()], dtype=torch.int64)
            stray = int(out[i + j + 2].split()[1])
            assert stray == 0, (which, vec, m, n, k, "K elements of one group at different offsets")
            case[which] = (int(rows), int(kel), int(elems), int(cosize), offsets)
        i += 7
    assert set(found) == {(v, *s) for s in PROBE_SHAPES for v in VECS}
    return found


@pytest.mark.parametrize("vec", VECS)
@pytest.mark.parametrize("shape", PROBE_SHAPES)
def test_sf_offsets_match_cutlass(cutlass_layouts, vec, shape):
    """Every (row, scale column) of the padded SFA / SFB domain: CUTLASS's offset == ``sf_offsets``; the padded
    sizes == ``sf_size`` == the ``filter_zeros`` size ``ht_sm100_sf_elements`` reports; the map is a bijection."""
    m, n, k = shape
    for which, rows in (("SFA", m), ("SFB", n)):
        prow, kel, elems, cosize, got = cutlass_layouts[(vec, *shape)][which]
        want_rows, want_cols = bs.sf_padded(rows, k, vec)
        assert (prow, kel) == (want_rows, want_cols * vec), (which, prow, kel)
        assert elems == cosize == bs.sf_size(rows, k, vec) == want_rows * want_cols, (which, elems, cosize)
        mine = bs.sf_offsets(want_rows, want_cols).reshape(-1)
        assert got.numel() == mine.numel() == elems
        bad = (got != mine).nonzero().flatten()
        assert bad.numel() == 0, (f"{which} vec {vec} {shape}: {bad.numel()} of {elems} offsets differ, first at "
                                  f"(row, col) = {divmod(int(bad[0]), want_cols)}: CUTLASS {int(got[bad[0]])}, "
                                  f"ours {int(mine[bad[0]])}")
        assert torch.equal(torch.sort(got).values, torch.arange(elems))


def test_the_probe_catches_a_wrong_layout(cutlass_layouts):
    """The comparison has teeth: the plausible wrong variant (rows r0 / r1 swapped inside the atom: 4 x 32 instead
    of 32 x 4) differs from CUTLASS."""
    prow, kel, elems, _, got = cutlass_layouts[(32, 128, 256, 512)]["SFA"]
    r = torch.arange(prow)[:, None]
    c = torch.arange(kel // 32)[None, :]
    wrong = ((r // 128) * (kel // 128) + c // 4) * 512 + (r % 4) * 128 + (r // 4 % 32) * 4 + c % 4
    assert (wrong.reshape(-1) != got).any()


@pytest.mark.parametrize("rows,k,vec", [(1, 64, 32), (200, 320, 32), (130, 96, 16), (256, 512, 16)])
def test_to_sf_layout_places_each_scale_at_its_offset(rows, k, vec, rng):
    """``to_sf_layout`` writes scale (r, g) at ``sf_offsets[r, g]``, the padding holds the pad code, and
    ``from_sf_layout`` inverts it."""
    g = bs.sf_groups(k, vec)
    s = torch.randint(0, 255, (rows, g), generator=rng, dtype=torch.int32).to(torch.uint8)
    flat = bs.to_sf_layout(s, k, vec, 127)
    assert flat.dtype == torch.uint8 and flat.numel() == bs.sf_size(rows, k, vec)
    off = bs.sf_offsets(rows, g)
    assert torch.equal(flat[off.reshape(-1)], s.reshape(-1))
    pad = torch.ones(flat.numel(), dtype=torch.bool)
    pad[off.reshape(-1)] = False
    assert bool((flat[pad] == 127).all()) and int(pad.sum()) == flat.numel() - rows * g
    assert torch.equal(bs.from_sf_layout(flat, rows, k, vec), s)
    with pytest.raises(ValueError):
        bs.to_sf_layout(s[:, :-1] if g > 1 else s.repeat(1, 2), k, vec, 127)


def test_pad_codes_are_one():
    from humming_triton.formats.dtypes import parse_scale_type
    for name, code in bs.PAD_CODE.items():
        assert float(parse_scale_type(name).value_table()[code]) == 1.0, name


# ---- the family: reasons, candidates, opt-in -------------------------------------------------------------------

class FakeLib:
    """Stands in for a native library built with the sm_100a GEMMs (nothing is called but the ABI version)."""
    def __init__(self, gemm=True, abi=bs.ABI):
        if gemm:
            self.ht_sm100_blockscaled_gemm = object()
        if abi is not None:
            self.ht_sm100_blockscaled_abi = lambda: abi


@pytest.fixture
def fake_lib(monkeypatch):
    """A native library with the sm_100a symbols (the cuda backend's own check passes too)."""
    from cutlass_ext import native
    monkeypatch.setattr(bs, "_native", lambda: (FakeLib(), None))
    monkeypatch.setattr(native, "unavailable", lambda: None)
    dispatch.clear_caches()
    yield
    dispatch.clear_caches()


def _call(preset, m=16, n=4096, k=4096, sm=(10, 0), **kw):
    facts = None if sm is None else facts_for_sm(sm)
    return Call("quant_linear", QuantScheme.parse(preset), torch.bfloat16, m, n, k, facts=facts, **kw)


def test_reason_on_posed_devices(fake_lib):
    fam = families.get("blockscaled_cutlass")
    assert fam.backend == "cuda" and fam in families.registered("quant_linear", "cuda")
    for preset in SCHEMES:
        call = _call(preset)
        assert fam.reason(call) is None and fam.mma(call) == "block_scaled", preset
        assert family_reason(fam, call) is None
        assert [c.family for c in fam.candidates(call)] == ["blockscaled_cutlass"]
        for sm in ((9, 0), (10, 3), (12, 0), (8, 0)):
            why = fam.reason(_call(preset, sm=sm))
            assert why and "SM 10.0 only" in why and f"SM {sm[0]}.{sm[1]}" in why, (preset, sm, why)
        assert "not known" in fam.reason(_call(preset, sm=None))
        assert "CUDA tensors" in fam.reason(_call(preset, device_type="cpu"))
        assert "K a multiple of 32" in fam.reason(_call(preset, k=4096 + 16))
        assert "N a multiple of 8" in fam.reason(_call(preset, n=4100))
        assert fam.reason(_call(preset, k=32, n=8, m=1)) is None
        assert fam.reason(_call(preset, act_order=True)) == "act-order weights"
        assert "dense" in fam.reason(dataclasses.replace(_call(preset), experts=8))
    w4a8 = fam.reason(_call("w4a8-mxfp4"))
    assert "per-token fp32" in w4a8 and "MXFP8" in w4a8
    for preset in ("w4a16", "mxfp4", "nvfp4", "w8a8-fp8", "w4a8-fp8", "w8a8-int8", "w8a16"):
        assert "blockscaled_cutlass runs" in fam.reason(_call(preset)), preset


def test_reason_says_what_the_library_lacks(monkeypatch):
    fam = families.get("blockscaled_cutlass")
    call = _call("w4a4-nvfp4")
    monkeypatch.setattr(bs, "_native", lambda: (None, "the native library is not built (...)"))
    assert "not built" in fam.reason(call)
    monkeypatch.setattr(bs, "_native", lambda: (FakeLib(gemm=False, abi=None), None))
    assert "--arch 90,100a" in fam.reason(call)
    monkeypatch.setattr(bs, "_native", lambda: (FakeLib(abi=None), None))  # the unversioned first signature
    assert "stale (ABI 1" in fam.reason(call)
    monkeypatch.setattr(bs, "_native", lambda: (FakeLib(abi=bs.ABI + 1), None))
    assert "stale" in fam.reason(call)


def test_opt_in_only(fake_lib):
    """On a posed SM 10.0 with the library present, the cuda backend offers the family; ``auto`` still never
    takes it without a measured table naming it (no table ships one), nor does the triton heuristic."""
    fam = families.get("blockscaled_cutlass")
    cuda = backends.get("cuda")
    triton_backend = backends.get("triton")
    for preset in SCHEMES:
        for m in (1, 16, 256, 4096):
            for sm in ((9, 0), (10, 0), (12, 0)):
                call = _call(preset, m, sm=sm)
                assert default_config(call).family != "blockscaled_cutlass"
                assert triton_backend.default(call).family != "blockscaled_cutlass"
                offered = [c.family for c in cuda.candidates(call)]
                assert ("blockscaled_cutlass" in offered) == (sm == (10, 0)), (preset, sm, offered)
            call = _call(preset, m)
            assert dispatch._measured_choice(call, {}, None) is None
    for path in (ROOT / "autotune_configs").glob("*.json"):
        assert "blockscaled_cutlass" not in path.read_text(), f"{path} names blockscaled_cutlass (untimed)"
    assert fam.reason(_call("w4a4-mxfp4", sm=tuple(CPU_FACTS.sm))) is not None  # the interpreter's posed H200


@interpreter
@pytest.mark.parametrize("slug", [None, "b200"])
def test_auto_never_picks_it_untimed(fake_lib, slug, tmp_path, monkeypatch):
    """``auto`` for a CUDA call on SM 10.0 that the family could run: with no table (slug None) or the shipped
    tables (no b200 file), the triton heuristic runs -- only a table entry naming the family makes auto take it."""
    monkeypatch.setattr(dispatch, "CONFIG_DIR", tmp_path)
    dispatch.clear_caches()
    x = torch.empty(16, 4096, dtype=torch.bfloat16)  # only its dtype / device are read here
    for preset in SCHEMES:
        call = dataclasses.replace(_call(preset), facts=dataclasses.replace(facts_for_sm((10, 0)), slug=slug))
        assert backends.get("cuda").reason(call) is None
        name, cand = dispatch._decide(call, x, "auto", ())
        assert name == "triton" and cand.family != "blockscaled_cutlass", (preset, name, cand)
        explicit = dispatch._decide(call, x, "cuda", ())
        assert explicit[0] == "cuda" and explicit[1].family == "blockscaled_cutlass", explicit
    if slug is None:
        return
    cand = Candidate("cuda", "blockscaled_cutlass", KernelConfig("blockscaled_cutlass", 128, 128, 256, 1, 1, 4, 1))
    other = Candidate("triton", "act_tiled", KernelConfig("act_tiled", 128, 128, 128))
    call = dataclasses.replace(_call("w4a4-nvfp4"), facts=dataclasses.replace(facts_for_sm((10, 0)), slug=slug))
    entry = {"candidates": [{**c.to_json(), "us": 10.0 + i} for i, c in enumerate((cand, other))], "failed": []}
    (tmp_path / f"{slug}.json").write_text(json.dumps({"device": "posed", "dispatch": {call.table_key: entry}}))
    dispatch.clear_caches()
    assert dispatch._decide(call, x, "auto", ()) == ("cuda", cand)  # measured fastest: now (and only now) taken


# ---- what run() hands the C function, emulated -----------------------------------------------------------------

E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


def _elements(codes: torch.Tensor, fp8: bool, k: int, low_first: bool = True) -> torch.Tensor:
    """The operand's element values from the bytes the GEMM reads: e2m1 pairs (low nibble = even k) or e4m3."""
    if fp8:
        return codes.contiguous().view(torch.float8_e4m3fn).double()
    lo, hi = (codes & 15).long(), (codes >> 4).long()
    if not low_first:
        lo, hi = hi, lo
    return torch.stack([E2M1[lo], E2M1[hi]], -1).reshape(codes.shape[0], k)


def _scale_values(codes: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "nvfp4":
        return codes.contiguous().view(torch.float8_e4m3fn).double()
    return torch.exp2(codes.double() - 127)


def emulate(p: fam_mod.Prepared, weight_low_first: bool = True) -> torch.Tensor:
    """What the block-scaled GEMM computes from these exact arrays: bf16 ``alpha * (A x SFA) @ (B x SFB)^T + bias``
    (fp64 here), reading every scale back through ``from_sf_layout``.  ``weight_low_first=False``: read the
    weight's e2m1 pairs high nibble first (a wrong byte order, for the test's own check that it can fail)."""
    vec = bs.VEC[p.kind]
    pad = bs.PAD_CODE["e4m3fn" if p.kind == "nvfp4" else "e8m0"]
    out = []
    # e4m3 operands: both for MXFP8, the activations for MXFP8 x MXFP4
    fp8 = (p.kind in ("mxfp8", "mxfp8_mxfp4"), p.kind == "mxfp8")
    for codes, sf, rows, low_first, is8 in ((p.a, p.sfa, p.m, True, fp8[0]), (p.b, p.sfb, p.n, weight_low_first, fp8[1])):
        assert codes.dtype == sf.dtype == torch.uint8 and codes.is_contiguous()
        assert codes.shape == (rows, p.k if is8 else p.k // 2)
        assert sf.numel() == bs.sf_size(rows, p.k, vec)
        off = bs.sf_offsets(rows, bs.sf_groups(p.k, vec)).reshape(-1)
        padding = torch.ones(sf.numel(), dtype=torch.bool)
        padding[off] = False
        assert bool((sf[padding] == pad).all()), "padding must hold the code of 1.0"
        s = _scale_values(bs.from_sf_layout(sf, rows, p.k, vec), p.kind).repeat_interleave(vec, dim=1)[:, :p.k]
        out.append(_elements(codes, is8, p.k, low_first) * s)
    y = out[0] @ out[1].T
    if p.alpha is not None:
        assert p.alpha.dtype == torch.float32 and p.alpha.shape == (1,)
        y = y * p.alpha.double()
    if p.bias is not None:
        assert p.bias.dtype == torch.float32 and p.bias.shape == (p.n,)
        y = y + p.bias.double()
    return y.to(torch.bfloat16)


@interpreter
@pytest.mark.parametrize("preset", SCHEMES)
@pytest.mark.parametrize("m,n,k,with_bias", [(5, 48, 96, True), (130, 136, 160, False), (1, 8, 32, True)])
def test_prepared_arrays_compute_the_reference(preset, m, n, k, with_bias, rng):
    """The activation codes (packed), SFA (converted per call), the weight bytes as stored, SFB (cached), alpha
    and bias that run() passes: dequantized through the layout's inverse, A @ B^T matches ``reference_linear``."""
    qw = quantize_weight(torch.randn(n, k, generator=rng), preset)
    x = (torch.randn(m, k, generator=rng) * 3).to(torch.bfloat16)
    bias = torch.randn(n, generator=rng).to(torch.bfloat16) if with_bias else None
    p = fam_mod.prepare(x, qw, bias)
    assert p.kind == fam_mod.cutlass_kind(qw.scheme) and (p.m, p.n, p.k) == (m, n, k)
    assert (p.alpha is not None) == (preset == "w4a4-nvfp4")
    assert p.b.data_ptr() == qw.data.data_ptr()  # the weight's codes as stored: no copy, no repack
    assert fam_mod.weight_sf(qw, p.kind) is p.sfb  # converted once, cached on the weight
    y = emulate(p)
    ref = ht.reference_linear(x, qw, bias, torch.float32)
    x_eff = dequantize_activation(quantize_activation(x, qw.scheme.act, qw.input_scale))
    w_hat = ht.dequantize_weight(qw)
    # the products of dequantized codes are exact: fp32 accumulation and the bf16 output are the only roundings
    assert_linear_close(y, ref, x_eff, w_hat, torch.float32, f"{preset} {m}x{n}x{k}")
    if preset != "w8a8-mxfp8" and m == 130:  # the check has teeth: the other weight nibble order is far off
        with pytest.raises(AssertionError):
            assert_linear_close(emulate(p, weight_low_first=False), ref, x_eff, w_hat, torch.float32)


@interpreter
def test_weight_scales_are_remade_after_an_in_place_edit(rng):
    qw = quantize_weight(torch.randn(16, 64, generator=rng), "w4a4-mxfp4")
    first = fam_mod.weight_sf(qw, "mxfp4")
    assert fam_mod.weight_sf(qw, "mxfp4") is first
    qw.scales.add_(1)
    again = fam_mod.weight_sf(qw, "mxfp4")
    assert again is not first and torch.equal(bs.from_sf_layout(again, 16, 64, 32), qw.scales)
    import pickle
    assert "cuda" not in pickle.loads(pickle.dumps(qw)).cache  # never serialized
