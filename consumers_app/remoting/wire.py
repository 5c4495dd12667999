"""What travels inside remoting frames: request/response codes, message encoding and
RocketMQ's JSON dialect.

* Codes are RocketMQ's RequestCode / ResponseCode numbers.
* A pulled message is encoded as the broker stores it (MessageDecoder, IPv4 hosts,
  properties as ``name\\x01value\\x02`` pairs).
* Bodies are fastjson's JSON: a map keyed by integers is written with bare keys
  (``{"brokerAddrs":{0:"127.0.0.1:10911"}}``), as real brokers send it and every client
  parses it; what clients send may use bare or object keys too, so reading is lenient.
"""
from __future__ import annotations

import json
import re
import socket
import struct
import zlib

# RequestCode
SEND_MESSAGE, PULL_MESSAGE, QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET = 10, 11, 14, 15
UPDATE_AND_CREATE_TOPIC, SEARCH_OFFSET_BY_TIMESTAMP, GET_MAX_OFFSET, GET_MIN_OFFSET = 17, 29, 30, 31
HEART_BEAT, UNREGISTER_CLIENT, CONSUMER_SEND_MSG_BACK = 34, 35, 36
GET_CONSUMER_LIST_BY_GROUP, NOTIFY_CONSUMER_IDS_CHANGED, LOCK_BATCH_MQ, UNLOCK_BATCH_MQ = 38, 40, 41, 42
GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO, GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 105, 106, 206
GET_TOPIC_STATS_INFO, GET_CONSUMER_CONNECTION_LIST, GET_CONSUME_STATS = 202, 203, 208
GET_CONSUMER_RUNNING_INFO = 307
SEND_MESSAGE_V2, SEND_BATCH_MESSAGE = 310, 320
LITE_PULL_MESSAGE = 361   # DefaultLitePullConsumer's pull (5.x); the broker serves it as PULL_MESSAGE
# Lab-only RequestCode, far above RocketMQ's own: a real broker answers REQUEST_CODE_NOT_SUPPORTED.
# A group's members gone lately with how each went ({"departures": [{"clientId", "reason", "ts"}]}):
# a cluster's member list cannot tell a goodbye from a closed connection or an expiry.
GET_CONSUMER_DEPARTURES = 20010

# ResponseCode
SUCCESS, SYSTEM_ERROR, SYSTEM_BUSY, REQUEST_CODE_NOT_SUPPORTED = 0, 1, 2, 3
TOPIC_NOT_EXIST, MESSAGE_ILLEGAL, PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY, PULL_OFFSET_MOVED = 17, 13, 19, 20, 21
QUERY_NOT_FOUND, SUBSCRIPTION_GROUP_NOT_EXIST, NO_PERMISSION = 22, 26, 16

# MessageSysFlag / PullSysFlag bits
COMPRESSED_FLAG = 0x1
PULL_COMMIT_OFFSET, PULL_SUSPEND, PULL_SUBSCRIPTION = 0x1, 0x2, 0x4

MESSAGE_MAGIC_CODE = -626843481   # MessageDecoder.MESSAGE_MAGIC_CODE (v1: IPv4 hosts)
PERM_READ_WRITE = 6
MASTER_ID = 0
NAME_VALUE, PROPERTY_SEP = "\x01", "\x02"
# MessageConst property names the remoting protocol carries a message's identity in.
P_TAGS, P_KEYS, P_UNIQ_KEY, P_DELAY = "TAGS", "KEYS", "UNIQ_KEY", "DELAY"
P_WAIT, P_MAX_RECONSUME = "WAIT", "MAX_RECONSUME_TIMES"
DEFAULT_PRODUCER_GROUP = "DEFAULT_PRODUCER"   # MixAll's group of a producer that names none


# ---------------------------------------------------------------- properties

def properties_to_string(props: dict) -> str:
    return "".join([f"{k}{NAME_VALUE}{v}{PROPERTY_SEP}" for k, v in props.items()])


def string_to_properties(text: str | None) -> dict:
    out = {}
    for item in (text or "").split(PROPERTY_SEP):
        name, sep, value = item.partition(NAME_VALUE)
        if sep and name:
            out[name] = value
    return out


# ---------------------------------------------------------------- messages

def ipv4(host: str) -> bytes:
    raw = _IPV4.get(host)
    if raw is None:
        try:
            raw = socket.inet_aton(host)
        except OSError:
            raw = b"\x7f\x00\x00\x01"
        if len(_IPV4) < 4096:   # hosts repeat: a pull answer names a few of them many times
            _IPV4[host] = raw
    return raw


_IPV4: dict[str, bytes] = {}
# totalSize, magic, bodyCRC, queueId, flag, queueOffset, physicalOffset, sysFlag, bornTimestamp,
# bornHost (ip, port), storeTimestamp, storeHost (ip, port), reconsumeTimes, preparedOffset, bodyLength
_MESSAGE_FIXED = struct.Struct(">iiiiiqqiq4siq4siiqi")


