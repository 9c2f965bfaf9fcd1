"""Importers against checkpoints written here with each producer's documented packing (tests/ckpt_producers.py):
the dequantized QuantWeight must equal the producer's formula (bit for bit in float32 unless stated)."""
import pytest
import torch

import humming_triton as ht
from humming_triton.checkpoints import CheckpointFormatError, read_quantized_tensors
from tests.ckpt_producers import (awq_layer, fp4_value, gptq_layer, pack_lsb_stream, pack_nibbles_low_first,
                                  pack_padded, random_e4m3, random_scales, write_checkpoint)

P = "model.layers.0.mlp.down_proj"


def _only(d):
    assert list(d) == [P], list(d)
    return d[P]


def _prefixed(t):
    return {f"{P}.{k}": v for k, v in t.items()}


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym,v2,act_order,group", [
    (True, False, False, 32), (False, False, True, 32), (False, True, False, -1), (True, True, True, 64),
    (False, True, True, 32)])
def test_gptq(tmp_path, rng, bits, sym, v2, act_order, group):
    n, k = 96, 128
    t, w = gptq_layer(rng, n, k, bits, group, sym, v2, act_order)
    qcfg = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order, "sym": sym,
            "checkpoint_format": "gptq_v2" if v2 else "gptq"}
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), qcfg)))
    assert qw.shape == (n, k)
    assert torch.equal(ht.dequantize_weight(qw), w)
    assert (qw.k_perm is not None) == act_order
    if sym:
        assert qw.scheme.zero == "none" and qw.scheme.weight.signed  # zero 2**(b-1) became signed codes
    x = torch.randn(3, k, generator=rng)
    # the reference backend: this checks the imported layout (the kernels have their own tolerance-based tests)
    torch.testing.assert_close(ht.quant_linear(x, qw, backend="reference"), x @ w.t(), rtol=1e-5, atol=1e-5)


def test_gptq_v1_all_ones_zero_means_2_pow_bits(tmp_path, rng):
    """v1 consumers add 1 to the stored zero without wrapping: stored 0xF is zero 16."""
    n, k, bits = 64, 64, 4
    q = torch.randint(0, 16, (k, n), generator=rng)
    s = random_scales(rng, (1, n))
    t = {"qweight": pack_lsb_stream(q, bits, 0), "qzeros": pack_lsb_stream(torch.full((1, n), 15), bits, 1),
         "scales": s}
    qcfg = {"quant_method": "gptq", "bits": 4, "group_size": -1}
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), qcfg)))
    assert torch.equal(ht.dequantize_weight(qw), ((q.double() - 16) * s.double()).t().float())


def test_gptq_uneven_g_idx_is_exact(tmp_path, rng):
    """A hand-made g_idx with groups of different sizes still imports exactly (one scale per column)."""
    n, k, bits = 64, 64, 4
    q = torch.randint(0, 16, (k, n), generator=rng)
    g_idx = torch.randint(0, 3, (k,), generator=rng)
    z = torch.randint(1, 16, (3, n), generator=rng)
    s = random_scales(rng, (3, n))
    t = {"qweight": pack_lsb_stream(q, bits, 0), "qzeros": pack_lsb_stream(z - 1, bits, 1), "scales": s,
         "g_idx": g_idx.to(torch.int32)}
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), {"quant_method": "gptq", "bits": 4})))
    w = (s.double()[g_idx] * (q.double() - z.double()[g_idx])).t().float()
    assert torch.equal(ht.dequantize_weight(qw), w)


@pytest.mark.parametrize("group", [32, 128])
def test_awq(tmp_path, rng, group):
    n, k = 72, 256
    t, w = awq_layer(rng, n, k, group)
    qcfg = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), qcfg)))
    assert torch.equal(ht.dequantize_weight(qw), w)


def _ct_cfg(fmt, weights, version="0.12.2", acts=None):
    return {"quant_method": "compressed-tensors", "format": fmt, "version": version, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}}


