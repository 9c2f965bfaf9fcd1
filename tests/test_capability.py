"""capability.py: the SM table, posed devices (no CUDA needed), CPU facts, unknown-SM resolution, the reasons."""
from types import SimpleNamespace

import pytest
import torch

from humming_triton import capability as cap

# what each row must answer: fp16, bf16, fp8, int8, wgmma, block_scaled, tma
EXPECTED = {
    (7, 5): (1, 0, 0, 1, 0, 0, 0),
    (8, 0): (1, 1, 0, 1, 0, 0, 0),
    (8, 6): (1, 1, 0, 1, 0, 0, 0),
    (8, 9): (1, 1, 1, 1, 0, 0, 0),
    (9, 0): (1, 1, 1, 1, 1, 0, 1),
    (10, 0): (1, 1, 1, 0, 0, 1, 1),
    (12, 0): (1, 1, 1, 1, 0, 1, 1),
}
KINDS = ("fp16", "bf16", "fp8", "int8", "wgmma", "block_scaled")


@pytest.fixture
def no_cuda(monkeypatch):
    """Any CUDA query fails the test: posing and CPU facts must not touch CUDA."""
    def boom(*a, **k):
        raise AssertionError("CUDA was queried")
    for name in ("get_device_properties", "current_device", "get_device_capability"):
        monkeypatch.setattr(torch.cuda, name, boom)
    cap._cuda_facts.cache_clear()
    yield
    cap._cuda_facts.cache_clear()


def test_table_has_the_rows_of_the_design():
    assert sorted(cap.TABLE) == sorted(EXPECTED)


@pytest.mark.parametrize("sm", sorted(EXPECTED))
def test_posed_sm_answers_its_row(sm, no_cuda):
    with cap.pose_as(sm) as facts:
        assert cap.device_facts() == facts == cap.device_facts(torch.device("cuda", 3)) == cap.device_facts("cpu")
        assert facts.sm == sm and facts.num_sms > 0 and facts.smem_per_block >= 64 * 1024
        c = cap.capability(cap.device_facts())
        got = (c.fp16_mma, c.bf16_mma, c.fp8_mma, c.int8_mma, c.wgmma, c.block_scaled_mma, c.tma)
        assert got == tuple(map(bool, EXPECTED[sm])), c
        assert c.notes
        for kind, has in zip(KINDS, EXPECTED[sm]):
            why = cap.mma_reason(kind)  # default facts: the posed ones
            if has:
                assert why is None, (sm, kind, why)
            else:
                assert why and facts.name in why and f"SM {sm[0]}.{sm[1]}" in why, why
        assert cap.mma_reason("fma") is None  # CUDA cores: everywhere
    assert cap.device_facts("cpu") == cap.CPU_FACTS  # the pose ended


def test_reasons_read_clearly():
    t4 = cap.facts_for_sm((7, 5))
    assert cap.mma_reason("bf16", t4) == "bf16 tensor-core MMA needs SM 8.0 or newer; this GPU (Tesla T4) is SM 7.5"
    a100 = cap.facts_for_sm((8, 0))
    assert cap.mma_reason("fp8", a100).startswith("fp8 (e4m3/e5m2) tensor-core MMA needs SM 8.9 or newer; this GPU "
                                                  "(NVIDIA A100")
    b200 = cap.facts_for_sm((10, 0))
    why = cap.mma_reason("int8", b200)
    assert "int8" in why and "NVIDIA B200" in why and "SM 10.0" in why
    assert "wgmma" in cap.mma_reason("wgmma", b200) and "SM 9.0" in cap.mma_reason("wgmma", b200)
    assert "block-scaled" in cap.mma_reason("block_scaled", cap.facts_for_sm((9, 0)))
    with pytest.raises(ValueError, match="unknown MMA kind"):
        cap.mma_reason("tf32", t4)


@pytest.mark.parametrize("sm,row", [((8, 7), (8, 6)), ((8, 9), (8, 9)), ((9, 5), (9, 0)), ((10, 3), (10, 0)),
                                    ((11, 0), (10, 0)), ((12, 1), (12, 0)), ((13, 0), (12, 0))])
def test_unknown_sm_takes_the_nearest_lower_row(sm, row, no_cuda):
    assert cap.capability(sm) is cap.TABLE[row]
    with cap.pose_as(sm) as f:
        assert f.sm == sm and cap.capability(cap.device_facts()) is cap.TABLE[row]
        if sm != row:
            assert f.slug is None and f"SM {sm[0]}.{sm[1]}" in f.name  # an imaginary GPU has no config file
    # 10.3 (B300 class) keeps 10.0's "no fast int8"; 11.0 resolves to 10.0 as well
    assert cap.capability((10, 3)).int8_mma is False and cap.capability((11, 0)).block_scaled_mma


def test_below_the_table_assumes_no_tensor_cores():
    c = cap.capability((7, 0))
    assert c is cap.NO_TENSOR_CORES and not (c.fp16_mma or c.bf16_mma or c.int8_mma)
    assert "SM 7.0" in cap.mma_reason("fp16", cap.facts_for_sm((7, 0)))


