"""ht.save_quantized -> ht.load_quantized round trips: every reloaded layer dequantizes bit-exactly to the
layer that was saved and the logits are identical (same backend), for tiny Llama / Qwen3-MoE models built
offline; (format, scheme) pairs a format cannot carry raise ExportError naming the scheme."""
import dataclasses
import json
import os
import warnings

import pytest
import torch

import humming_triton as ht
from humming_triton.checkpoints.export import quantized_layers
from humming_triton.checkpoints.writers import exact_reciprocal

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

COMMON = dict(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
              head_dim=64, max_position_embeddings=64)


def build(kind: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(intermediate_size=256, **COMMON))
    else:
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            intermediate_size=256, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2, **COMMON))
    return model.eval()


def _representable_globals(model) -> None:
    """Nudge each NVFP4 global scale to a float32 that is an exact reciprocal (compressed-tensors stores
    1/global; ~13% of float32 values are no float32's reciprocal -- that case is tested separately)."""
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("global_scale") and buf is not None:
                flat = buf.view(-1)
                for i in range(flat.numel()):
                    g = flat[i].clone()
                    while not exact_reciprocal(g)[1]:
                        g = (g.view(torch.int32) + 1).view(torch.float32)
                    flat[i] = g


def roundtrip(kind, fmt, scheme, tmp_path, ids):
    model = build(kind)
    ht.replace_linear(model, scheme, backend="reference")
    if ht.QuantScheme.parse(scheme).scale.global_scale:
        _representable_globals(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an exact export warns about nothing
        ht.save_quantized(model, str(tmp_path), format=fmt)
    loaded = ht.load_quantized(str(tmp_path), dtype=torch.float32, backend="reference").eval()
    a, _ = quantized_layers(model)
    b, _ = quantized_layers(loaded)
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(ht.dequantize_weight(a[name]), ht.dequantize_weight(b[name])), name
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    return model, loaded


CASES = [
    ("llama", "gptq", "w4a16"), ("llama", "gptq", "w4a16-asym"), ("llama", "gptq", "w3a16"),
    ("llama", "gptq", "w8a16"), ("llama", "gptq", "w2a16"),
    ("llama", "compressed-tensors", "w4a16"), ("llama", "compressed-tensors", "w3a16"),
    ("llama", "compressed-tensors", "nvfp4"), ("llama", "compressed-tensors", "mxfp4"),
    ("llama", "compressed-tensors", "w8a8-fp8"),
    ("qwen3_moe", "compressed-tensors", "nvfp4"), ("qwen3_moe", "gptq", "w4a16-asym"),
]


@pytest.mark.parametrize("kind,fmt,scheme", CASES, ids=[f"{k}-{f}-{s}" for k, f, s in CASES])
def test_roundtrip_exact(kind, fmt, scheme, tmp_path):
    ids = torch.randint(0, COMMON["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(1))
    model, loaded = roundtrip(kind, fmt, scheme, tmp_path, ids)
    if kind == "qwen3_moe":
        assert isinstance(loaded.model.layers[0].mlp.experts, ht.QuantMoE)
    cfg = json.load(open(os.path.join(tmp_path, "config.json")))["quantization_config"]
    assert cfg["quant_method"] == fmt
    if fmt == "gptq":
        assert cfg["checkpoint_format"] == "gptq_v2" and cfg["bits"] == ht.QuantScheme.parse(scheme).bits


def test_act_order_roundtrip(tmp_path):
    """A QuantLinear carrying k_perm (as loaded from a desc_act checkpoint) is written with g_idx."""
    model = build("llama")
    ht.replace_linear(model, "w4a16-asym", backend="reference")
    name = "model.layers.0.mlp.down_proj"
    qw = model.get_submodule(name).quant_weight
    perm = torch.randperm(qw.K, generator=torch.Generator().manual_seed(3))
    model.set_submodule(name, ht.QuantLinear(dataclasses.replace(qw, k_perm=perm, cache={}), backend="reference"))
    ids = torch.randint(0, COMMON["vocab_size"], (1, 5), generator=torch.Generator().manual_seed(2))
    for fmt in ("gptq", "compressed-tensors"):
        ht.save_quantized(model, str(tmp_path / fmt), format=fmt)
        loaded = ht.load_quantized(str(tmp_path / fmt), dtype=torch.float32, backend="reference")
        a, b = quantized_layers(model)[0], quantized_layers(loaded)[0]
        assert b[name].k_perm is not None
        assert all(torch.equal(ht.dequantize_weight(a[n]), ht.dequantize_weight(b[n])) for n in a)
        with torch.no_grad():
            assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_nvfp4_global_without_exact_reciprocal_warns(tmp_path):
    x = torch.tensor(1.7e-3, dtype=torch.float32)  # mantissa > sqrt(2): where the non-reciprocals live
    while exact_reciprocal(x)[1]:
        x = (x.view(torch.int32) + 1).view(torch.float32)
    model = build("llama")
    ht.replace_linear(model, "nvfp4", backend="reference", skip=("lm_head", "mlp", "k_proj", "v_proj", "o_proj"))
    name = "model.layers.0.self_attn.q_proj"
    with torch.no_grad():
        model.get_submodule(name).weight_global_scale.fill_(float(x))
    with pytest.warns(UserWarning, match="reciprocal"):
        ht.save_quantized(model, str(tmp_path), format="compressed-tensors")
    got = ht.read_quantized_tensors(str(tmp_path))[name].global_scale
    assert abs(float(got) - float(x)) <= float(x) * 2 ** -23  # one ulp


@pytest.mark.parametrize("fmt,scheme,match", [
    ("gptq", "w1a16", "w1a16"), ("gptq", "nvfp4", "nvfp4"), ("gptq", "w8a8-int8", "activations"),
    ("compressed-tensors", "mxint4", "e8m0"), ("compressed-tensors", "w6a16-fp6", "w6a16-fp6"),
    ("compressed-tensors", "w4a4-nvfp4", "calibrated global scale"), ("compressed-tensors", "w1a16", "float zeros"),
])
def test_inexpressible_pairs_raise(fmt, scheme, match, tmp_path):
    model = build("llama")
    ht.replace_linear(model, scheme, backend="reference", skip=("lm_head", "mlp", "k_proj", "v_proj", "o_proj"))
    with pytest.raises(ht.ExportError, match=match):
        ht.save_quantized(model, str(tmp_path), format=fmt)


def test_bad_calls(tmp_path):
    model = build("llama")
    with pytest.raises(ValueError, match="no QuantLinear"):
        ht.save_quantized(model, str(tmp_path), format="gptq")
    ht.replace_linear(model, "w4a16", backend="reference", skip=("lm_head", "mlp"))
    ht.replace_linear(model, "w8a16", backend="reference", skip=("lm_head", "self_attn"))
    with pytest.raises(ht.ExportError, match="one bits/group_size"):
        ht.save_quantized(model, str(tmp_path), format="gptq")
    with pytest.raises(ValueError, match="unknown export format"):
        ht.save_quantized(model, str(tmp_path), format="awq")
    # mixed schemes are fine in compressed-tensors (one config group each)
    ht.save_quantized(model, str(tmp_path), format="compressed-tensors")
    loaded = ht.load_quantized(str(tmp_path), dtype=torch.float32, backend="reference")
    a, b = quantized_layers(model)[0], quantized_layers(loaded)[0]
    assert all(torch.equal(ht.dequantize_weight(a[n]), ht.dequantize_weight(b[n])) for n in a)
