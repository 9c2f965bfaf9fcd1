"""Every bad input named in the foundation issue raises a clear error."""
import pytest
import torch

import humming_triton as ht


def test_unknown_preset_and_element_type():
    with pytest.raises(ValueError, match="unknown quantization preset 'w9a16'"):
        ht.quantize_weight(torch.randn(8, 128), "w9a16")
    with pytest.raises(ValueError, match="unknown element type"):
        ht.parse_element_type("int11")


def test_group_must_divide_k():
    with pytest.raises(ValueError, match="group size 128 does not divide K=200"):
        ht.quantize_weight(torch.randn(8, 200), "w4a16")


def test_packed_shapes_must_match_logical_shape():
    qw = ht.quantize_weight(torch.randn(8, 256), "w4a16")
    with pytest.raises(ValueError, match="packed data"):
        ht.QuantWeight(qw.data[:, :-1], qw.scales, qw.scheme, (8, 256))
    with pytest.raises(ValueError, match="scales"):
        ht.QuantWeight(qw.data, qw.scales[:, :1], qw.scheme, (8, 256))
    with pytest.raises(ValueError, match="zeros"):
        ht.QuantWeight(qw.data, qw.scales, ht.QuantScheme.parse("w4a16-asym"), (8, 256))
    with pytest.raises(ValueError, match="global_scale"):
        nv = ht.quantize_weight(torch.randn(8, 256), "nvfp4")
        ht.QuantWeight(nv.data, nv.scales, nv.scheme, (8, 256))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_weights_refused(bad):
    w = torch.randn(8, 128)
    w[3, 5] = bad
    with pytest.raises(ValueError, match="NaN/Inf"):
        ht.quantize_weight(w, "w4a16")


def test_wrong_dtype_and_shape():
    with pytest.raises(TypeError, match="float tensor"):
        ht.quantize_weight(torch.randint(0, 4, (8, 128)), "w4a16")
    with pytest.raises(ValueError, match=r"\[N, K\] or \[E, N, K\]"):
        ht.quantize_weight(torch.randn(128), "w4a16")
    qw = ht.quantize_weight(torch.randn(8, 128), "w4a16")
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        ht.quant_linear(torch.randint(0, 4, (2, 128)), qw)
    with pytest.raises(ValueError, match="K=128"):
        ht.quant_linear(torch.randn(2, 100), qw)
    with pytest.raises(ValueError, match="bias"):
        ht.quant_linear(torch.randn(2, 128), qw, bias=torch.randn(7))
    with pytest.raises(TypeError, match="QuantWeight"):
        ht.quant_linear(torch.randn(2, 128), torch.randn(8, 128))


def test_wrong_device():
    qw = ht.quantize_weight(torch.randn(8, 128), "w4a16")
    with pytest.raises(ValueError, match="x is on meta but the weight is on cpu"):
        ht.quant_linear(torch.empty(2, 128, device="meta"), qw)


def test_unknown_and_unavailable_backends(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    qw = ht.quantize_weight(torch.randn(8, 128), "w4a16")
    with pytest.raises(ValueError, match="unknown backend"):
        ht.quant_linear(torch.randn(2, 128), qw, backend="magic")
    with pytest.raises(RuntimeError, match="CUDA tensors"):
        ht.quant_linear(torch.randn(2, 128), qw, backend="triton")
    # an unknown name: the error lists what is registered
    with pytest.raises(ValueError, match=r"unknown backend 'cutlas'; expected 'auto' or one of .*'cutlass'.*'triton'"):
        ht.quant_linear(torch.randn(2, 128), qw, backend="cutlas")
    with pytest.raises(RuntimeError, match="CUDA tensors"):  # registered, but its kernels need a GPU
        ht.quant_linear(torch.randn(2, 128), qw, backend="cutlass")
    with pytest.raises(RuntimeError, match="CUDA tensors"):
        ht.quant_linear(torch.randn(2, 128), qw, backend="torch")


def test_import_touches_no_cuda():
    import subprocess
    import sys
    code = ("import torch; torch.cuda.init = lambda: (_ for _ in ()).throw(RuntimeError('cuda touched'));"
            "import humming_triton, sys; assert 'triton' not in sys.modules or True; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