def test_cpu_devices_get_the_interpreter_facts(no_cuda):
    x = torch.randn(3, 4)
    f = cap.device_facts(x.device)
    assert f == cap.CPU_FACTS and f.slug is None and f.name == "cpu-interpreter"
    assert f.sm == (9, 0) and f.num_sms == 132  # the H200 the heuristics were tuned on
    assert cap.device_facts("cpu") == f


def test_no_device_without_cuda_is_the_cpu(monkeypatch, no_cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cap.device_facts() == cap.CPU_FACTS


def test_cuda_facts_read_once_per_index(monkeypatch):
    calls = []

    def props(index):
        calls.append(index)
        names = {0: ("NVIDIA H200", 9, 0, 132), 1: ("NVIDIA GeForce RTX 4090", 8, 9, 128)}
        name, major, minor, sms = names[index]
        p = SimpleNamespace(name=name, major=major, minor=minor, multi_processor_count=sms)
        if index == 0:
            p.shared_memory_per_block_optin = 232448  # index 1: an older torch without the field
        return p

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    cap._cuda_facts.cache_clear()
    try:
        h = cap.device_facts(torch.device("cuda", 0))
        assert h == cap.DeviceFacts((9, 0), 132, 232448, "NVIDIA H200", "h200")
        g = cap.device_facts(torch.device("cuda"))  # no index: the current device
        assert g.sm == (8, 9) and g.slug == "geforce_rtx_4090" and g.smem_per_block == 99 * 1024
        assert cap.device_facts("cuda:0") is h and calls == [0, 1]  # cached
        with cap.pose_as((7, 5)):
            assert cap.device_facts("cuda:0").sm == (7, 5)
        assert cap.device_facts("cuda:0") is h
    finally:
        cap._cuda_facts.cache_clear()


def test_pose_nests_and_overrides_pair(no_cuda):
    with cap.pose_as((8, 0)):
        with cap.pose_as(cap.facts_for_sm((12, 0))) as inner:
            assert cap.device_facts().sm == (12, 0) and inner.name == "NVIDIA GeForce RTX 5090"
        assert cap.device_facts().sm == (8, 0)
    cap.set_override((10, 0))
    try:
        assert cap.device_facts("cpu").name == "NVIDIA B200"
    finally:
        cap.clear_override()
    assert cap.device_facts("cpu") == cap.CPU_FACTS


@pytest.mark.parametrize("name,slug", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100_80gb_hbm3"),
                                       ("NVIDIA A100-SXM4-80GB", "a100_sxm4_80gb"), ("Tesla T4", "tesla_t4"),
                                       ("NVIDIA GeForce RTX 5090", "geforce_rtx_5090")])
def test_slug_rule(name, slug):
    assert cap.slug_of(name) == slug


def test_example_facts_are_plausible():
    assert cap.facts_for_sm((9, 0)).slug == "h200" and cap.facts_for_sm((9, 0)).num_sms == 132
    assert cap.facts_for_sm((8, 0)).num_sms == 108 and cap.facts_for_sm((10, 0)).num_sms == 148
    assert cap.facts_for_sm((12, 0)).num_sms == 170


@pytest.mark.parametrize("act,x,kind", [(None, torch.float16, "fp16"), (None, torch.bfloat16, "bf16"),
                                        (None, torch.float32, "fma"), (None, "bf16", "bf16"),
                                        ("e4m3fn", None, "fp8"), ("int8", torch.bfloat16, "int8"),
                                        ("e2m1", torch.float16, "bf16")])
def test_kernel_mma_kind(act, x, kind):
    assert cap.kernel_mma_kind(act, x) == kind
    assert kind in cap.MMA_KINDS


def test_kernel_mma_kind_rejects_what_no_kernel_takes():
    with pytest.raises(ValueError, match="activations"):
        cap.kernel_mma_kind(None, torch.float64)
    with pytest.raises(ValueError, match="activations"):
        cap.kernel_mma_kind("e5m2", torch.bfloat16)


def test_int8_schemes_route_by_the_table():
    """W8A8-INT8 needs the int8 MMA: fine on Hopper and GeForce Blackwell, not on SM 10.x; bf16 activations need
    SM 8.0 (a T4 has fp16 only)."""
    need = cap.kernel_mma_kind("int8", torch.bfloat16)
    assert cap.mma_reason(need, cap.facts_for_sm((9, 0))) is None
    assert cap.mma_reason(need, cap.facts_for_sm((12, 0))) is None
    assert cap.mma_reason(need, cap.facts_for_sm((10, 0))) is not None
    assert cap.mma_reason(cap.kernel_mma_kind(None, torch.bfloat16), cap.facts_for_sm((7, 5))) is not None
    assert cap.mma_reason(cap.kernel_mma_kind(None, torch.float16), cap.facts_for_sm((7, 5))) is None


def test_import_touches_neither_cuda_nor_torch():
    import subprocess
    import sys
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('c', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); sys.modules['c'] = m; s.loader.exec_module(m); "
            "assert 'torch' not in sys.modules; print(m.mma_reason('fp8', m.facts_for_sm((8, 6))))")
    out = subprocess.run([sys.executable, "-c", code, cap.__file__], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "SM 8.6" in out.stdout