def encode_message(*, body: bytes, topic: str, queue_id: int, queue_offset: int, commit_log_offset: int,
                   born_ts: int, born_host: tuple[str, int], store_ts: int, store_host: tuple[str, int],
                   reconsume_times: int, properties: dict, sys_flag: int = 0, flag: int = 0) -> bytes:
    """One message as MessageDecoder.decode reads it (the store's on-disk record)."""
    return encode_record(body, topic.encode(), queue_id, queue_offset, commit_log_offset, born_ts,
                         ipv4(born_host[0]), born_host[1], store_ts, ipv4(store_host[0]), store_host[1],
                         reconsume_times, properties_to_string(properties).encode(), sys_flag, flag)


_TOPIC_LEN = [bytes([n]) for n in range(256)]   # a topic's length: one byte
_PROPS_LEN = struct.Struct(">h")


def encode_record(body: bytes, topic_raw: bytes, queue_id: int, queue_offset: int, commit_log_offset: int,
                  born_ts: int, born_ip: bytes, born_port: int, store_ts: int, store_ip: bytes, store_port: int,
                  reconsume_times: int, props_raw: bytes, sys_flag: int = 0, flag: int = 0) -> bytes:
    """``encode_message`` with its texts already bytes and its hosts already packed: a pull
    answer encodes every message it carries (the broker's hot path)."""
    size = _MESSAGE_FIXED.size + len(body) + 1 + len(topic_raw) + 2 + len(props_raw)
    return b"".join((
        _MESSAGE_FIXED.pack(size, MESSAGE_MAGIC_CODE, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag, queue_offset,
                            commit_log_offset, sys_flag, born_ts, born_ip, born_port, store_ts,
                            store_ip, store_port, reconsume_times, 0, len(body)),
        body, _TOPIC_LEN[len(topic_raw)], topic_raw, _PROPS_LEN.pack(len(props_raw)), props_raw,
    ))


def message_records(raw: bytes):
    """Each message of a pull answer's body as read off the wire, without building more:
    (the fixed fields as ``_MESSAGE_FIXED`` unpacks them, body, topic, properties), topic and
    properties as their bytes (decoded by who needs them), a compressed body (sysFlag bit 0)
    inflated."""
    raw = bytes(raw)
    unpack, fixed_size, pos, end = _MESSAGE_FIXED.unpack_from, _MESSAGE_FIXED.size, 0, len(raw)
    while pos < end:
        fixed = unpack(raw, pos)
        if fixed[1] != MESSAGE_MAGIC_CODE:
            raise ValueError(f"not a v1 message at byte {pos} (magic {fixed[1]}, size {fixed[0]})")
        at = pos + fixed_size
        body = raw[at:at + fixed[16]]
        at += fixed[16]
        topic_len = raw[at]
        topic = raw[at + 1:at + 1 + topic_len]
        at += 1 + topic_len
        props_len = int.from_bytes(raw[at:at + 2], "big", signed=True)
        props = raw[at + 2:at + 2 + props_len]
        if fixed[7] & COMPRESSED_FLAG:
            body = zlib.decompress(body)
        yield fixed, body, topic, props
        pos = at + 2 + props_len   # field by field, as MessageDecoder reads: the size field is not trusted


def decode_messages(raw: bytes) -> list[dict]:
    """A pull answer's body: the messages ``encode_message`` writes (MessageDecoder.decodes),
    each a dict; a compressed body (sysFlag bit 0) is inflated."""
    out = []
    for fixed, body, topic, props in message_records(raw):
        (_size, _magic, _crc, queue_id, flag, queue_offset, commit_log_offset, sys_flag, born_ts, born_ip, born_port,
         store_ts, store_ip, store_port, reconsume, _prepared, _body_len) = fixed
        out.append({"topic": topic.decode(), "queue_id": queue_id, "queue_offset": queue_offset, "flag": flag,
                    "commit_log_offset": commit_log_offset, "sys_flag": sys_flag, "born_ts": born_ts,
                    "born_host": f"{socket.inet_ntoa(born_ip)}:{born_port}", "store_ts": store_ts,
                    "store_host": f"{socket.inet_ntoa(store_ip)}:{store_port}", "reconsume_times": reconsume,
                    "body": body, "properties": string_to_properties(props.decode())})
    return out


_BATCH_HEAD = struct.Struct(">iiiii")   # total size, magic, body CRC, flag, body length


