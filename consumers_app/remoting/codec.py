"""RocketMQ's remoting frames: what one request or response looks like on the TCP stream.

A frame is ``int32 length`` (of everything after it), ``int32`` whose high byte is the
header's serialize type (0 JSON, 1 ROCKETMQ binary) and low 24 bits its length, the
header, then the body. The header carries code, language, version, opaque (matches a
response to its request), flag (bit 0 response, bit 1 oneway), remark and extFields.

We read both header kinds (Java clients can be told to send the binary one) and always
answer in JSON with every extFields value a string, as the C++ client expects.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import orjson

MAX_FRAME = 16 * 1024 * 1024   # NettySystemConfig.frameMaxLength default (16 MiB)
JSON_SERIALIZE, ROCKETMQ_SERIALIZE = 0, 1
FLAG_RESPONSE, FLAG_ONEWAY = 1, 2

LANGUAGES = ["JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP",
             "OMS", "RUST", "NODE_JS"]   # LanguageCode, by its byte in the binary header
# The release whose behaviour the lab follows, as every remoting header announces it:
# MQVersion.Version.V5_3_3.ordinal() (MQVersion.CURRENT_VERSION of rocketmq-all-5.3.3).
# A 5.3 broker refuses GET_CONSUMER_RUNNING_INFO and online offset resets to clients
# announcing less than V3_x (version 0 reads as V3_0_0_SNAPSHOT).
CURRENT_VERSION = 479
CURRENT_VERSION_DESC = "V5_3_3"    # MQVersion.getVersionDesc(CURRENT_VERSION)


class FrameError(ValueError):
    """A frame we cannot read: the connection that sent it is closed."""


@dataclass(slots=True)   # slots: a frame's fields are read on every request's path
class Command:
    code: int
    ext: dict = field(default_factory=dict)   # extFields (strings on the way out)
    body: bytes = b""
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    language: str = "JAVA"
    version: int = CURRENT_VERSION

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def text(self, name: str, default: str | None = None) -> str | None:
        """An extFields value as a string (requests may carry numbers and booleans)."""
        value = self.ext.get(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    def number(self, name: str, default: int | None = None) -> int:
        value = self.ext.get(name)
        if value is None or value == "":
            if default is None:
                raise FrameError(f"request code {self.code} lacks the header field {name!r}")
            return default
        try:
            return int(value)
        except (TypeError, ValueError):
            raise FrameError(f"header field {name!r} is not a number: {value!r}") from None


def response(request: Command, code: int = 0, remark: str | None = None, ext: dict | None = None,
             body: bytes = b"") -> Command:
    return Command(code, ext or {}, body, request.opaque, FLAG_RESPONSE, remark, version=request.version)


def encode(cmd: Command) -> bytes:
    """The frame of ``cmd`` with a JSON header: code, language, version, opaque, flag,
    serializeTypeCurrentRPC, remark (left out when null, as fastjson does) and extFields,
    every value a string. orjson writes it (UTF-8 as it is, as RemotingSerializable does):
    the header in and out was a fifth of a send's cost in the broker with the json module."""
    header = {"code": cmd.code, "language": cmd.language, "version": cmd.version, "opaque": cmd.opaque,
              "flag": cmd.flag, "serializeTypeCurrentRPC": "JSON"}
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["extFields"] = {k: v if v.__class__ is str else _text(v) for k, v in cmd.ext.items() if v is not None}
    raw = orjson.dumps(header)
    return _LENGTHS.pack(4 + len(raw) + len(cmd.body), len(raw)) + raw + cmd.body


_LENGTHS = struct.Struct(">II")


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def decode(frame: bytes) -> Command:
    """One frame without its leading length field."""
    if len(frame) < 4:
        raise FrameError("frame shorter than its header length field")
    marker = int.from_bytes(frame[:4], "big")
    kind, header_len = marker >> 24, marker & 0xFFFFFF
    if header_len > len(frame) - 4:
        raise FrameError(f"header length {header_len} exceeds the frame ({len(frame) - 4} bytes)")
    header, body = frame[4:4 + header_len], bytes(frame[4 + header_len:])
    if kind == JSON_SERIALIZE:
        cmd = _json_header(header)
    elif kind == ROCKETMQ_SERIALIZE:
        cmd = _binary_header(header)
    else:
        raise FrameError(f"unknown serialize type {kind}")
    cmd.body = body
    return cmd


def _json_header(raw: bytes) -> Command:
    try:
        h = orjson.loads(raw)   # RemotingSerializable writes UTF-8
    except orjson.JSONDecodeError as exc:
        raise FrameError(f"malformed JSON header: {exc}") from None
    if h.__class__ is not dict or h.get("code").__class__ is not int:
        raise FrameError("the JSON header is not an object with an integer code")
    ext = h.get("extFields") or {}
    if ext.__class__ is not dict:
        raise FrameError("extFields is not an object")
    # A field is converted only when it is not what a Java peer writes (every request's
    # path reads a header: the conversions were a third of decoding one).
    opaque, flag, version = h.get("opaque", 0), h.get("flag", 0), h.get("version", 0)
    language = h.get("language", "JAVA")
    try:
        return Command(h["code"], ext, b"", opaque if opaque.__class__ is int else int(opaque or 0),
                       flag if flag.__class__ is int else int(flag or 0), h.get("remark"),
                       language if language.__class__ is str and language else str(language or "JAVA"),
                       version if version.__class__ is int else int(version or 0))
    except (TypeError, ValueError) as exc:
        raise FrameError(f"bad header field: {exc}") from None


def _binary_header(raw: bytes) -> Command:
    """RocketMQSerializable: code i16, language u8, version i16, opaque i32, flag i32,
    remark (i32 length + UTF-8), extFields (i32 length + entries of i16 key length, key,
    i32 value length, value)."""
    try:
        code, lang, version, opaque, flag = struct.unpack_from(">hBhii", raw, 0)
        pos = 13
        (n,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        remark = raw[pos:pos + n].decode() if n > 0 else None
        pos += max(n, 0)
        (n,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        end = pos + max(n, 0)
        if end > len(raw):
            raise FrameError("extFields run past the header")
        ext = {}
        while pos < end:
            (kl,) = struct.unpack_from(">h", raw, pos)
            key = raw[pos + 2:pos + 2 + kl].decode()
            pos += 2 + kl
            (vl,) = struct.unpack_from(">i", raw, pos)
            ext[key] = raw[pos + 4:pos + 4 + vl].decode()
            pos += 4 + vl
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise FrameError(f"malformed binary header: {exc}") from None
    language = LANGUAGES[lang] if lang < len(LANGUAGES) else "OTHER"
    return Command(code, ext, b"", opaque, flag, remark, language, version)


def binary_header(cmd: Command) -> bytes:
    """The ROCKETMQ serialization of ``cmd``'s header (for tests and tools)."""
    remark = (cmd.remark or "").encode()
    ext = b"".join(struct.pack(">h", len(k.encode())) + k.encode() + struct.pack(">i", len(_text(v).encode()))
                   + _text(v).encode() for k, v in cmd.ext.items())
    language = LANGUAGES.index(cmd.language) if cmd.language in LANGUAGES else LANGUAGES.index("OTHER")
    return (struct.pack(">hBhii", cmd.code, language, cmd.version, cmd.opaque, cmd.flag)
            + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + ext)