@pytest.mark.parametrize("bits,dense", [(3, True), (3, False), (4, True), (5, True), (5, False), (7, True),
                                        (8, True)])  # padded == dense for 4/8 bits
@pytest.mark.parametrize("sym", [True, False])
def test_ct_pack_quantized(tmp_path, rng, bits, sym, dense):
    n, k, g = 40, 128, 32
    half = 2 ** (bits - 1)
    q = torch.randint(-half, half, (n, k), generator=rng)
    s = random_scales(rng, (n, k // g), torch.bfloat16)
    pack = pack_lsb_stream if dense else pack_padded
    t = {"weight_packed": pack(q + half, bits, 1), "weight_scale": s,
         "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    gi = torch.arange(k) // g
    if sym:
        w = q.double() * s.double()[:, gi]
    else:
        z = torch.randint(-half, half, (n, k // g), generator=rng)
        t["weight_zero_point"] = pack(z + half, bits, 0)
        w = (q.double() - z.double()[:, gi]) * s.double()[:, gi]
    cfg = _ct_cfg("pack-quantized", {"num_bits": bits, "type": "int", "symmetric": sym, "strategy": "group",
                                     "group_size": g}, "0.12.2" if dense else "0.8.1")
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), cfg)))
    assert torch.equal(ht.dequantize_weight(qw), w.float())


def test_ct_pack_quantized_channel_actorder(tmp_path, rng):
    n, k, g, bits = 48, 96, 32, 4
    q = torch.randint(-8, 8, (n, k), generator=rng)
    s = random_scales(rng, (n, k // g), torch.float32)
    perm = torch.randperm(k, generator=rng)
    g_idx = torch.empty(k, dtype=torch.int64)
    g_idx[perm] = torch.arange(k) // g
    t = {"weight_packed": pack_lsb_stream(q + 8, bits, 1), "weight_scale": s, "weight_g_idx": g_idx.to(torch.int32),
         "weight_shape": torch.tensor([n, k], dtype=torch.int32)}
    cfg = _ct_cfg("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                     "group_size": g, "actorder": "group"})
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), cfg)))
    assert qw.k_perm is not None
    assert torch.equal(ht.dequantize_weight(qw), (q.double() * s.double()[:, g_idx]).float())


@pytest.mark.parametrize("strategy", ["tensor", "channel", "block"])
def test_ct_float_quantized_fp8(tmp_path, rng, strategy):
    n, k = 136, 200
    wq = random_e4m3(rng, (n, k))
    shape = {"tensor": (1,), "channel": (n, 1), "block": (2, 2)}[strategy]
    s = random_scales(rng, shape, torch.float32)
    t = {"weight": wq, "weight_scale": s}
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy}
    if strategy == "block":
        weights["block_structure"] = [128, 128]
        se = s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    else:
        se = s.reshape(-1, 1) if strategy == "channel" else s
    acts = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), _ct_cfg("float-quantized", weights,
                                                                                        acts=acts))))
    assert torch.equal(ht.dequantize_weight(qw), (wq.double() * se.double()).float())
    assert qw.scheme.act is not None and qw.scheme.act.per_token


@pytest.mark.parametrize("pow2_global", [True, False])
def test_ct_nvfp4(tmp_path, rng, pow2_global):
    n, k = 48, 96
    codes = torch.randint(0, 16, (n, k), generator=rng)
    s = random_e4m3(rng, (n, k // 16), positive=True, lo=0x20, hi=0x60)
    glob = torch.tensor([4.0 if pow2_global else 448 * 6 / 3.1], dtype=torch.float32)
    t = {"weight_packed": pack_nibbles_low_first(codes), "weight_scale": s, "weight_global_scale": glob}
    cfg = _ct_cfg("nvfp4-pack-quantized", {"num_bits": 4, "type": "float", "symmetric": True,
                                           "strategy": "tensor_group", "group_size": 16})
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), cfg)))
    gi = torch.arange(k) // 16
    want = ((fp4_value(codes) * s.double()[:, gi]).float() / glob).float()  # producer: divide in fp32
    got = ht.dequantize_weight(qw)
    if pow2_global:
        assert torch.equal(got, want)
    else:  # we multiply by fl(1/global): within one ulp of the division
        assert bool(((got - want).abs() <= want.abs() * 2 ** -23).all())


