"""The block-scaled ``dot_scaled`` family (issue 16, Triton part): W4A4 MXFP4 x MXFP4, W4A4 NVFP4 x NVFP4, W4A8
MXFP4 x e4m3, W4A8 MXFP4 x MXFP8 and W8A8 MXFP8 x MXFP8 -- against the reference under the CPU interpreter, opt-in in dispatch, and compiled for sm_100a /
sm_120a with the block-scaled MMA in the PTX (no Blackwell GPU has run it).

Under the interpreter: Triton 3.8 emulates ``tl.dot_scaled`` (numpy, e8m0 scales only), so the MXFP4, W4A8 and
MXFP8 cases run the very ``tl.dot_scaled`` calls a GPU compiles; NVFP4's e4m3 scales would be read as e8m0 there, so
its case runs the kernel's EMULATE branch (same loads, nibble handling and epilogue; the scales decoded in the
kernel and an fp32 ``tl.dot``) -- the e4m3-scaled MMA itself is checked only by compiling.
"""
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import humming_triton as ht
from humming_triton import backends
from humming_triton.backends._families import family_reason
from humming_triton.calls import Call, KernelConfig, interpreting
from humming_triton.capability import CPU_FACTS, facts_for_sm
from humming_triton.formats import QuantScheme
from humming_triton.formats.packing import unpack_codes
from humming_triton.formats.quantize import quantize_weight
from humming_triton.kernels import families
from humming_triton.kernels.dense import default_config, triton_linear

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "compile_check.py")
SCHEMES = ("w4a4-mxfp4", "w4a4-nvfp4", "w4a8-mxfp4", "w4a8-mx", "w8a8-mxfp8")

interpreter = pytest.mark.skipif(not interpreting(), reason="CPU interpreter test (TRITON_INTERPRET=1)")


def _call(preset, m=16, n=4096, k=4096, facts=None):
    return Call("quant_linear", QuantScheme.parse(preset), torch.bfloat16, m, n, k, facts=facts)


@interpreter
@pytest.mark.parametrize("preset", SCHEMES)
@pytest.mark.parametrize("m,n,k,bk,split", [(5, 48, 160, 64, 1), (19, 70, 256, 128, 2)])
def test_matches_reference(preset, m, n, k, bk, split, rng):
    """Odd M and N, a partial last K tile (160 = 2.5 x 64), split-K, bias."""
    qw = quantize_weight(torch.randn(n, k, generator=rng), preset)
    x = torch.randn(m, k, generator=rng).to(torch.bfloat16)
    b = torch.randn(n, generator=rng).to(torch.bfloat16)
    cfg = KernelConfig("dot_scaled", 16, 32, bk, split, 8, 4, 3)
    y = triton_linear(x, qw, b, torch.float32, config=cfg)
    r = ht.reference_linear(x, qw, b, torch.float32)
    torch.testing.assert_close(y, r, rtol=1e-5, atol=1e-5 * float(r.abs().max()))


@interpreter
def test_3d_input_and_out_dtype(rng):
    qw = quantize_weight(torch.randn(40, 96, generator=rng), "w4a4-mxfp4")
    x = torch.randn(2, 3, 96, generator=rng).to(torch.bfloat16)
    y = triton_linear(x, qw, out_dtype=torch.bfloat16, config=KernelConfig("dot_scaled", 16, 32, 64, 1, 8, 4, 3))
    assert y.shape == (2, 3, 40) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ht.reference_linear(x, qw, out_dtype=torch.float32), rtol=1e-2, atol=1e-2)


def test_weight_bytes_are_dot_scaled_packing(rng):
    """The family reads the canonical kpack32 words as bytes with no host transform: byte j of a row must hold
    code 2j in its low nibble and code 2j + 1 in its high nibble (tl.dot_scaled's e2m1 packing along K)."""
    qw = quantize_weight(torch.randn(8, 64, generator=rng), "w4a4-mxfp4")
    codes = unpack_codes(qw.data, 4, 64)
    b = qw.data.contiguous().view(torch.uint8).to(torch.int32)
    assert b.shape == (8, 32)
    assert torch.equal(b & 15, codes[:, 0::2]) and torch.equal(b >> 4, codes[:, 1::2])
    assert qw.scales.dtype == torch.uint8 and qw.scales.shape == (8, 2)  # [N, K / 32]: rhs_scale as it is


def test_mxfp8_weight_bytes_are_codes_in_k_order(rng):
    """MXFP8: the kpack32 words of e4m3 codes read as bytes are the codes themselves, K in order (the [N, K]
    operand tl.dot_scaled takes for e4m3)."""
    qw = quantize_weight(torch.randn(8, 64, generator=rng), "w8a8-mxfp8")
    codes = unpack_codes(qw.data, 8, 64)
    assert torch.equal(qw.data.contiguous().view(torch.uint8).to(torch.int32), codes)
    assert qw.scales.dtype == torch.uint8 and qw.scales.shape == (8, 2)


