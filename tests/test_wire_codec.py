"""The shared wire codec: openpi-compatible arrays, no pickle, and refusals that name their cause."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from robot_clients.wire_codec import WireFormatError, packb, unpackb


@pytest.mark.parametrize("dtype", ["<f4", "<f8", "<f2", "|u1", "<i2", "<i4", "<i8", "<u4", "|b1", ">f4"])
def test_arrays_round_trip_with_dtype_and_shape(dtype):
    array = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    out = unpackb(packb({"a": array}))["a"]
    assert out.dtype == np.dtype(dtype)
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out, array)


def test_non_contiguous_and_empty_arrays_round_trip():
    array = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    np.testing.assert_array_equal(unpackb(packb(array)), array)
    empty = np.zeros((0, 7), dtype=np.float32)
    assert unpackb(packb(empty)).shape == (0, 7)


def test_array_layout_is_openpis():
    """The bytes on the wire are openpi's map: openpi clients and servers read ours and we read theirs."""
    raw = msgpack.unpackb(packb(np.ones((2, 2), dtype=np.float32)))
    assert raw == {"__ndarray__": True, "data": np.ones((2, 2), np.float32).tobytes(), "dtype": "<f4", "shape": [2, 2]}


def test_keys_may_arrive_as_bytes():
    """Older packers write map keys as raw bytes; the decoder reads both spellings."""
    frame = msgpack.packb(
        {b"__ndarray__": True, b"data": np.arange(3, dtype="<i4").tobytes(), b"dtype": b"<i4", b"shape": [3]},
        use_bin_type=True,
    )
    np.testing.assert_array_equal(unpackb(frame), [0, 1, 2])


def test_numpy_scalars_round_trip():
    out = unpackb(packb({"x": np.float32(1.5), "n": np.int64(-3), "b": np.bool_(True)}))
    assert out["x"] == np.float32(1.5) and out["x"].dtype == np.float32
    assert out["n"] == -3 and out["n"].dtype == np.int64
    assert out["b"] == np.True_


def test_decoded_arrays_are_read_only_views():
    out = unpackb(packb(np.zeros(4, dtype=np.uint8)))
    assert not out.flags.writeable


def test_plain_values_round_trip():
    frame = {
        "type": "observation",
        "seq": 3,
        "prompt": "pick",
        "deadline_ms": 50.5,
        "blob": b"\x00\x01",
        "l": [1, None],
    }
    assert unpackb(packb(frame)) == frame


@pytest.mark.parametrize(
    "value",
    [
        np.array([object()], dtype=object),
        np.zeros(2, dtype=np.complex64),
        np.zeros(2, dtype="V4"),
        np.zeros(2, dtype=[("a", "<f4")]),
        np.array(["ab"]),
    ],
)
def test_encoder_refuses_disallowed_dtypes(value):
    with pytest.raises(WireFormatError, match="only bool, integer and float"):
        packb({"x": value})


def test_encoder_refuses_arbitrary_objects():
    with pytest.raises(WireFormatError, match="cannot encode"):
        packb({"x": object()})


def _array_map(dtype: str, shape: list[int], data: bytes) -> bytes:
    return msgpack.packb({"__ndarray__": True, "data": data, "dtype": dtype, "shape": shape}, use_bin_type=True)


@pytest.mark.parametrize("dtype", ["|O", "<c8", "|V8", "<U4", "<M8[s]", "not-a-dtype"])
def test_decoder_refuses_disallowed_dtypes(dtype):
    with pytest.raises(WireFormatError) as info:
        unpackb(_array_map(dtype, [1], b"\x00" * 8))
    assert info.value.field == "dtype"


def test_decoder_refuses_shape_that_does_not_match_data():
    with pytest.raises(WireFormatError, match="needs 16") as info:
        unpackb(_array_map("<f4", [2, 2], b"\x00" * 12))
    assert info.value.field == "shape"


@pytest.mark.parametrize("shape", [[-1], [1.5], "3", [True]])
def test_decoder_refuses_malformed_shapes(shape):
    with pytest.raises(WireFormatError):
        unpackb(_array_map("<f4", shape, b"\x00" * 4))


