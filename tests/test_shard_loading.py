"""read_quantized_tensors(..., shard=ShardSpec(rank, size)): a rank's read of a checkpoint of every supported
format equals ``shard(<whole read>, dim, size, rank)`` tensor for tensor (the oracle), refuses the splits shard()
refuses with the layer named, reads only the rank's bytes of the packed codes where the importer says it does
(recorded at safe_open, before any copy), and the per-rank outputs of a column-parallel / row-parallel pair add up
to the unsharded layers' outputs."""
import collections

import pytest
import safetensors
import torch

import humming_triton as ht
from humming_triton.checkpoints import DEFAULT_PLAN, ShardSpec, read_quantized_tensors
from humming_triton.formats.activation import dequantize_activation, quantize_activation
from humming_triton.formats.shard import shard, split_points, split_quantum
from humming_triton.testing import assert_linear_close
from tests.ckpt_producers import (awq_layer, gptq_layer, pack_lsb_stream, pack_nibbles_low_first, pack_padded,
                                  random_e4m3, random_scales, write_checkpoint)

H, INTER = 128, 512  # up_proj [INTER, H] is column parallel, down_proj [H, INTER] row parallel
UP, DOWN = "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"
FIELDS = ("data", "scales", "zeros", "global_scale", "input_scale", "bias", "k_perm")


# --- producers of one layer's tensors {suffix: tensor}, in each producer's documented layout ------------------
def _gptq(bits, group, sym, v2, act_order):
    def make(rng, n, k):
        t, _ = gptq_layer(rng, n, k, bits, group, sym, v2, act_order)
        return {**t, "bias": torch.randn(n, generator=rng).half()}
    return {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order, "sym": sym,
            "checkpoint_format": "gptq_v2" if v2 else "gptq"}, make


def _awq(rng, n, k):
    return awq_layer(rng, n, k, 128)[0]


def _ct_cfg(fmt, weights, version="0.12.2", acts=None):
    return {"quant_method": "compressed-tensors", "format": fmt, "version": version, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}}


