"""MoE experts on the sm_90a CUTLASS grouped fp8 GEMM (``cutlass_ext/csrc_sm90_grouped_fp8``, family
``cutlass_grouped_fp8``, backend ``cutlass``; issue 11): W8A8-FP8 experts on their own codes, W4A8-MXFP4 experts on
their exact e4m3 rows, per-token e4m3 activations.

CPU: the Python variant table agrees with the .cu's; the operands the family hands the kernel, multiplied out in
float64 (``grouped_fp8.emulate``), equal the reference on the same activation codes; the launcher refuses bad
arguments before touching the library; the family names what it cannot run and is opt-in; the kernel compiles to
fp8 wgmma without spills.  GPU (``-m gpu``): every built variant against the reference over uneven and empty
experts, int32 and int64 offsets, poisoned outputs -- and no less accurate than ``torch._scaled_mm`` (fast
accumulation off, the FP8 standard) on the same codes."""
import re
from pathlib import Path

import pytest
import torch

import humming_triton as ht
from cutlass_ext import grouped_fp8 as gf
from humming_triton.calls import Call
from humming_triton.kernels import families
from humming_triton.testing import FP8_STANDARD_FACTOR, assert_linear_close, poison_like

ROOT = Path(__file__).resolve().parent.parent
SCHEMES = ["w4a8-mxfp4", "w8a8-fp8"]
COUNTS = {"uneven": [5, 0, 17, 1, 40], "one_expert": [0, 0, 33, 0, 0]}


