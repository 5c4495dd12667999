"""Remoting frames (consumers_app.remoting.codec) without a socket: the JSON header as a
RocketMQ peer reads it, both header kinds read back, and frames we cannot read refused."""
from __future__ import annotations

import json
import struct

import pytest

from consumers_app.remoting.codec import (FLAG_ONEWAY, FLAG_RESPONSE, Command, FrameError, binary_header,
                                          decode, encode)

pytestmark = pytest.mark.unit


def header_of(frame: bytes) -> dict:
    length, marker = struct.unpack_from(">II", frame)
    assert length == len(frame) - 4 and marker >> 24 == 0   # JSON serialize type
    return json.loads(frame[8:8 + (marker & 0xFFFFFF)].decode("utf-8"))


def test_the_json_header_has_fastjsons_fields_and_every_ext_value_a_string():
    cmd = Command(310, {"b": "TopicTest", "e": 3, "k": False, "w": True, "gone": None}, b"body", 7, FLAG_ONEWAY)
    frame = encode(cmd)
    header = header_of(frame)
    assert list(header) == ["code", "language", "version", "opaque", "flag", "serializeTypeCurrentRPC", "extFields"]
    assert header["extFields"] == {"b": "TopicTest", "e": "3", "k": "false", "w": "true"}   # null left out
    assert (header["code"], header["opaque"], header["flag"]) == (310, 7, FLAG_ONEWAY)
    assert frame.endswith(b"body")


def test_text_outside_ascii_goes_as_utf8_and_comes_back():
    cmd = Command(0, {"topic": "注文-Ü"}, b"", 9, FLAG_RESPONSE, remark="トピックがありません")
    frame = encode(cmd)
    assert "トピック".encode() in frame            # as RemotingSerializable writes it: UTF-8, not \u escapes
    back = decode(frame[4:])
    assert (back.remark, back.ext, back.opaque, back.is_response) == (cmd.remark, cmd.ext, 9, True)


def test_a_request_round_trips_through_both_header_kinds():
    cmd = Command(11, {"consumerGroup": "G", "queueId": "2"}, b"\x00\x01", 42, 0, "why", "CPP", 479)
    for frame in (encode(cmd)[4:],
                  struct.pack(">I", (1 << 24) | len(binary_header(cmd))) + binary_header(cmd) + cmd.body):
        back = decode(frame)
        assert (back.code, back.ext, back.body, back.opaque, back.remark, back.language, back.version) == \
            (11, cmd.ext, b"\x00\x01", 42, "why", "CPP", 479)


@pytest.mark.parametrize("header, why", [
    (b"{not json", "malformed JSON header"),
    (b"\xff\xfe{}", "malformed JSON header"),                  # not UTF-8
    (b'[1, 2]', "not an object with an integer code"),
    (b'{"code": "11"}', "not an object with an integer code"),
    (b'{"code": 11, "extFields": [1]}', "extFields is not an object"),
    (b'{"code": 11, "opaque": "x"}', "bad header field"),
])
def test_a_header_we_cannot_read_is_a_frame_error(header, why):
    with pytest.raises(FrameError, match=why):
        decode(struct.pack(">I", len(header)) + header)


def test_a_header_longer_than_its_frame_is_a_frame_error():
    with pytest.raises(FrameError, match="exceeds the frame"):
        decode(struct.pack(">I", 100) + b"{}")
