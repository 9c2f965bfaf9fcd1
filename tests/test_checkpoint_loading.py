"""ht.load_quantized end to end: a tiny HF model's layers written as a quantized checkpoint (producer packing
from tests/ckpt_producers.py), loaded back into QuantLinear / QuantMoE; logits must match the float model
holding the producer-dequantized weights."""
import pytest
import torch
from torch import nn

import humming_triton as ht
from tests.ckpt_producers import gptq_layer, pack_nibbles_low_first, random_e4m3, write_checkpoint

transformers = pytest.importorskip("transformers")


def _tiny(kind):
    common = dict(vocab_size=64, hidden_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=64, tie_word_embeddings=False)
    if kind == "llama":
        return transformers.LlamaConfig(intermediate_size=256, **common)
    return transformers.Qwen3MoeConfig(intermediate_size=256, moe_intermediate_size=64, num_experts=4,
                                       num_experts_per_tok=2, **common)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def test_load_gptq_llama_with_act_order(tmp_path, rng):
    cfg = _tiny("llama")
    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    tensors, qcfg = {}, {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False}
    linears = [n for n, m in ref.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    for name, m in ref.named_modules():
        if name in linears:
            t, w = gptq_layer(rng, m.out_features, m.in_features, 4, 32, False, False, True)
            tensors.update({f"{name}.{k}": v for k, v in t.items()})
            with torch.no_grad():
                m.weight.copy_(w)
    for k, v in ref.state_dict().items():
        if k.rsplit(".", 1)[0] not in linears:
            tensors[k] = v.clone()
    d = write_checkpoint(tmp_path, tensors, qcfg, cfg.to_dict())
    model = ht.load_quantized(d, dtype=torch.float32, backend="reference")
    replaced = [n for n, m in model.named_modules() if isinstance(m, ht.QuantLinear)]
    assert len(replaced) == 7, replaced
    ids = torch.randint(0, 64, (2, 5), generator=rng)
    torch.testing.assert_close(_logits(model, ids), _logits(ref, ids), rtol=1e-4, atol=1e-4)


def test_load_modelopt_nvfp4_qwen3_moe_fuses_experts(tmp_path, rng):
    """Per-expert NVFP4 layers (each with its own weight_scale_2) become one fused QuantMoE per layer."""
    cfg = _tiny("qwen3moe")
    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    tensors = {}
    fp4 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)

    def nvfp4(name, n, k, s2):
        codes = torch.randint(0, 16, (n, k), generator=rng)
        s = random_e4m3(rng, (n, k // 16), positive=True, lo=0x28, hi=0x48)
        tensors.update({f"{name}.weight": pack_nibbles_low_first(codes), f"{name}.weight_scale": s,
                        f"{name}.weight_scale_2": torch.tensor(s2, dtype=torch.float32)})
        return (fp4[codes] * s.double().repeat_interleave(16, 1)).float() * torch.tensor(s2, dtype=torch.float32)

    experts = ref.model.layers[0].mlp.experts
    inter = cfg.moe_intermediate_size
    with torch.no_grad():
        for e in range(cfg.num_experts):
            base = f"model.layers.0.mlp.experts.{e}"
            # gate and up shards differ by a power of two: folding them into one global scale stays exact
            g = nvfp4(f"{base}.gate_proj", inter, 128, 0.01)
            u = nvfp4(f"{base}.up_proj", inter, 128, 0.005)
            experts.gate_up_proj[e] = torch.cat([g, u])
            experts.down_proj[e] = nvfp4(f"{base}.down_proj", 128, inter, 0.02)
    for k, v in ref.state_dict().items():
        if ".experts." not in k:
            tensors[k] = v.clone()
    qcfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    model = ht.load_quantized(write_checkpoint(tmp_path, tensors, qcfg, cfg.to_dict()), dtype=torch.float32,
                               backend="reference")
    moe = model.model.layers[0].mlp.experts
    assert isinstance(moe, ht.QuantMoE)
    assert torch.equal(ht.dequantize_weight(moe.gate_up_weight), experts.gate_up_proj.detach())
    ids = torch.randint(0, 64, (2, 6), generator=rng)
    torch.testing.assert_close(_logits(model, ids), _logits(ref, ids), rtol=1e-4, atol=1e-4)
