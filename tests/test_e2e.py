import json

import pytest

from benchmarks import e2e


@pytest.mark.parametrize("model", ["llama", "qwen3_moe"])
def test_e2e_cpu_smoke(tmp_path, model):
    """The tokens/s script runs end to end (tiny model, reference backend) and its quantized model matches the
    dequantized-weight twin (for the MoE model: QuantMoE experts too)."""
    out = tmp_path / "e2e.json"
    assert e2e.main(["--cpu", "--model", model, "--schemes", "w4a16,mxfp4", "--out", str(out)]) == 0
    recs = json.loads(out.read_text())["records"]
    assert [r["scheme"] for r in recs] == ["bf16", "w4a16", "mxfp4"]
    for r in recs:
        assert r["eager_s"] > 0 and not any(k.endswith("error") for k in r)
    for r in recs[1:]:
        assert r["rel_err_vs_dequantized"] < 1e-5  # fp32 on CPU: the same math up to summation order
