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


def test_e2e_cpu_generate_smoke(tmp_path):
    """--generate: HF generate with a static KV cache runs (tiny model, eager; the compiled variant is skipped on
    the CPU with its reason), reports decode tokens/s vs bf16, and the quantized model's greedy tokens equal its
    dequantized twin's."""
    out = tmp_path / "e2e_gen.json"
    assert e2e.main(["--cpu", "--generate", "--schemes", "w4a16", "--new-tokens", "5", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["scheme"] for r in result["records"]] == ["bf16", "w4a16"]  # the cache-less rows stay as they were
    rows = {(r["scheme"], r["variant"]): r for r in result["generate"]}
    assert set(rows) == {(s, v) for s in ("bf16", "w4a16") for v in ("eager", "compiled")}
    for s in ("bf16", "w4a16"):
        eager = rows[s, "eager"]
        assert eager["new_tokens"] == 5 and eager["decode_tok_s"] > 0 and eager["prefill_s"] > 0
        assert eager["decode_ratio_vs_bf16"] > 0 and not any(k.endswith("error") for k in eager)
        assert "CUDA" in rows[s, "compiled"]["skipped"]
    q = rows["w4a16", "eager"]
    assert q["tokens_ok"] and q["tokens_matched"] == 5 and q["first_logits_rel_err"] < 1e-5