def _ct_pack(bits, g, sym, dense, actorder=False):
    def make(rng, n, k):
        half = 2 ** (bits - 1)
        pack = pack_lsb_stream if dense else pack_padded
        q = torch.randint(-half, half, (n, k), generator=rng)
        t = {"weight_packed": pack(q + half, bits, 1), "weight_scale": random_scales(rng, (n, k // g), torch.bfloat16),
             "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
        if not sym:
            t["weight_zero_point"] = pack(torch.randint(-half, half, (n, k // g), generator=rng) + half, bits, 0)
        if actorder:
            g_idx = torch.empty(k, dtype=torch.int32)
            g_idx[torch.randperm(k, generator=rng)] = (torch.arange(k) // g).int()
            t["weight_g_idx"] = g_idx
        return t
    w = {"num_bits": bits, "type": "int", "symmetric": sym, "strategy": "group", "group_size": g}
    if actorder:
        w["actorder"] = "group"
    return _ct_cfg("pack-quantized", w, "0.12.2" if dense else "0.8.1"), make


def _ct_fp8(strategy, acts):
    def make(rng, n, k):
        shape = {"tensor": (1,), "channel": (n, 1), "block": (-(-n // 128), -(-k // 128))}[strategy]
        t = {"weight": random_e4m3(rng, (n, k)), "weight_scale": random_scales(rng, shape, torch.float32),
             "bias": torch.randn(n, generator=rng)}
        if acts.get("dynamic") is False:
            t["input_scale"] = torch.tensor([0.02])
        return t
    w = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy}
    if strategy == "block":
        w["block_structure"] = [128, 128]
    return _ct_cfg("float-quantized", w, acts=acts), make


def _ct_int8(rng, n, k):
    return {"weight": torch.randint(-127, 128, (n, k), generator=rng).to(torch.int8),
            "weight_scale": random_scales(rng, (n, 1), torch.float32)}


def _ct_nvfp4(rng, n, k):
    return {"weight_packed": pack_nibbles_low_first(torch.randint(0, 16, (n, k), generator=rng)),
            "weight_scale": random_e4m3(rng, (n, k // 16), positive=True, lo=0x20, hi=0x60),
            "weight_global_scale": torch.tensor([4.0]), "input_global_scale": torch.tensor([2.0])}


def _ct_mxfp4(rng, n, k):
    return {"weight_packed": pack_nibbles_low_first(torch.randint(0, 16, (n, k), generator=rng)),
            "weight_scale": torch.randint(115, 135, (n, k // 32), generator=rng).to(torch.uint8)}


def _fp8_block(ue8m0):
    def make(rng, n, k):
        shape = (-(-n // 128), -(-k // 128))
        if ue8m0:
            s = torch.randint(110, 130, shape, generator=rng).to(torch.uint8)
            s = s.view(torch.float8_e8m0fnu) if hasattr(torch, "float8_e8m0fnu") else s
        else:
            s = random_scales(rng, shape, torch.float32)
        return {"weight": random_e4m3(rng, (n, k)), "weight_scale_inv": s}
    qcfg = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    return ({**qcfg, "scale_fmt": "ue8m0"} if ue8m0 else qcfg), make


def _modelopt_nvfp4(rng, n, k):
    return {"weight": pack_nibbles_low_first(torch.randint(0, 16, (n, k), generator=rng)),
            "weight_scale": random_e4m3(rng, (n, k // 16), positive=True, lo=0x18, hi=0x70),
            "weight_scale_2": torch.tensor(0.0123), "input_scale": torch.tensor(0.5)}


def _modelopt_fp8(rng, n, k):
    return {"weight": random_e4m3(rng, (n, k)), "weight_scale": torch.tensor(0.01), "input_scale": torch.tensor(0.02)}


def _hqq(rng, n, k, nbits=4, g=64):
    rows = n * k // g
    codes = torch.randint(0, 2 ** nbits, (rows, g), generator=rng)
    step = rows // (8 // nbits)
    wq = torch.zeros(step, g, dtype=torch.int64)
    for i in range(8 // nbits):  # first rows in the highest bits
        wq |= codes[i * step:(i + 1) * step] << (8 - nbits * (i + 1))
    return {"W_q": wq.to(torch.uint8), "scale": random_scales(rng, (rows, 1)),
            "zero": (torch.rand(rows, 1, generator=rng) * (2 ** nbits - 1)).half(), "shape": torch.tensor([n, k])}


TOKEN_FP8 = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
# name: (quantization_config, layer producer, codes tensor suffix, True when its windows are slice reads)
CASES = {
    "gptq4-g128-asym-v1": (*_gptq(4, 128, False, False, False), "qweight", True),
    "gptq3-g32-sym-v2": (*_gptq(3, 32, True, True, False), "qweight", True),
    "gptq8-channel-sym": (*_gptq(8, -1, True, False, False), "qweight", True),
    "gptq4-act-order": (*_gptq(4, 32, False, True, True), "qweight", True),  # K splits refused
    "awq-g128": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, _awq,
                 "qweight", True),
    "ct-int4-g128-sym": (*_ct_pack(4, 128, True, True), "weight_packed", True),
    "ct-int3-g32-asym-padded": (*_ct_pack(3, 32, False, False), "weight_packed", "n"),  # K windows read rows whole
    "ct-int4-actorder": (*_ct_pack(4, 32, True, True, actorder=True), "weight_packed", True),
    "ct-fp8-block-token": (*_ct_fp8("block", TOKEN_FP8), "weight", True),
    "ct-fp8-channel-static": (*_ct_fp8("channel", {**TOKEN_FP8, "strategy": "tensor", "dynamic": False}), "weight",
                              True),
    "ct-fp8-tensor": (*_ct_fp8("tensor", TOKEN_FP8), "weight", True),
    "ct-int8-channel": (_ct_cfg("int-quantized", {"num_bits": 8, "type": "int", "symmetric": True,
                                                  "strategy": "channel"},
                                acts={"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}),
                        _ct_int8, "weight", True),
    "ct-nvfp4-w4a4": (_ct_cfg("nvfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                       "group_size": 16},
                              acts={"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                                    "dynamic": "local"}),
                      _ct_nvfp4, "weight_packed", True),
    "ct-mxfp4": (_ct_cfg("mxfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "group",
                                                  "group_size": 32}), _ct_mxfp4, "weight_packed", True),
    "fp8-block": (*_fp8_block(False), "weight", True),
    "fp8-block-ue8m0": (*_fp8_block(True), "weight", True),
    "modelopt-nvfp4": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, _modelopt_nvfp4,
                       "weight", True),
    "modelopt-fp8": ({"quant_method": "modelopt", "quant_algo": "FP8"}, _modelopt_fp8, "weight", True),
    "hqq4-g64": ({"quant_method": "hqq", "quant_config": {"weight_quant_params": {"nbits": 4, "group_size": 64,
                                                                                 "axis": 1}}},
                 _hqq, "W_q", False),  # planar packing: read whole, cut in memory
}


def _mlp_checkpoint(path, case, rng):
    qcfg, make, *_ = CASES[case]
    tensors = {}
    for name, n, k in ((UP, INTER, H), (DOWN, H, INTER)):
        tensors.update({f"{name}.{s}": v for s, v in make(rng, n, k).items()})
    return write_checkpoint(path, tensors, qcfg)


def _same(got, want, what):
    for f in FIELDS:
        a, b = getattr(got, f), getattr(want, f)
        assert (a is None) == (b is None), (what, f)
        if a is not None:
            assert torch.equal(a, b), (what, f)
    assert got.shape == want.shape and got.scheme == want.scheme, what


def _oracle(whole, dim, size, rank):
    """shard() of the whole read, or the ValueError it raises."""
    try:
        return whole if size == 1 else shard(whole, dim, size, rank)
    except ValueError as e:
        return e


def _x_eff(x, qw):
    """The activation the layer multiplies: x after the scheme's activation quantization, if any."""
    if qw.scheme.act is None:
        return x
    return dequantize_activation(quantize_activation(x, qw.scheme, qw.input_scale)).float()


def _linear(x, qw):
    return ht.quant_linear(x, qw, backend="reference", out_dtype=torch.float32).double()


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rank_reads_equal_shard_of_whole(case, size, tmp_path, rng):
    d = _mlp_checkpoint(tmp_path, case, rng)
    whole = read_quantized_tensors(d)
    assert sorted(whole) == [DOWN, UP]
    ranks = []
    for rank in range(size):
        spec = ShardSpec(rank, size)
        want = {name: _oracle(qw, spec.dim_for(name), size, rank) for name, qw in whole.items()}
        errors = [f"{name}: {w}" for name, w in want.items() if isinstance(w, ValueError)]
        if errors:  # shard() refuses: so must the read, naming the layer
            with pytest.raises(ValueError) as e:
                read_quantized_tensors(d, shard=spec)
            assert any(str(e.value).startswith(f"cannot shard {err.split(':')[0]}") for err in errors), str(e.value)
            assert "act-order" in case or "actorder" in case, errors  # every other case splits at these sizes
            ranks = None
            break
        got = read_quantized_tensors(d, shard=spec)
        assert sorted(got) == sorted(whole)
        for name in got:
            _same(got[name], want[name], f"{case} {name} rank {rank}/{size}")
        ranks.append(got)
    if whole[DOWN].k_perm is not None and size > 1:
        assert ranks is None, "act-order down_proj must refuse a K split"
    if not ranks:
        return
    # the column-parallel up_proj: outputs concatenated; the row-parallel down_proj: partial outputs summed
    x = torch.randn(5, H, generator=rng)
    up = whole[UP]
    y = torch.cat([_linear(x, r[UP]) for r in ranks], -1)
    assert_linear_close(y, _linear(x, up), _x_eff(x, up), ht.dequantize_weight(up), torch.float32, f"{case} up")
    h = torch.randn(5, INTER, generator=rng)
    dn = whole[DOWN]
    cuts = [0, INTER] if size == 1 else split_points(dn, "k", size)
    y = sum(_linear(h[:, a:b], r[DOWN]) for r, a, b in zip(ranks, cuts, cuts[1:]))
    full = _linear(h, dn)
    if dn.scheme.act is None:
        assert_linear_close(y, full, h, ht.dequantize_weight(dn), torch.float32, f"{case} down")
    else:  # each rank quantizes its own slice of h: no further from the exact product than the layer
        exact = h.double() @ ht.dequantize_weight(dn).double().T + (0 if dn.bias is None else dn.bias.double())
        err, err_full = (y - exact).norm(), (full - exact).norm()
        assert err <= 2 * err_full + 1e-6 * exact.norm(), (case, size, float(err), float(err_full))


@pytest.mark.parametrize("case", sorted(CASES))
def test_illegal_split_names_the_layer_and_the_constraint(case, tmp_path, rng):
    d = _mlp_checkpoint(tmp_path, case, rng)
    whole = read_quantized_tensors(d)
    for name, dim in ((UP, "n"), (DOWN, "k")):
        qw = whole[name]
        plan = ((name.rsplit(".", 1)[1] + "$", dim),)
        if qw.k_perm is not None and dim == "k":
            with pytest.raises(ValueError, match=f"cannot shard {name} .*act-order .*shard along N only"):
                read_quantized_tensors(d, shard=ShardSpec(0, 2, plan))
            continue
        q = split_quantum(qw, dim)
        size = (qw.N if dim == "n" else qw.K) // q + 1  # more shards than multiples of q
        with pytest.raises(ValueError, match=f"cannot shard {name} .*cannot be split into {size} non-empty shards on "
                                             f"multiples of {q}"):
            read_quantized_tensors(d, shard=ShardSpec(0, size, plan))


class _Recording:
    """safe_open that logs the bytes of every tensor it hands out (whole or a get_slice window): what was read."""

    def __init__(self, handle, log):
        self._h, self._log = handle, log

    def keys(self):
        return self._h.keys()

    def get_tensor(self, name):
        t = self._h.get_tensor(name)
        self._log[name] += t.numel() * t.element_size()
        return t

    def get_slice(self, name):
        h, log = self._h.get_slice(name), self._log

        class Slice:
            get_shape, get_dtype = h.get_shape, h.get_dtype

            def __getitem__(self, index):
                t = h[index]
                log[name] += t.numel() * t.element_size()
                return t
        return Slice()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_rank_reads_its_share_of_the_codes(case, tmp_path, rng, monkeypatch):
    """Bytes of the packed codes handed out by safetensors per rank: 1/size of the whole read where the importer
    slices (N windows of up_proj, K windows of down_proj), all of them where it documents a whole read."""
    _, _, codes, sliced = CASES[case]
    d = _mlp_checkpoint(tmp_path, case, rng)
    real = safetensors.safe_open

    def reads(spec):
        log = collections.Counter()
        monkeypatch.setattr(safetensors, "safe_open", lambda p, framework: _Recording(real(p, framework=framework),
                                                                                      log))
        read_quantized_tensors(d, shard=spec)
        monkeypatch.setattr(safetensors, "safe_open", real)
        return log

    whole = reads(None)
    size = 4
    act_order = read_quantized_tensors(d)[DOWN].k_perm is not None
    plan = ((r"up_proj$", "n"),) if act_order else DEFAULT_PLAN  # act-order layers refuse K splits
    for rank in range(size):
        log = reads(ShardSpec(rank, size, plan))
        for name, dim in ((UP, "n"), (DOWN, "k")):
            if ShardSpec(rank, size, plan).dim_for(name) is None:
                continue
            key = f"{name}.{codes}"
            share = sliced is True or sliced == dim
            assert log[key] * (size if share else 1) == whole[key], (case, key, rank, log[key], whole[key])
        if sliced is True and plan is DEFAULT_PLAN:
            assert sum(log.values()) < 0.5 * sum(whole.values()), (case, rank, dict(log), dict(whole))


def _gpt_oss_checkpoint(path, rng, e=4, inter=128, h=128):
    base = "model.layers.0.mlp.experts"
    t = {}
    for proj, n, k in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
        t[f"{base}.{proj}_blocks"] = pack_nibbles_low_first(torch.randint(0, 16, (e, n, k), generator=rng)).reshape(
            e, n, k // 32, 16)
        t[f"{base}.{proj}_scales"] = torch.randint(118, 134, (e, n, k // 32), generator=rng).to(torch.uint8)
        t[f"{base}.{proj}_bias"] = torch.randn(e, n, generator=rng)
    return write_checkpoint(path, t, {"quant_method": "mxfp4"})


@pytest.mark.parametrize("plan,sizes", [
    (DEFAULT_PLAN, (1, 2, 3, 4)),  # expert parallel: the rank's experts of each fused [E, N, K] weight
    (((r"gate_up_proj$", "n"), (r"down_proj$", "k")), (2, 4)),  # tensor parallel inside every expert
])
def test_gpt_oss_fused_experts(plan, sizes, tmp_path, rng):
    d = _gpt_oss_checkpoint(tmp_path, rng)
    whole = read_quantized_tensors(d)
    for size in sizes:
        for rank in range(size):
            spec = ShardSpec(rank, size, plan)
            got = read_quantized_tensors(d, shard=spec)
            for name, qw in whole.items():
                dim = spec.dim_for(name)
                _same(got[name], qw if size == 1 else shard(qw, dim, size, rank), f"{name} {dim} {rank}/{size}")


def test_per_expert_layers_go_to_their_rank_unread_elsewhere(tmp_path, rng, monkeypatch):
    """Mixtral-style per-expert GPTQ layers: each rank gets (and reads) only its experts' layers, whole; the
    attention projection next to them is cut along N."""
    base = "model.layers.0.block_sparse_moe.experts"
    tensors = {}
    layers = {"model.layers.0.self_attn.q_proj": (128, 128)}
    for e in range(6):
        layers.update({f"{base}.{e}.w1": (64, 128), f"{base}.{e}.w3": (64, 128), f"{base}.{e}.w2": (128, 64)})
    for name, (n, k) in layers.items():
        t, _ = gptq_layer(rng, n, k, 4, 32, False, False, False)
        tensors.update({f"{name}.{s}": v for s, v in t.items()})
    d = write_checkpoint(tmp_path, tensors, {"quant_method": "gptq", "bits": 4, "group_size": 32})
    whole = read_quantized_tensors(d)
    real = safetensors.safe_open
    seen = []
    for rank in range(4):
        log = collections.Counter()
        monkeypatch.setattr(safetensors, "safe_open", lambda p, framework: _Recording(real(p, framework=framework),
                                                                                      log))
        got = read_quantized_tensors(d, shard=ShardSpec(rank, 4))
        mine = {e for e in range(6) if f"{base}.{e}.w1" in got}
        assert mine == set(range([0, 1, 3, 4, 6][rank], [0, 1, 3, 4, 6][rank + 1]))  # split_points' deal of 6 by 4
        assert {k.split(".")[5] for k in log if k.startswith(base)} == {str(e) for e in mine}  # others unread
        for name, qw in got.items():
            _same(qw, shard(whole[name], "n", 4, rank) if "q_proj" in name else whole[name], f"{name} rank {rank}")
        seen += [n for n in got if n.startswith(base)]
    assert sorted(seen) == sorted(n for n in whole if n.startswith(base))


def test_plan_and_spec_validation():
    spec = ShardSpec(0, 2)
    dims = {"model.layers.3.self_attn.q_proj": "n", "model.layers.3.self_attn.qkv_proj": "n",
            "model.layers.3.mlp.gate_up_proj": "n", "model.layers.3.self_attn.o_proj": "k",
            "model.layers.3.mlp.down_proj": "k", "model.layers.3.block_sparse_moe.experts.7.w2": "expert",
            "model.layers.3.mlp.experts.gate_up_proj": "expert", "model.layers.3.mlp.shared_expert.up_proj": "n",
            "model.layers.3.mlp.gate": None, "model.layers.3.block_sparse_moe.gate": None, "lm_head": None}
    assert {n: spec.dim_for(n) for n in dims} == dims
    assert ShardSpec(1, 2, {r"o_proj$": "n"}).dim_for("x.o_proj") == "n"  # a dict plan; first match wins
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\)"):
        ShardSpec(2, 2)
    with pytest.raises(ValueError, match="positive int"):
        ShardSpec(0, 0)
    with pytest.raises(ValueError, match="dim one of"):
        ShardSpec(0, 2, {r"q_proj$": "rows"})
    qw = ht.quantize_weight(torch.randn(64, 128), "w4a16")
    with pytest.raises(ValueError, match="splits x.lm_head by expert, but it is a 2-D"):
        ShardSpec(0, 2, {"lm_head": "expert"}).window("x.lm_head", qw)
    assert ShardSpec(0, 1).window("x.q_proj", qw) is None  # one rank: every layer whole
