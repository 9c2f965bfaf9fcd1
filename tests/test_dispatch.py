"""The execution layer: backend and kernel-family registries, the measured table and its nearest-entry rule, and
the capability table posed as every SM (CPU; the Triton paths run under the interpreter)."""
import dataclasses
import json

import pytest
import torch

import humming_triton as ht
from humming_triton import backends, capability, dispatch
from humming_triton.calls import Call, Candidate, KernelConfig
from humming_triton.kernels import families
from humming_triton.kernels.families.gemv import Gemv


@pytest.fixture
def table(tmp_path, monkeypatch):
    """Write a measured table for the posed device (slug h200) and point dispatch at it."""
    monkeypatch.setattr(dispatch, "CONFIG_DIR", tmp_path)
    dispatch.clear_caches()

    def write(entries: dict):
        (tmp_path / "h200.json").write_text(json.dumps({"device": "posed", "dispatch": entries}))
        dispatch.clear_caches()
    yield write
    dispatch.clear_caches()


def _entry(*cands):
    return {"candidates": [{**c.to_json(), "us": 10.0 + i} for i, c in enumerate(cands)], "failed": []}


class ToyBackend(backends.Backend):
    """Runs quant_linear for w4a16 only, through the reference math, counting its calls."""
    name = "toy"

    def __init__(self):
        self.calls = 0

    def reason(self, call):
        return None if call.op == "quant_linear" and call.scheme.name == "w4a16" else "toy runs w4a16 only"

    def quant_linear(self, x, qw, bias, out_dtype, cand):
        self.calls += 1
        return ht.reference_linear(x, qw, bias, out_dtype)


class ToyFamily(Gemv):
    """The generic GEMV under another name, counting how often it was planned."""
    name = "toy_gemv"
    planned = 0

    def spec(self, fmt, call, cfg, has_bias):
        ToyFamily.planned += 1
        return super().spec(fmt, call, cfg, has_bias)


@pytest.fixture
def toy_backend():
    toy = backends.register(ToyBackend())
    dispatch.clear_caches()
    yield toy
    backends._BACKENDS.pop("toy")
    dispatch.clear_caches()


@pytest.fixture
def toy_family():
    fam = families.register(ToyFamily())
    dispatch.clear_caches()
    yield fam
    families._FAMILIES.pop("toy_gemv")
    dispatch.clear_caches()


def _w4(rng, n=40, k=256):
    return ht.quantize_weight(torch.randn(n, k, generator=rng), "w4a16")


@pytest.mark.interpret
def test_registries_list_the_builtins():
    assert {"reference", "triton", "torch"} <= set(backends.names())
    names = {f.name for f in families.registered()}
    assert {"gemv", "gemv_words", "tiled", "swapab", "act_tiled", "dequant_mm", "scaled_mm", "grouped",
            "dequant_grouped_mm"} <= names
    assert all(f.backend in backends.names() for f in families.registered())
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        ht.quant_linear(torch.randn(2, 256), _w4(torch.Generator().manual_seed(0)), backend="nope")


@pytest.mark.interpret
def test_toy_backend_explicit_and_measured(rng, toy_backend, table):
    qw = _w4(rng)
    x = torch.randn(3, 256, generator=rng)
    y = ht.quant_linear(x, qw, backend="toy")
    assert toy_backend.calls == 1 and ht.last_backend() == "toy"
    torch.testing.assert_close(y, ht.reference_linear(x, qw))
    with pytest.raises(RuntimeError, match="toy runs w4a16 only"):
        ht.quant_linear(x, ht.quantize_weight(torch.randn(40, 256, generator=rng), "w8a16"), backend="toy")
    # measured fastest on the (posed) H200 -> auto takes it
    table({Call("quant_linear", qw.scheme, x.dtype, 3, 40, 256).table_key: _entry(
        Candidate("toy", "default"), Candidate("triton", "tiled", KernelConfig("tiled", 16, 32, 64)))})
    with capability.pose_as((9, 0)):
        ht.quant_linear(x, qw)
    assert toy_backend.calls == 2 and dispatch.last_plan() == "toy/default"