def test_ct_mxfp4(tmp_path, rng):
    n, k = 40, 128
    codes = torch.randint(0, 16, (n, k), generator=rng)
    e = torch.randint(115, 135, (n, k // 32), generator=rng).to(torch.uint8)
    t = {"weight_packed": pack_nibbles_low_first(codes), "weight_scale": e}
    cfg = _ct_cfg("mxfp4-pack-quantized", {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group",
                                           "group_size": 32})
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), cfg)))
    want = fp4_value(codes) * torch.pow(2.0, e.double() - 127)[:, torch.arange(k) // 32]
    assert torch.equal(ht.dequantize_weight(qw), want.float())


@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_block_deepseek(tmp_path, rng, ue8m0):
    n, k = 200, 300
    wq = random_e4m3(rng, (n, k))
    if ue8m0:
        e = torch.randint(110, 130, (2, 3), generator=rng).to(torch.uint8)
        sval = torch.pow(2.0, e.double() - 127)
        s = e.view(torch.float8_e8m0fnu) if hasattr(torch, "float8_e8m0fnu") else e
    else:
        s = random_scales(rng, (2, 3), torch.float32)
        sval = s.double()
    t = {"weight": wq, "weight_scale_inv": s}
    qcfg = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    if ue8m0:
        qcfg["scale_fmt"] = "ue8m0"
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), qcfg)))
    se = sval.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    assert torch.equal(ht.dequantize_weight(qw), (wq.double() * se).float())
    assert qw.scheme.act.group_k == 128