def encode_batch(messages) -> bytes:
    """A SEND_BATCH_MESSAGE body from (body, properties dict, flag) per message, as
    MessageDecoder.encodeMessages writes it (magic and CRC left 0: the broker computes its own)."""
    parts = []
    for body, properties, flag in messages:
        props_raw = properties_to_string(properties).encode()
        size = _BATCH_HEAD.size + len(body) + 2 + len(props_raw)
        parts += (_BATCH_HEAD.pack(size, 0, 0, flag, len(body)), body, struct.pack(">h", len(props_raw)), props_raw)
    return b"".join(parts)


def decode_batch(raw: bytes) -> list[tuple[bytes, dict, int]]:
    """The inverse of encode_batch: (body, properties, flag) per message; ValueError if malformed."""
    out, pos, view = [], 0, memoryview(raw)
    try:
        while pos < len(raw):
            size, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(view, pos)
            at = pos + _BATCH_HEAD.size
            body = bytes(view[at:at + body_len])
            (props_len,) = struct.unpack_from(">h", view, at + body_len)
            props = bytes(view[at + body_len + 2:at + body_len + 2 + props_len]).decode()
            if size <= 0 or len(body) != body_len:
                raise ValueError(f"message at byte {pos} runs past the body")
            out.append((body, string_to_properties(props), flag))
            pos += size
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None
    return out


def offset_message_id(store_host: tuple[str, int], commit_log_offset: int) -> str:
    """MessageDecoder.createMessageId: store host, port and commit-log offset in hex."""
    return (ipv4(store_host[0]) + struct.pack(">iq", store_host[1], commit_log_offset)).hex().upper()


# ---------------------------------------------------------------- JSON dialect

def dumps(value) -> bytes:
    """fastjson's output: integer-keyed maps with bare keys."""
    return _dump(value).encode()


class ObjectKey(tuple):
    """A map key that fastjson writes as a JSON object (``{{"topic":..}:{..}}``), as the
    broker keys TopicStatsTable and ConsumeStats by MessageQueue."""

    @classmethod
    def of(cls, **fields) -> "ObjectKey":
        return cls(sorted(fields.items()))


def message_queue_key(topic: str, broker: str, queue_id: int) -> ObjectKey:
    return ObjectKey.of(topic=topic, brokerName=broker, queueId=queue_id)


def _dump(value) -> str:
    if isinstance(value, dict):
        parts = []
        for k, v in value.items():
            if isinstance(k, ObjectKey):
                key = _dump(dict(k))
            else:
                key = str(k) if isinstance(k, int) and not isinstance(k, bool) else json.dumps(str(k))
            parts.append(f"{key}:{_dump(v)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(value, (list, tuple, set, frozenset)):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    return json.dumps(value)


def loads(raw: bytes | str):
    """Standard JSON, or fastjson's: bare integer keys, and objects as keys (read as
    ObjectKey). ValueError if it is neither."""
    text = raw.decode() if isinstance(raw, (bytes, bytearray)) else raw
    try:
        return json.loads(text)
    except ValueError:
        pass
    return _Lenient(text).document()


class _Lenient:
    """A small JSON reader whose object keys may be strings, bare numbers or objects."""

    _NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def document(self):
        value = self.value()
        self.space()
        if self.pos != len(self.text):
            raise ValueError(f"extra data at {self.pos}")
        return value

    def space(self):
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def value(self):
        self.space()
        if self.pos >= len(self.text):
            raise ValueError("unexpected end")
        c = self.text[self.pos]
        if c == "{":
            return self.obj()
        if c == "[":
            self.pos += 1
            out = []
            self.space()
            if self.text.startswith("]", self.pos):
                self.pos += 1
                return out
            while True:
                out.append(self.value())
                self.space()
                if self.text.startswith(",", self.pos):
                    self.pos += 1
                elif self.text.startswith("]", self.pos):
                    self.pos += 1
                    return out
                else:
                    raise ValueError(f"expected , or ] at {self.pos}")
        if c == '"':
            value, self.pos = json.decoder.scanstring(self.text, self.pos + 1)
            return value
        for word, value in (("true", True), ("false", False), ("null", None)):
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return value
        m = self._NUMBER.match(self.text, self.pos)
        if not m:
            raise ValueError(f"unexpected {c!r} at {self.pos}")
        self.pos = m.end()
        return json.loads(m.group())

    def obj(self):
        self.pos += 1
        out = {}
        self.space()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return out
        while True:
            key = self.value()
            if isinstance(key, dict):
                key = ObjectKey(sorted((k, _hashable(v)) for k, v in key.items()))
            elif not isinstance(key, str):
                key = json.dumps(key)   # a bare number key reads as its text, as JSON's would
            self.space()
            if not self.text.startswith(":", self.pos):
                raise ValueError(f"expected : at {self.pos}")
            self.pos += 1
            out[key] = self.value()
            self.space()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif self.text.startswith("}", self.pos):
                self.pos += 1
                return out
            else:
                raise ValueError(f"expected , or }} at {self.pos}")


def _hashable(value):
    if isinstance(value, dict):
        return ObjectKey(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value