@pytest.mark.interpret
def test_toy_family_measured(rng, toy_family, table):
    qw = _w4(rng)
    x = torch.randn(1, 256, generator=rng).half()
    cfg = KernelConfig("toy_gemv", 1, 8, 128, 1, num_stages=1)
    table({Call("quant_linear", qw.scheme, x.dtype, 1, 40, 256).table_key: _entry(Candidate("triton", "toy_gemv", cfg))})
    with capability.pose_as((9, 0)):
        y = ht.quant_linear(x, qw)
    assert ToyFamily.planned >= 1 and dispatch.last_plan().startswith("triton/toy_gemv")
    ref = ht.reference_linear(x, qw, out_dtype=torch.float32)
    assert float((y.float() - ref).norm() / ref.norm()) < 1e-3
    # the tuner would time it: it is among the Triton backend's candidates for the call
    call = dispatch.call_for("quant_linear", x, qw)
    assert any(c.family == "toy_gemv" for c in backends.get("triton").candidates(call))


@pytest.mark.interpret
def test_nearest_entry_rule(rng, table):
    tiled = Candidate("triton", "tiled", KernelConfig("tiled", 16, 32, 64, 1, 8, 4, 2))
    swap = Candidate("triton", "swapab", KernelConfig("swapab", 16, 32, 64, 1, 8, 4, 2))
    table({"quant_linear|w4a16|8192x8192|m4": _entry(tiled),
           "quant_linear|w4a16-asym|64x256|m4": _entry(swap),   # same bits, other zero kind: another class
           "quant_linear|w4a16|64x256|m16": _entry(swap)})     # nearer shape, other M bucket
    qw = _w4(rng, 64, 256)
    x = torch.randn(3, 256, generator=rng).half()
    with capability.pose_as((9, 0)):
        ht.quant_linear(x, qw)
        assert dispatch.last_plan() == tiled.describe()  # same scheme beats a nearer other-class shape
        ht.quant_linear(torch.randn(9, 256, generator=rng).half(), qw)
        assert dispatch.last_plan() == swap.describe()  # M bucket 16
        qa = ht.quantize_weight(torch.randn(64, 256, generator=rng), "w8a16")  # no entry of its class in m4
        ht.quant_linear(x, qa)
        assert dispatch.last_plan() in (tiled.describe(), swap.describe())  # any 16-bit-activation scheme
        fp8 = ht.quantize_weight(torch.randn(64, 256, generator=rng), "w8a8-fp8")  # no fp8-activation entry
        ht.quant_linear(x, fp8)
        assert dispatch.last_plan().startswith("triton/act_tiled")  # the heuristic, not a w4a16 timing
        assert "measured entry quant_linear|w4a16|8192x8192|m4" in dispatch.explain("quant_linear", x, qw)


@pytest.mark.interpret
def test_unrunnable_measured_candidate_is_skipped(rng, table):
    """A measured winner that cannot run this call (gemv_words with 3-bit codes) is passed over."""
    words = Candidate("triton", "gemv_words", KernelConfig("gemv_words", 1, 4, 256, 1, num_stages=1))
    gemv = Candidate("triton", "gemv", KernelConfig("gemv", 1, 8, 128, 1, num_stages=1))
    table({"quant_linear|w3a16|48x256|m1": _entry(words, gemv)})
    qw = ht.quantize_weight(torch.randn(48, 256, generator=rng), "w3a16")
    with capability.pose_as((9, 0)):
        ht.quant_linear(torch.randn(1, 256, generator=rng).half(), qw)
    assert dispatch.last_plan() == gemv.describe()


SMS = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]


@pytest.mark.interpret
@pytest.mark.parametrize("sm", SMS, ids=lambda s: f"sm{s[0]}{s[1]}")
def test_capability_routes_each_sm(sm, rng):
    x16 = torch.randn(16, 256, generator=rng).to(torch.bfloat16)
    qw = _w4(rng, 32, 256)
    # a device with no measured table (slug None): the capability table and the heuristic alone decide
    with capability.pose_as(dataclasses.replace(capability.facts_for_sm(sm), slug=None)):
        dispatch.clear_caches()
        ht.quant_linear(x16, qw)
        fam = dispatch.last_plan().split()[0]
        if sm < (8, 0):  # no bf16 MMA: a CUDA-core family
            assert fam in ("triton/gemv_words", "triton/gemv"), fam
        else:
            assert fam == "triton/tiled"
        fp8 = ht.quantize_weight(torch.randn(32, 256, generator=rng), "w8a8-fp8")
        if sm < (8, 9):
            with pytest.raises(RuntimeError, match=r"fp8 \(e4m3/e5m2\) tensor-core MMA needs SM 8.9"):
                ht.quant_linear(x16, fp8, backend="triton")
        else:
            ht.quant_linear(x16, fp8, backend="triton")
            assert dispatch.last_plan().startswith("triton/act_tiled")
        int8 = ht.quantize_weight(torch.randn(32, 256, generator=rng), "w8a8-int8")
        ht.quant_linear(x16, int8)
        if sm == (10, 0):  # no fast int8 MMA on SM 10.0's new instructions: dequantize + cuBLAS
            assert dispatch.last_plan().startswith("torch/dequant_mm")
        else:
            assert dispatch.last_plan().startswith("triton/act_tiled")
    dispatch.clear_caches()


