"""A minimal asyncio websocket client (RFC 6455) for tests and bench/.

    ws = await LiveSocket.connect("ws://127.0.0.1:8000/ws/lab/?token=T")
    frame = await ws.receive_json(timeout=10)
    await ws.close()

Written out because no client library ships with the project, and autobahn's asyncio
flavour cannot load in a process where daphne has already chosen Twisted.
`connect` raises ConnectionRefusedError when the server refuses the handshake;
`receive_*` raise WebSocketClosed(code) once the server closes.
"""
import asyncio
import base64
import hashlib
import json
import os
import struct
from urllib.parse import urlsplit

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TEXT, CLOSE, PING, PONG, CONTINUATION = 0x1, 0x8, 0x9, 0xA, 0x0


class WebSocketClosed(Exception):
    def __init__(self, code: int | None):
        super().__init__(f"websocket closed with code {code}")
        self.code = code


class LiveSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, url: str, origin: str | None = None, timeout: float = 10.0) -> "LiveSocket":
        parts = urlsplit(url)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port), timeout)
        key = base64.b64encode(os.urandom(16))
        lines = [f"GET {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
                 f"Host: {parts.netloc}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key.decode()}", "Sec-WebSocket-Version: 13"]
        if origin:
            lines.append(f"Origin: {origin}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status = head.split(b" ", 2)[1]
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        if status != b"101" or accept not in head:
            writer.close()
            raise ConnectionRefusedError(f"websocket refused: HTTP {status.decode()}")
        return cls(reader, writer)

    async def _frame(self) -> tuple[bool, int, bytes]:
        b0, b1 = await self.reader.readexactly(2)
        length = b1 & 0x7F
        if length == 126:
            length = struct.unpack("!H", await self.reader.readexactly(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", await self.reader.readexactly(8))[0]
        mask = await self.reader.readexactly(4) if b1 & 0x80 else None
        payload = await self.reader.readexactly(length)
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return bool(b0 & 0x80), b0 & 0x0F, payload

    async def receive_text(self, timeout: float = 10.0) -> str:
        async def read() -> str:
            parts = []
            while True:
                try:
                    fin, opcode, payload = await self._frame()
                except asyncio.IncompleteReadError:
                    raise WebSocketClosed(None) from None
                if opcode == CLOSE:
                    raise WebSocketClosed(struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None)
                if opcode == PING:
                    self._send(PONG, payload)
                    continue
                if opcode in (TEXT, CONTINUATION):
                    parts.append(payload)
                    if fin:
                        return b"".join(parts).decode()
        return await asyncio.wait_for(read(), timeout)

    async def receive_json(self, timeout: float = 10.0):
        return json.loads(await self.receive_text(timeout))

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)   # clients must mask every frame
        n = len(payload)
        header = bytes([0x80 | opcode]) + (
            bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n) if n < 65536
            else bytes([0x80 | 127]) + struct.pack("!Q", n))
        self.writer.write(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send_json(self, message) -> None:
        self._send(TEXT, json.dumps(message).encode())

    async def close(self) -> None:
        try:
            self._send(CLOSE, struct.pack("!H", 1000))
            await self.writer.drain()
        except ConnectionError:
            pass
        self.writer.close()