def test_decoder_refuses_non_msgpack_and_trailing_bytes():
    with pytest.raises(WireFormatError, match="not valid msgpack"):
        unpackb(b"\xc1")  # 0xc1 is never used in msgpack
    with pytest.raises(WireFormatError, match="trailing"):
        unpackb(packb({"a": 1}) + b"\x00")


def test_decoder_never_unpickles_extension_types():
    """msgpack extension types (how some codecs smuggle pickles) are refused outright."""
    frame = msgpack.packb({"x": msgpack.ExtType(1, b"cos\nsystem\n")}, use_bin_type=True)
    with pytest.raises(WireFormatError, match="extension type 1"):
        unpackb(frame)


def test_max_values_bounds_the_elements_a_frame_may_build():
    """Nested lists cost a Python object per element; ``max_values`` stops the parse past a budget, for a
    flat list (refused from its header) and for many small ones (counted as they are built)."""
    from robot_clients.wire_codec import WireLimitError

    nested = msgpack.packb({"image": [[[0, 0, 0]] * 64] * 64})  # 4096 lists of 3, 64 of 64, one map
    assert len(unpackb(nested, max_values=25_000)["image"]) == 64  # 4096 × 4 + 64 × 65 + 65 + 2 counted
    with pytest.raises(WireLimitError, match="more than 1000 elements"):
        unpackb(nested, max_values=1000)
    with pytest.raises(WireLimitError):
        unpackb(msgpack.packb(list(range(5000))), max_values=1000)
    array = np.zeros((256, 256, 3), np.uint8)  # an array is one element, whatever its size
    np.testing.assert_array_equal(unpackb(packb({"image": array}), max_values=20)["image"], array)
    assert isinstance(WireLimitError("x"), WireFormatError)  # callers that catch format errors still do


def test_the_element_count_is_read_from_the_type_bytes_before_anything_is_built():
    """``count_elements`` counts every value (keys included) exactly, refuses a container's header that
    declares past the budget at once, and a frame nested past ``max_depth``, without building anything."""
    from robot_clients.wire_codec import WireLimitError, count_elements

    frame = packb({"type": "observation", "image": np.zeros((4, 4, 3), np.uint8), "state": [0.5] * 7, "n": None})
    # 1 map + 8 keys and values + an array map of 8 (its shape a list of 3) + 7 floats
    assert count_elements(frame) == 1 + 8 + 8 + 3 + 7
    assert count_elements(msgpack.packb("x" * 70000)) == 1  # a string's bytes are one element
    # 40 million empty maps declared in 5 bytes: refused from the header, before the body is even read
    with pytest.raises(WireLimitError, match="more than 100000 elements"):
        count_elements(b"\xdd" + (40_000_000).to_bytes(4, "big") + b"\x80" * 16, max_values=100_000)
    small_arrays = b"\xdc" + (10_000).to_bytes(2, "big") + (b"\x9f" + b"\x80" * 15) * 10_000
    with pytest.raises(WireLimitError):
        count_elements(small_arrays, max_values=100_000)  # none is large; their sum is
    assert count_elements(small_arrays, max_values=200_000) == 1 + 10_000 * 16
    with pytest.raises(WireLimitError, match="more than 32 deep"):
        count_elements(b"\x91" * 33 + b"\xc0", max_depth=32)
    assert count_elements(b"\x91" * 32 + b"\xc0", max_depth=32) == 33
    with pytest.raises(WireLimitError, match="deep"):
        unpackb(b"\x81\xa1k" * 40 + b"\xc0", max_values=1000)  # maps nest too


@pytest.mark.parametrize(
    "frame",
    [
        b"\xdd\xff\xff\xff\xff\xc0",  # an array declaring more entries than the frame has bytes
        b"\xdb\xff\xff\xff\xff" + b"x" * 16,  # a string longer than the frame
        b"\x92\xc0",  # one entry short
        b"\x91\xc0\xc0",  # trailing bytes
        b"\x91\xc1",  # the never-used type byte
        b"\x81\xa1x\xd4\x00\x00",  # an extension type
    ],
)
def test_a_malformed_frame_is_a_format_error_not_a_limit(frame):
    from robot_clients.wire_codec import WireLimitError, count_elements

    with pytest.raises(WireFormatError) as raised:
        count_elements(frame, max_values=2**40)
    assert not isinstance(raised.value, WireLimitError)
    with pytest.raises(WireFormatError):
        unpackb(frame, max_values=2**40)