@pytest.mark.interpret
def test_torch_backend_runs_dequant_mm(rng):
    qw = _w4(rng)
    x = torch.randn(5, 256, generator=rng).half()
    y = ht.quant_linear(x, qw, backend="torch")
    assert ht.last_backend() == "torch" and dispatch.last_plan().startswith("torch/dequant_mm")
    ref = ht.reference_linear(x, qw, out_dtype=torch.float32)
    assert float((y.float() - ref).norm() / ref.norm()) < 2e-3
    call = dispatch.call_for("quant_linear", x, qw)
    assert [c.family for c in backends.get("torch").candidates(call)] == ["dequant_mm"]  # scaled_mm: CUDA only


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["w8a8-fp8", "w4a16"])
def test_torch_composed_families_on_gpu(scheme, rng):
    """scaled_mm on our e4m3 codes and dequantize + grouped_mm against the reference."""
    if scheme == "w8a8-fp8":
        qw = ht.quantize_weight(torch.randn(256, 512, generator=rng), scheme).to("cuda")
        x = torch.randn(37, 512, generator=rng).to(torch.bfloat16).cuda()
        call = dispatch.call_for("quant_linear", x, qw)
        cand = next(c for c in backends.get("torch").candidates(call) if c.family == "scaled_mm")
        y = backends.get("torch").quant_linear(x, qw, None, None, cand)
        ref = ht.reference_linear(x.cpu(), qw.to("cpu"), out_dtype=torch.float32)
        assert float((y.float().cpu() - ref).norm() / ref.norm()) < 1e-2
        return
    e, n, k = 8, 96, 256
    qw = ht.quantize_weight(torch.randn(e, n, k, generator=rng), scheme).to("cuda")
    counts = torch.randint(0, 9, (e,), generator=rng)
    offsets = torch.zeros(e + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(counts, 0)
    x = torch.randn(int(offsets[-1]), k, generator=rng).to(torch.bfloat16).cuda()
    y = ht.grouped_linear(x, qw, offsets.cuda(), backend="torch")
    assert dispatch.last_plan("grouped_linear").startswith("torch/dequant_grouped_mm")
    ref = ht.reference_grouped_linear(x.cpu(), qw.to("cpu"), offsets, out_dtype=torch.float32)
    assert float((y.float().cpu() - ref).norm() / ref.norm()) < 1e-2


def test_nearest_key_regret_tool():
    """scripts/nearest_key_regret.py: hiding a key, the rule's neighbour runs its first candidate also timed
    there; the regret is that time over the hidden key's best."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "nearest_key_regret.py"
    spec = importlib.util.spec_from_file_location("nearest_key_regret", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    a = {"backend": "triton", "family": "tiled", "config": KernelConfig("tiled", 16, 32, 64).to_json()}
    b = {"backend": "triton", "family": "tiled", "config": KernelConfig("tiled", 16, 64, 64).to_json()}
    table = {"quant_linear|w4a16|4096x4096|m16": {"candidates": [{**a, "us": 10.0}, {**b, "us": 15.0}]},
             "quant_linear|w4a16|8192x8192|m16": {"candidates": [{**b, "us": 20.0}, {**a, "us": 30.0}]},
             "quant_linear|w4a16|8192x8192|m1": {"candidates": [{**a, "us": 5.0}]}}  # no neighbour in its bucket
    got = {key: (round(r, 3), near) for r, key, near in tool.regrets(table)}
    assert got == {"quant_linear|w4a16|4096x4096|m16": (1.5, "quant_linear|w4a16|8192x8192|m16"),
                   "quant_linear|w4a16|8192x8192|m16": (1.5, "quant_linear|w4a16|4096x4096|m16")}
