import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from humming_triton.testing import examples

from humming_triton.formats.dtypes import FloatType, IntType, parse_element_type, parse_scale_type

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_e2m1_exact_table():
    t = parse_element_type("e2m1").value_table()
    assert t.tolist() == E2M1
    assert parse_element_type("fp4") == parse_element_type("e2m1")


@pytest.mark.parametrize("name,torch_dtype", [("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_fp8_tables_match_torch(name, torch_dtype):
    t = parse_element_type(name).value_table()
    ref = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch_dtype).float()
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(t), nan)
    assert torch.equal(t[~nan], ref[~nan])


@pytest.mark.parametrize("name,torch_dtype", [("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_fp8_rounding_matches_torch(name, torch_dtype, rng):
    t = parse_element_type(name)
    # inside the finite range (beyond it torch overflows to Inf/NaN while we saturate, on purpose)
    # Values are made exact in float32: torch casts float64 -> float32 -> fp8, and that double rounding
    # differs from ours on float64 inputs just below a midpoint (see test_fp8_rounds_float64_once).
    x = (torch.randn(20000, generator=rng) * t.finite_max() / 4).clamp(-t.finite_max(), t.finite_max()).double()
    codes = t.encode(x)
    ref = x.to(torch_dtype).view(torch.uint8).to(torch.int32)
    assert torch.equal(codes, ref)


def test_fp8_rounds_float64_once():
    # |x| = 15.49999998857192 lies just below the 15/16 midpoint, so the nearest e4m3 value is 15.
    # torch (float64 -> float32 -> fp8) first rounds it to the midpoint -15.5, then ties to even: -16.
    t = parse_element_type("e4m3fn")
    x = torch.tensor([-15.49999998857192, 15.49999998857192, -15.5], dtype=torch.float64)
    assert t.value_table()[t.encode(x)].tolist() == [-15.0, 15.0, -16.0]


def test_e8m0_table():
    t = parse_element_type("e8m0")
    v = t.value_table()
    assert t.bits == 8
    for b in (0, 1, 126, 127, 128, 254):
        assert v[b].item() == 2.0 ** (b - 127)
    assert math.isnan(v[255].item())
    assert parse_scale_type("ue8m0") == t


def test_fp6_ranges():
    assert parse_element_type("e2m3").finite_max() == 7.5
    assert parse_element_type("e3m2").finite_max() == 28.0
    assert parse_element_type("e2m3").bits == 6


def test_conventions():
    e5m2 = parse_element_type("e5m2").value_table()
    assert torch.isinf(e5m2).sum() == 2 and torch.isnan(e5m2).sum() == 6
    e4m3 = parse_element_type("e4m3fn").value_table()
    assert torch.isnan(e4m3).sum() == 2 and parse_element_type("e4m3fn").finite_max() == 448
    # arbitrary ExMy: all finite by default, fn / ieee on request
    e3m3 = parse_element_type("e3m3")
    assert e3m3.bits == 7 and bool(torch.isfinite(e3m3.value_table()).all())
    assert e3m3.finite_max() == (1 + 7 / 8) * 2 ** (7 - 3)
    assert torch.isnan(parse_element_type("e3m3fn").value_table()).sum() == 2
    e5m0 = parse_element_type("e5m0")
    assert e5m0.bits == 6 and e5m0.value_table()[1].item() == 2.0 ** (1 - 15)


@pytest.mark.parametrize("bits", range(1, 9))
def test_int_tables(bits):
    s, u = IntType(bits, True), IntType(bits, False)
    assert sorted(s.value_table().tolist()) == list(range(-(1 << (bits - 1)), 1 << (bits - 1)))
    assert u.value_table().tolist() == list(range(1 << bits))


ALL_TYPES = [IntType(b, sg) for b in range(1, 9) for sg in (True, False)] + [
    parse_element_type(n) for n in ("e2m1", "e2m3", "e3m2", "e4m3fn", "e5m2", "e3m3", "e5m0", "e4m2fn", "e1m2",
                                    "e3m4", "e2m5", "e8m0", "e3m2ieee")]


@pytest.mark.parametrize("t", ALL_TYPES, ids=str)
def test_encode_decode_round_trip_and_nearest(t, rng):
    table = t.value_table()
    finite_codes = torch.nonzero(torch.isfinite(table)).flatten()
    # every finite value encodes back to a code of the same value
    assert torch.equal(t.decode(t.encode(table[finite_codes].double())), table[finite_codes])
    # encode picks a nearest representable value
    lo, hi = t.finite_min(), t.finite_max()
    x = torch.rand(5000, generator=rng, dtype=torch.float64) * (hi - lo) + lo
    got = t.decode(t.encode(x)).double()
    fin = torch.unique(table[torch.isfinite(table)].double())
    best = (x[:, None] - fin[None]).abs().min(1).values
    assert torch.allclose((got - x).abs(), best, rtol=0, atol=1e-12)


@given(st.sampled_from(["int0", "int9", "e9m1", "x4", "e4m4", "", "fp32"]))
def test_unknown_types_raise(name):
    with pytest.raises(ValueError, match="element type"):
        parse_element_type(name)


def test_bad_scale_type():
    with pytest.raises(ValueError, match="scale type"):
        parse_scale_type("int4")


@settings(max_examples=examples(30))
@given(st.integers(1, 5), st.integers(0, 4), st.booleans())
def test_arbitrary_float_names_round_trip(e, m, signed):
    if int(signed) + e + m > 8:
        return
    t = FloatType(e, m, signed=signed)
    assert parse_element_type(t.name) == t
