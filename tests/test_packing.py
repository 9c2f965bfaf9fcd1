import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from humming_triton.testing import examples

from humming_triton.formats.packing import pack_codes, packed_words, unpack_codes


@settings(max_examples=examples(200))
@given(bits=st.integers(1, 8), k=st.integers(1, 200), rows=st.integers(1, 4), data=st.data())
def test_pack_unpack_round_trip(bits, k, rows, data):
    vals = data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=rows * k, max_size=rows * k))
    codes = torch.tensor(vals, dtype=torch.int32).reshape(rows, k)
    words = pack_codes(codes, bits)
    assert words.dtype == torch.int32 and words.shape == (rows, packed_words(k, bits))
    assert torch.equal(unpack_codes(words, bits, k), codes)


@pytest.mark.parametrize("bits", range(1, 9))
def test_bit_stream_order(bits):
    """Element k sits at stream bits [k*bits, (k+1)*bits), LSB first, crossing words for 3/5/6/7 bits."""
    k = 70
    codes = torch.randint(0, 1 << bits, (k,))
    words = pack_codes(codes, bits).to(torch.int64) & 0xFFFFFFFF
    stream = 0
    for i, w in enumerate(words.tolist()):
        stream |= w << (32 * i)
    for j in range(k):
        assert (stream >> (j * bits)) & ((1 << bits) - 1) == int(codes[j])
    assert stream >> (k * bits) == 0  # padding bits are zero


def test_known_words():
    assert pack_codes(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]), 4).item() & 0xFFFFFFFF == 0x87654321
    assert pack_codes(torch.tensor([[0xAB, 0xCD, 0xEF, 0x01]]), 8).item() & 0xFFFFFFFF == 0x01EFCDAB


def test_3d_and_errors():
    codes = torch.randint(0, 8, (2, 3, 40))
    assert torch.equal(unpack_codes(pack_codes(codes, 3), 3, 40), codes.int())
    with pytest.raises(ValueError, match="out of range"):
        pack_codes(torch.tensor([16]), 4)
    with pytest.raises(TypeError, match="integer"):
        pack_codes(torch.tensor([1.0]), 4)
    with pytest.raises(ValueError, match="words"):
        unpack_codes(torch.zeros(2, 3, dtype=torch.int32), 4, 40)