def _experts(scheme, e, n, k, rng):
    w = torch.randn(e, n, k, generator=rng) * 0.05
    w = w * torch.exp2(torch.linspace(0, 5, k // 32)).repeat_interleave(32)  # rows spanning several binades
    return ht.quantize_weight(w, scheme)


def _routed(counts, k, rng, dtype=torch.int64):
    offsets = torch.zeros(len(counts) + 1, dtype=dtype)
    offsets[1:] = torch.cumsum(torch.tensor(counts), 0)
    return torch.randn(int(offsets[-1]), k, generator=rng).to(torch.bfloat16), offsets


def test_variants_match_the_source():
    from cutlass_ext.build import sm90_grouped_fp8_variants
    text = (ROOT / "cutlass_ext" / "csrc_sm90_grouped_fp8" / "grouped_fp8_gemm.cu").read_text()
    rows = re.findall(r"X\((\d+), Shape<_(\d+) COMMA _(\d+) COMMA _(\d+)>, (\w+)\)", text)
    assert {int(v): (int(t), int(k), int(r)) for v, r, t, k, _ in rows} == gf.VARIANTS
    assert all((policy == "Pingpong") == (r == "64") for _, r, _, _, policy in rows)
    assert sorted(sm90_grouped_fp8_variants()) == sorted(gf.VARIANTS)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_emulated_operands_match_reference(scheme, rng):
    """The family's operands (activation codes + token scales, expert e4m3 rows + row scales), multiplied out in
    float64, are the reference's dequantized activations times its dequantized experts (both fp32: their
    products rounded once), to fp32 rounding -- a wrong code, scale or row is off by O(1)."""
    from humming_triton.kernels.dense import triton_quantize_activation
    fam = families.get("cutlass_grouped_fp8")
    qw = _experts(scheme, 5, 48, 256, rng)
    x, offsets = _routed(COUNTS["uneven"], 256, rng)
    q = triton_quantize_activation(x, qw.scheme.act, None)
    wq, ws = fam.packed(qw)
    got = gf.emulate(q.codes, q.scales, wq, ws, offsets)
    x_hat = ht.dequantize_activation(ht.quantize_activation(x, qw.scheme.act)).double()
    w_hat = ht.dequantize_weight(qw).double()
    ref = torch.cat([x_hat[offsets[e]:offsets[e + 1]] @ w_hat[e].T for e in range(qw.shape[0])])
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6 * float(ref.abs().max()))


def test_family_names_what_it_cannot_run():
    fam = families.get("cutlass_grouped_fp8")
    call = lambda s, dt=torch.bfloat16, n=64, k=256: Call("grouped_linear", ht.QuantScheme.parse(s), dt, 40, n, k,  # noqa: E731
                                                           experts=4, device_type="cpu")
    assert "per-token e4m3" in fam.reason(call("w4a16"))
    assert "per-token e4m3" in fam.reason(call("w8a8-fp8-block"))
    assert "MXFP4" in fam.reason(call("w4a8-fp8"))
    assert "bf16 only" in fam.reason(call("w4a8-mxfp4", torch.float16))
    assert "multiple of 16" in fam.reason(call("w8a8-fp8", k=264))
    for s in SCHEMES:
        assert fam.reason(call(s)) is None and len(fam.candidates(call(s))) == len(gf.VARIANTS)
    dense = Call("quant_linear", ht.QuantScheme.parse("w8a8-fp8"), torch.bfloat16, 40, 64, 256, device_type="cpu")
    assert "MoE experts" in fam.reason(dense)


def test_family_is_opt_in(monkeypatch):
    """Runnable on an sm_90a build, yet ``auto`` never runs it without a measured table entry naming it (untimed
    until the tuner times it on the device)."""
    from humming_triton import backends, dispatch
    from humming_triton.capability import facts_for_sm
    monkeypatch.setattr(gf, "available", lambda: None)  # as if the sm_90a build were loaded
    monkeypatch.setattr(gf, "built_variants", lambda: sorted(gf.VARIANTS))
    fam = families.get("cutlass_grouped_fp8")
    for s in SCHEMES:
        call = Call("grouped_linear", ht.QuantScheme.parse(s), torch.bfloat16, 32768, 1536, 2048, experts=128,
                    facts=facts_for_sm((9, 0)))
        assert fam.backend == "cutlass" and fam.op == "grouped_linear" and fam.mma(call) == "wgmma"
        assert fam.reason(call) is None and len(fam.candidates(call)) == len(gf.VARIANTS)
        assert "SM 9.0 only" in fam.reason(Call("grouped_linear", call.scheme, torch.bfloat16, 512, 1536, 2048,
                                                experts=128, facts=facts_for_sm((10, 0))))
        assert dispatch._measured_choice(call, {}, None) is None
        for b in ("triton", "torch"):  # auto without a table entry takes their defaults
            if backends.get(b).reason(call) is None:
                assert (backends.get(b).default(call).family or "") != fam.name


def test_launcher_refuses_bad_arguments():
    t, e, n, k = 6, 2, 16, 64
    xq = torch.zeros(t, k, dtype=torch.uint8)
    xs = torch.ones(t)
    wq = torch.zeros(e, n, k, dtype=torch.uint8)
    ws = torch.ones(e, n)
    off = torch.tensor([0, 3, 6])
    out = torch.empty(t, n, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unknown grouped fp8 variant"):
        gf.run(xq, xs, wq, ws, off, out, 99)
    with pytest.raises(ValueError, match="e4m3"):
        gf.run(xq.to(torch.bfloat16), xs, wq, ws, off, out, 0)
    with pytest.raises(ValueError, match="bf16"):
        gf.run(xq, xs, wq, ws, off, out.float(), 0)
    with pytest.raises(ValueError, match="scales must be fp32"):
        gf.run(xq, xs[:3], wq, ws, off, out, 0)
    with pytest.raises(ValueError, match="offsets"):
        gf.run(xq, xs, wq, ws, off[:2], out, 0)
    with pytest.raises(ValueError, match="multiple of 16"):
        gf.run(xq[:, :40].contiguous(), xs, wq[:, :, :40].contiguous(), ws, off, out, 0)


def test_sm90a_grouped_fp8_kernel_compiles_to_fp8_wgmma(tmp_path, cutlass_nvcc):
    """One kernel (128 weight rows x 128 tokens x 128 K, cooperative): nvcc compiles it against the nvidia-cutlass
    headers, the SASS holds e4m3 x e4m3 QGMMA with fp32 accumulation, and nothing spills.  ~30 s on one core."""
    import subprocess
    nvcc = cutlass_nvcc
    from cutlass_ext.build import SM90_GROUPED_FP8_SOURCE, cuobjdump, cutlass_command
    obj = tmp_path / "grouped_fp8.o"
    r = subprocess.run(cutlass_command(SM90_GROUPED_FP8_SOURCE, obj, "90a", nvcc, ("HT_SM90F8_VARIANT=1",)),
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    tool = cuobjdump()
    assert tool, "no cuobjdump (Triton's bundled one, or the CUDA toolkit's) to read the SASS"
    sass = subprocess.run([tool, "-sass", str(obj)], capture_output=True, text=True, timeout=600).stdout
    assert re.search(r"QGMMA\.64x128x32\.F32\.E4M3\.E4M3\b", sass), set(re.findall(r"[HQ]GMMA\.\S+", sass))
    # promotion (the FP8 standard): at most 4 QGMMAs (128 of K) before the wgmma accumulator is added into the fp32
    # one -- a run of FADDs, one per accumulator register (64 per thread for 64 x 128 per warpgroup)
    runs, since, fadds, max_since = 0, 0, 0, 0
    for line in sass.splitlines():
        if "QGMMA" in line:
            since, fadds = since + 1, 0
        elif re.search(r"\bFADD\b", line):
            fadds += 1
            if fadds == 64:
                runs, max_since, since = runs + 1, max(max_since, since), 0
    assert runs >= 2 and max_since <= 4 and since == 0, (runs, max_since, since)
    res = subprocess.run([tool, "-res-usage", str(obj)], capture_output=True, text=True, timeout=600).stdout
    assert res.count("Function") == 3 and res.count("LOCAL:0") == 3, res


# ---- GPU ---------------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("counts", sorted(COUNTS))
@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
def test_kernel_matches_reference(scheme, counts, offsets_dtype, rng):
    """Every built variant against the reference on the same activation codes (fp8 tolerance), empty experts
    included, every output row written (poisoned first), CUDA-graph replay equal to the eager call."""
    fam = families.get("cutlass_grouped_fp8")
    why = gf.available()
    if why:
        pytest.fail(why)
    n, k = 208, 1024
    qw = _experts(scheme, len(COUNTS[counts]), n, k, rng).to("cuda")
    x, offsets = _routed(COUNTS[counts], k, rng, offsets_dtype)
    x_hat = ht.dequantize_activation(ht.quantize_activation(x, qw.scheme.act)).double()
    w_hat = ht.dequantize_weight(qw.to("cpu")).double()
    call = Call("grouped_linear", qw.scheme, torch.bfloat16, x.shape[0], n, k, experts=len(COUNTS[counts]))
    assert fam.reason(call) is None and fam.candidates(call)
    xc, oc = x.cuda(), offsets.cuda()
    for cfg in fam.candidates(call):
        out = poison_like(torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda"))
        y = fam.run(xc, oc, qw, None, torch.bfloat16, cfg, out)
        assert y.data_ptr() == out.data_ptr()
        for e, c in enumerate(COUNTS[counts]):
            rows = slice(int(offsets[e]), int(offsets[e + 1]))
            if c:
                assert_linear_close(y[rows].cpu(), x_hat[rows] @ w_hat[e].T, x_hat[rows], w_hat[e],
                                    torch.float8_e4m3fn, f"fp8 expert {e} {cfg.describe()}")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y2 = fam.run(xc, oc, qw, None, torch.bfloat16, cfg, None)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y2, y)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_less_accurate_than_scaled_mm(scheme, rng):
    """The FP8 standard: against float64 of the same codes, our error is at most FP8_STANDARD_FACTOR times that of
    torch._scaled_mm (fast accumulation off) per expert, at K = 4096 where promotion matters."""
    from humming_triton.kernels.dense import triton_quantize_activation
    fam = families.get("cutlass_grouped_fp8")
    why = gf.available()
    if why:
        pytest.fail(why)
    n, k, counts = 256, 4096, [64, 0, 128]
    qw = _experts(scheme, len(counts), n, k, rng).to("cuda")
    x, offsets = _routed(counts, k, rng)
    xc, oc = x.cuda(), offsets.cuda()
    q = triton_quantize_activation(xc, qw.scheme.act, None)
    wq, ws = fam.packed(qw)
    exact = gf.emulate(q.codes, q.scales, wq, ws, offsets)
    call = Call("grouped_linear", qw.scheme, torch.bfloat16, x.shape[0], n, k, experts=len(counts))
    cfg = fam.candidates(call)[0]
    ours = fam.run(xc, oc, qw, None, torch.bfloat16, cfg, None).double().cpu()
    for e, c in enumerate(counts):
        if not c:
            continue
        rows = slice(int(offsets[e]), int(offsets[e + 1]))
        theirs = torch._scaled_mm(q.codes[rows].view(torch.float8_e4m3fn), wq[e].view(torch.float8_e4m3fn).T,
                                  scale_a=q.scales[rows].reshape(-1, 1).contiguous(),
                                  scale_b=ws[e].reshape(1, -1).contiguous(), out_dtype=torch.bfloat16,
                                  use_fast_accum=False).double().cpu()
        err = lambda y: float((y - exact[rows]).norm() / exact[rows].norm())  # noqa: E731
        assert err(ours[rows]) <= FP8_STANDARD_FACTOR * err(theirs) + 1e-12, (e, err(ours[rows]), err(theirs))
