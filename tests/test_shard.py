"""Tensor- and expert-parallel shards of a QuantWeight (formats/shard.py): for every preset, the concatenation of
the N-shards' outputs and the sum of the K-shards' outputs (a simulated all-reduce) equal the unsharded layer's,
unshard inverts shard exactly, and every split that would cut a packed word, a scale block or an activation group
is refused with the constraint named."""
import pytest
import torch

import humming_triton as ht
from humming_triton.formats.activation import dequantize_activation, quantize_activation
from humming_triton.formats.shard import shard, shard_range, split_points, split_quantum, unshard
from humming_triton.testing import assert_linear_close

N, K = 256, 768


def _weight(preset, rng, n=N, k=K, experts=None):
    shape = (experts, n, k) if experts else (n, k)
    w = torch.randn(*shape, generator=rng) * 0.05
    bias = torch.randn(*shape[:-1], generator=rng)
    return ht.quantize_weight(w, preset, bias=bias)


def _same(a, b):
    for name in ("data", "scales", "zeros", "global_scale", "bias", "k_perm"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert (ta is None) == (tb is None), name
        if ta is not None:
            assert torch.equal(ta, tb), name
    assert a.shape == b.shape and a.scheme == b.scheme


def _exact(x, qw):
    """x @ dequant(w)^T in float64, no activation quantization, no bias."""
    return x.double() @ ht.dequantize_weight(qw).double().T


@pytest.mark.parametrize("preset", sorted(ht.PRESETS))
def test_n_and_k_shards_reproduce_the_layer(preset, rng):
    qw = _weight(preset, rng)
    x = torch.randn(5, K, generator=rng)
    full = ht.reference_linear(x, qw, out_dtype=torch.float32).double()
    w_hat = ht.dequantize_weight(qw)
    act = qw.scheme.act is not None
    x_eff = dequantize_activation(quantize_activation(x, qw.scheme)).float() if act else x
    for parts in range(1, 9):
        for dim in ("n", "k"):
            try:
                cuts = split_points(qw, dim, parts)
            except ValueError as e:
                assert "cannot be split" in str(e) and f"multiples of {split_quantum(qw, dim)}" in str(e)
                continue
            shards = [shard_range(qw, dim, a, b) for a, b in zip(cuts, cuts[1:])]
            _same(unshard(shards, dim), qw)
            if dim == "n":
                y = torch.cat([ht.reference_linear(x, sh, out_dtype=torch.float32) for sh in shards], -1)
                assert_linear_close(y, full, x_eff, w_hat, torch.float32, f"{preset} N/{parts}")
                continue
            y = sum(ht.reference_linear(x[:, a:b], sh, out_dtype=torch.float32).double()
                    for sh, (a, b) in zip(shards, zip(cuts, cuts[1:])))
            if not act:
                assert_linear_close(y, full, x, w_hat, torch.float32, f"{preset} K/{parts}")
            else:  # each rank quantizes its own slice of x: no further from the exact product than the layer
                exact = _exact(x, qw) + qw.bias.double()
                err, err_full = (y - exact).norm(), (full - exact).norm()
                assert err <= 2 * err_full + 1e-6 * exact.norm(), (preset, parts, float(err), float(err_full))


def test_illegal_splits_name_the_constraint(rng):
    g128 = _weight("w4a16", rng)
    with pytest.raises(ValueError, match="multiple of 128"):
        shard_range(g128, "k", 0, 64)
    three = _weight("weight=uint3,scale=fp16:channel,zero=int", rng)  # per-row scales: only the words constrain K
    assert split_quantum(three, "k") == 32
    with pytest.raises(ValueError, match="multiple of 32"):
        shard_range(three, "k", 0, 48)  # 48 codes of 3 bits end inside a word
    six = _weight("weight=e3m2,scale=fp16:channel", rng)
    assert split_quantum(six, "k") == 16
    blk = _weight("w8a8-fp8-block", rng)
    with pytest.raises(ValueError, match="multiple of 128"):
        shard_range(blk, "n", 0, 100)
    assert split_quantum(blk, "k") == 128
    with pytest.raises(ValueError, match="cannot be split into 3"):
        split_points(blk, "n", 3)  # 256 rows in blocks of 128
    with pytest.raises(ValueError, match="one of"):
        shard(g128, "m", 2, 0)
    with pytest.raises(ValueError, match="index 2"):
        shard(g128, "n", 2, 2)
    with pytest.raises(ValueError, match="non-empty range"):
        shard_range(g128, "n", 10, 10)
    with pytest.raises(ValueError, match="3-D"):
        split_quantum(g128, "expert")


def test_act_order_shards_along_n_only(rng):
    qw = _weight("w4a16", rng)
    qw = ht.QuantWeight(qw.data, qw.scales, qw.scheme, qw.shape, bias=qw.bias,
                        k_perm=torch.randperm(K, generator=rng))
    x = torch.randn(3, K, generator=rng)
    full = ht.reference_linear(x, qw, out_dtype=torch.float32)
    y = torch.cat([ht.reference_linear(x, shard(qw, "n", 4, i), out_dtype=torch.float32) for i in range(4)], -1)
    assert_linear_close(y, full.double(), x, ht.dequantize_weight(qw), torch.float32, "act-order N/4")
    with pytest.raises(ValueError, match="shard along N only"):
        shard(qw, "k", 2, 0)


@pytest.mark.parametrize("preset", ["w4a16", "nvfp4", "w4a16-asym", "w8a8-fp8"])
def test_expert_and_tp_inside_experts(preset, rng):
    qw = _weight(preset, rng, n=128, k=256, experts=6)
    eps = [shard(qw, "expert", 3, i) for i in range(3)]
    _same(unshard(eps, "expert"), qw)
    for i, ep in enumerate(eps):
        for e in range(ep.num_experts):
            _same(ep.expert(e), qw.expert(2 * i + e))
    # TP inside the experts: N shards of every expert at once, against the grouped reference
    counts = [2, 0, 3, 1, 0, 4]
    x = torch.randn(sum(counts), 256, generator=rng)
    offsets = torch.tensor([0] + torch.cumsum(torch.tensor(counts), 0).tolist())
    full = ht.reference_grouped_linear(x, qw, offsets, out_dtype=torch.float32)
    y = torch.cat([ht.reference_grouped_linear(x, shard(qw, "n", 2, i), offsets, out_dtype=torch.float32)
                   for i in range(2)], -1)
    assert torch.allclose(y, full, rtol=1e-5, atol=1e-5)
    _same(unshard([shard(qw, "n", 2, i) for i in range(2)], "n"), qw)


@pytest.mark.parametrize("preset", ["w4a16", "nvfp4"])
def test_tp_script_on_two_cpu_ranks(preset, tmp_path):
    """scripts/tp_check.py with real collectives (gloo, two processes): the column / row parallel MLP pair and the
    expert-parallel grouped GEMM equal the unsharded computation."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.fail("torchrun is not on PATH (it comes with torch)")
    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(root / "scripts/tp_check.py"),
                        "--scheme", preset, "--hidden", "256", "--inter", "512", "--moe-n", "128", "--moe-k", "256",
                        "--tokens", "5", "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=240, cwd=root)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads((tmp_path / "tp.json").read_text())
    assert out["world"] == 2 and out["mlp"]["rel_err_vs_one_gpu"] < out["tolerance"]
    assert out["moe_ep"]["rel_err_vs_one_gpu"] < out["tolerance"]