def test_gpt_oss_mxfp4_experts(tmp_path, rng):
    e, inter, h = 3, 64, 96
    base = "model.layers.0.mlp.experts"
    tensors, want = {}, {}
    for proj, n, k in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
        codes = torch.randint(0, 16, (e, n, k), generator=rng)
        sc = torch.randint(118, 134, (e, n, k // 32), generator=rng).to(torch.uint8)
        # producer: [E, N, K/32, 16] bytes, each byte two consecutive elements, low nibble first
        blocks = pack_nibbles_low_first(codes).reshape(e, n, k // 32, 16)
        tensors[f"{base}.{proj}_blocks"] = blocks
        tensors[f"{base}.{proj}_scales"] = sc
        tensors[f"{base}.{proj}_bias"] = torch.randn(e, n, generator=rng)
        want[proj] = (fp4_value(codes) * torch.pow(2.0, sc.double() - 127)[..., torch.arange(k) // 32]).float()
    qws = read_quantized_tensors(write_checkpoint(tmp_path, tensors, {"quant_method": "mxfp4"}))
    for proj in ("gate_up_proj", "down_proj"):
        qw = qws[f"{base}.{proj}"]
        # rows in the producer's order: gate/up stay interleaved (gate = even rows) for "swiglu_oai"
        assert torch.equal(ht.dequantize_weight(qw), want[proj])
        assert torch.equal(qw.bias, tensors[f"{base}.{proj}_bias"])


def test_modelopt_nvfp4(tmp_path, rng):
    n, k = 64, 160
    codes = torch.randint(0, 16, (n, k), generator=rng)
    s = random_e4m3(rng, (n, k // 16), positive=True, lo=0x18, hi=0x70)
    s2 = torch.tensor(0.0123, dtype=torch.float32)
    t = {"weight": pack_nibbles_low_first(codes), "weight_scale": s, "weight_scale_2": s2,
         "input_scale": torch.tensor(0.5, dtype=torch.float32)}
    qcfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), qcfg)))
    want = (fp4_value(codes) * s.double()[:, torch.arange(k) // 16]).float() * s2  # fp4*s exact, one rounding
    assert torch.equal(ht.dequantize_weight(qw), want)
    assert float(qw.input_scale) == 0.5 and qw.scheme.act.global_scale


@pytest.mark.parametrize("nbits", [4, 2])
def test_hqq(tmp_path, rng, nbits):
    n, k, g = 48, 128, 64
    rows = n * k // g
    codes = torch.randint(0, 2 ** nbits, (rows, g), generator=rng)
    planes = 8 // nbits
    step = rows // planes
    wq = torch.zeros(step, g, dtype=torch.int64)
    for i in range(planes):  # first rows in the highest bits
        wq |= codes[i * step:(i + 1) * step] << (8 - nbits * (i + 1))
    scale = random_scales(rng, (rows, 1))
    zero = (torch.rand(rows, 1, generator=rng) * (2 ** nbits - 1)).half()
    t = {"W_q": wq.to(torch.uint8), "scale": scale, "zero": zero, "shape": torch.tensor([n, k])}
    qcfg = {"quant_method": "hqq", "quant_config": {"weight_quant_params": {"nbits": nbits, "group_size": g,
                                                                           "axis": 1}}}
    qw = _only(read_quantized_tensors(write_checkpoint(tmp_path, _prefixed(t), qcfg)))
    want = ((codes.float() - zero.float()) * scale.float()).reshape(n, k)
    assert torch.equal(ht.dequantize_weight(qw), want)


# --- bad inputs ------------------------------------------------------------------------------------------------
def test_unknown_quant_method(tmp_path):
    d = write_checkpoint(tmp_path, {"x": torch.zeros(1)}, {"quant_method": "bitsandbytes_9bit"})
    with pytest.raises(CheckpointFormatError, match="unknown quant_method 'bitsandbytes_9bit'"):
        read_quantized_tensors(d)


def test_missing_tensor_is_named(tmp_path, rng):
    t, _ = gptq_layer(rng, 64, 64, 4, 32, False, False, False)
    del t["scales"]
    d = write_checkpoint(tmp_path, _prefixed(t), {"quant_method": "gptq", "bits": 4, "group_size": 32})
    with pytest.raises(CheckpointFormatError, match=r"missing tensor '.*down_proj\.scales'"):
        read_quantized_tensors(d)


def test_wrong_shape_is_named(tmp_path, rng):
    t, _ = awq_layer(rng, 64, 128, 32)
    t["scales"] = t["scales"][:, :32]
    d = write_checkpoint(tmp_path, _prefixed(t), {"quant_method": "awq", "bits": 4, "group_size": 32})
    with pytest.raises(CheckpointFormatError, match=r"down_proj\.scales must have shape \[4, 64\]"):
        read_quantized_tensors(d)


def test_not_quantized_config(tmp_path):
    d = write_checkpoint(tmp_path, {"x": torch.zeros(1)}, None)
    with pytest.raises(CheckpointFormatError, match="no quantization_config"):
        read_quantized_tensors(d)


def test_k_perm_must_be_a_permutation(rng):
    qw = ht.quantize_weight(torch.randn(16, 64, generator=rng), "weight=uint4,scale=fp16:g16,zero=int")
    import dataclasses
    with pytest.raises(ValueError, match="permutation"):
        dataclasses.replace(qw, k_perm=torch.zeros(64, dtype=torch.int64))
    with pytest.raises(ValueError, match="int64 of shape"):
        dataclasses.replace(qw, k_perm=torch.arange(32))
    perm = torch.randperm(64, generator=rng)
    pq = dataclasses.replace(qw, k_perm=perm)
    w = ht.dequantize_weight(qw)
    assert torch.equal(ht.dequantize_weight(pq)[:, perm], w)  # stored column j is logical column perm[j]
