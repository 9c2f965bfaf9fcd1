import pytest
from hypothesis import given
from hypothesis import strategies as st

import humming_triton as ht
from humming_triton.formats.scheme import PRESETS

REQUIRED = ["w4a16", "w4a16-asym", "w8a16", "w2a16", "w3a16", "w1a16", "mxfp4", "mxint4", "nvfp4", "w8a16-fp8",
            "w8a8-fp8", "w8a8-fp8-block", "w8a8-int8", "w4a8-fp8", "w4a8-mxfp4", "w4a4-nvfp4", "w4a4-mxfp4", "w8a8-mxfp8", "w4a8-mx"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_round_trip(name):
    s = ht.QuantScheme.parse(name)
    assert ht.QuantScheme.parse(str(s)) == s
    assert s.name == name


def test_required_presets_exist_and_mean_what_they_say():
    assert set(REQUIRED) <= set(PRESETS)
    p = {n: ht.QuantScheme.parse(n) for n in REQUIRED}
    assert str(p["w4a16"].weight) == "int4" and p["w4a16"].scale.block_k == 128 and p["w4a16"].act is None
    assert p["w4a16-asym"].zero == "int" and str(p["w4a16-asym"].weight) == "uint4"
    assert p["w8a16"].scale.granularity == "channel"
    assert str(p["mxfp4"].scale.dtype) == "e8m0" and p["mxfp4"].scale.block_k == 32
    assert p["nvfp4"].scale.global_scale and p["nvfp4"].scale.block_k == 16 and str(p["nvfp4"].scale.dtype) == "e4m3fn"
    assert p["w8a8-fp8-block"].scale.granularity == "b128x128" and p["w8a8-fp8-block"].act.group_k == 128
    assert p["w8a8-fp8"].act.per_token and p["w8a8-fp8"].act.group_k == 0
    assert str(p["w8a8-int8"].act.dtype) == "int8"
    assert str(p["w4a4-nvfp4"].act) == "e2m1/e4m3fn:g16+global"


SCALES = ["fp16:g128", "bf16:channel", "fp32:tensor", "fp32:b128x128", "e8m0:g32", "e4m3fn:g16+global", "fp16:g64"]
WEIGHTS = ["int4", "int8", "e2m1", "e4m3fn", "e5m2", "e3m3", "e2m3", "int2"]
ACTS = ["none", "e4m3fn/fp32:token", "int8/fp32:token", "e4m3fn/fp32:g128", "e2m1/e8m0:g32",
        "e2m1/e4m3fn:g16+global", "e4m3fn/fp32:tensor:static", "e4m3fn/fp32:token"]


@given(st.sampled_from(WEIGHTS), st.sampled_from(SCALES), st.sampled_from(ACTS))
def test_full_string_round_trip(w, sc, a):
    text = f"weight={w},scale={sc},zero=none,act={a}"
    s = ht.QuantScheme.parse(text)
    assert str(s) == text
    assert ht.QuantScheme.parse(str(s)) == s


def test_zero_point_schemes():
    s = ht.QuantScheme.parse("weight=uint3,scale=bf16:g64,zero=float")
    assert ht.QuantScheme.parse(str(s)) == s


@pytest.mark.parametrize("text,msg", [
    ("w5a16-nope", "unknown quantization preset"),
    ("weight=int4,scale=fp16:g0", "granularity"),
    ("weight=int4,scale=fp16", "scale spec"),
    ("weight=int4,scale=fp16:g128,zero=int", "unsigned integer"),
    ("weight=e2m1,scale=fp16:g32,zero=int", "unsigned integer"),
    ("weight=int4,scale=fp16:g128,zero=maybe", "zero point"),
    ("weight=int12,scale=fp16:g128", "element type"),
    ("weight=int4,scale=fp16:g128,act=e4m3fn", "activation spec"),
    ("weight=int4,scale=fp16:g128+global", "global scale"),
    ("weight=int4,colour=red", "bad scheme field"),
])
def test_bad_schemes_raise_clearly(text, msg):
    with pytest.raises(ValueError, match=msg):
        ht.QuantScheme.parse(text)