def test_opt_in_only():
    """Never offered below SM 10.0 (the H200, the interpreter's posed facts); never the heuristic's choice."""
    fam = families.get("dot_scaled")
    triton_backend = backends.registered()["triton"]
    for preset in SCHEMES:
        for m in (1, 16, 256, 4096):
            call = _call(preset, m, facts=CPU_FACTS)
            assert fam.reason(call) is None and fam.mma(call) == "block_scaled"
            assert "block-scaled" in family_reason(fam, call)
            assert family_reason(fam, dataclasses.replace(call, facts=facts_for_sm((9, 0)))) is not None
            for sm in ((10, 0), (12, 0)):
                c = dataclasses.replace(call, facts=facts_for_sm(sm))
                assert family_reason(fam, c) is None
                assert default_config(c).family != "dot_scaled"
                assert triton_backend.default(c).family != "dot_scaled"
            assert all(cfg.family == "dot_scaled" and cfg.block_m == 128 for cfg in fam.candidates(call))
    for preset in ("w4a16", "mxfp4", "nvfp4", "w8a8-fp8", "w4a8-fp8", "w8a8-int8"):
        assert fam.reason(_call(preset)) is not None, preset


@interpreter
@pytest.mark.parametrize("sm", [(9, 0), (10, 0), (12, 0)])
def test_auto_never_picks_it_untimed(sm, rng):
    """A Blackwell GPU with no measured table (slug None): ``auto`` runs the heuristic's family, not dot_scaled."""
    from humming_triton import capability, dispatch
    x = torch.randn(16, 256, generator=rng).to(torch.bfloat16)
    with capability.pose_as(dataclasses.replace(capability.facts_for_sm(sm), slug=None)):
        dispatch.clear_caches()
        try:
            for preset in SCHEMES:
                ht.quant_linear(x, quantize_weight(torch.randn(32, 256, generator=rng), preset), backend="triton")
                assert "dot_scaled" not in dispatch.last_plan(), (preset, dispatch.last_plan())
        finally:
            dispatch.clear_caches()


def _alt_python():
    path = os.environ.get("HT_TRITON_ALT_PYTHON")
    if path:
        return path
    path = os.path.join(ROOT, ".venv-triton36", "bin", "python")
    return path if os.access(path, os.X_OK) else None


# the instruction each scheme's first candidate must lower to (PTX), per arch
EXPECTED = {
    100: ("tcgen05.mma.cta_group::1.kind::mxf4.block_scale", "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale",
          "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale"),
    120: ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::2X.f32.e2m1.e2m1.f32.ue8m0",
          "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3",
          "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0"),
}


# and the SASS opcodes they assemble to (cuobjdump): tcgen05 MMAs on fp4 (UTCOMMA, .4X: NVFP4's 16-element scale
# vector) / fp8 (UTCQMMA) operands; sm_120's block-scaled mma.sync is OMMA.SF / QMMA.SF
EXPECTED_SASS = {
    100: ("UTCOMMA", "UTCOMMA.4X", "UTCQMMA"),
    120: ("OMMA.SF.16864.F32.E2M1.E2M1.E8", "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X", "QMMA.SF.16832.F32.E4M3.E4M3.E8"),
}


@pytest.mark.parametrize("which", ["installed", "alt"])
def test_block_scaled_mma_in_ptx(which):
    """One variant per scheme (its first candidate) compiles for sm_100a and sm_120a, and its PTX holds the
    block-scaled MMA (scripts/compile_check.py fails a dot_scaled variant whose PTX lacks one)."""
    python = sys.executable if which == "installed" else _alt_python()
    if python is None:
        pytest.skip("no second Triton: set HT_TRITON_ALT_PYTHON or run HT_BOOTSTRAP_TRITON_ALT=1 scripts/bootstrap.sh")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import compile_check
    finally:
        sys.path.pop(0)
    fam = families.get("dot_scaled")
    jobs = []
    for preset in SCHEMES:
        call = _call(preset, 256)
        spec, ptrs, ints = fam.compile_spec(call, fam.candidates(call)[0])
        assert not spec.constexprs["EMULATE"]
        jobs.append(compile_check.job_of(spec.kernel, spec.constexprs, ptrs, ints, spec.num_warps, spec.num_stages,
                                         100))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile for real
    with tempfile.TemporaryDirectory() as d:
        path, out_path = os.path.join(d, "jobs.json"), os.path.join(d, "out.json")
        with open(path, "w") as f:
            json.dump(jobs, f)
        out = subprocess.run([python, SCRIPT, "compile", path, "--arch", "90,100,120", "--jobs", "2", "--json",
                              out_path], capture_output=True, text=True, cwd=ROOT, timeout=900,
                             env={**env, "TRITON_CACHE_DIR": os.path.join(d, "tc")})
        print(out.stdout)
        assert os.path.exists(out_path), out.stdout[-3000:] + out.stderr[-3000:]
        with open(out_path) as f:
            result = json.load(f)
    archs = {int(a): s for a, s in result["archs"].items()}
    assert archs[90]["attempted"] == 0 and "block-scaled" in "".join(archs[90]["not_applicable"])
    for arch, want in EXPECTED.items():
        s = archs[arch]
        assert not s["failures"] and s["compiled"] == s["attempted"] == len(SCHEMES), (result["triton"], arch, s)
        found = s["block_scale_mma"]
        for instr in want:
            assert any(f.startswith(instr) for f in found), (result["triton"], arch, instr, found)
        if s.get("block_scale_sass"):  # empty only where this Triton ships no cuobjdump
            assert set(EXPECTED_SASS[arch]) <= set(s["block_scale_sass"]), (result["triton"], arch, s)
    assert out.returncode == 0, out.stderr[-3000:]
