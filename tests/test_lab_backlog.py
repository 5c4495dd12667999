"""400 connections opened at once against a real runlab (issue 21, "under load"): every one
is answered JSON 200, 429 or 503, none is reset or closed unanswered, and the 20 websockets
open through it stay open.

The flood is raw asyncio on loopback: all 400 sockets are connected first (so 400 are
waiting in the server's accept queue together, which is what a listen backlog too short
for them resets) and only then is each request written. Bounded by timeouts; nothing is
left open.
"""
import asyncio
import json
import subprocess
from collections import Counter

from .support import free_port, manage_py
from .test_lab_runlab import migrated_env, start_lab, wait_for_three
from .ws_client import LiveSocket, WebSocketClosed

READS, CHANGES, SOCKETS = 300, 100, 20


def listen_backlog(port: int) -> int:
    """The accept queue's size of the socket listening on 127.0.0.1:port (``ss``'s Send-Q
    column for a listening socket)."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    (line,) = [x for x in out.splitlines() if x.strip()]
    return int(line.split()[2])


def http_request(method: str, path: str, port: int, token: str, body: dict | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Authorization: Token {token}",
            "Connection: close", f"Content-Length: {len(data)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


def parse_answer(raw: bytes) -> tuple[int, str, object]:
    """(status, content type, JSON body or the text that is not JSON) of a whole HTTP/1.1 answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = dechunk(body)
    try:
        return status, headers.get("content-type", ""), json.loads(body)
    except ValueError:
        return status, headers.get("content-type", ""), body[:120].decode("latin-1")


def dechunk(body: bytes) -> bytes:
    out, rest = [], body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2:]
    return b"".join(out)


async def flood(port: int, token: str) -> tuple[Counter, list[str]]:
    """Connect 400 sockets, then send each its request; what came back, and what went wrong."""
    requests = [http_request("GET", "/api/state", port, token) for _ in range(READS)]
    requests += [http_request("POST", "/api/producers/rate", port, token, {"topic": "TopicTest", "rate": 100 + i})
                 for i in range(CHANGES)]
    answers: Counter = Counter()
    wrong: list[str] = []
    all_connected = asyncio.Event()
    connected = 0

    async def one(i: int, request: bytes) -> None:
        nonlocal connected
        writer = None
        try:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 60)
            finally:
                connected += 1
                if connected == len(requests):
                    all_connected.set()
            await all_connected.wait()
            writer.write(request)
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), 120)   # to EOF: Connection: close
            if not raw:
                wrong.append(f"#{i}: closed with no answer")
                return
            status, content_type, body = parse_answer(raw)
            answers[status] += 1
            if status not in (200, 201, 202, 204, 429, 503) or not content_type.startswith("application/json") \
                    or not isinstance(body, dict):
                wrong.append(f"#{i}: {status} {content_type} {body!r:.120}")
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, OSError) as exc:
            wrong.append(f"#{i}: {type(exc).__name__}: {exc}")
        finally:
            if writer is not None:
                writer.close()

    await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    return answers, wrong


async def drain(ws: LiveSocket, types: asyncio.Queue, closed: list) -> None:
    """Read a websocket's frames as a page does (their types to ``types``), noting a close."""
    try:
        while True:
            await types.put((await ws.receive_json(timeout=3600))["type"])
    except WebSocketClosed as exc:
        closed.append(exc.code)
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        closed.append(repr(exc))


async def fresh_snapshot(ws: LiveSocket, types: asyncio.Queue, closed: list) -> None:
    """Ask for a snapshot until one comes (the consumer drops the request while the
    controller is too busy to answer it, and keeps the page) or the socket closes."""
    while not closed:
        ws.send_json({"type": "snapshot"})
        try:
            while await asyncio.wait_for(types.get(), 5) != "snapshot":
                pass
            return
        except asyncio.TimeoutError:
            continue


async def run(port: int, token: str) -> tuple[Counter, list[str], list]:
    base = f"http://127.0.0.1:{port}"
    sockets = [await LiveSocket.connect(f"ws://127.0.0.1:{port}/ws/lab/?token={token}", origin=base)
               for _ in range(SOCKETS)]
    for ws in sockets:
        assert (await ws.receive_json(timeout=30))["type"] == "snapshot"
    closed: list = []
    queues = [asyncio.Queue() for _ in sockets]
    readers = [asyncio.create_task(drain(ws, q, closed)) for ws, q in zip(sockets, queues)]
    try:
        answers, wrong = await flood(port, token)
        # Still open after the flood: each gets a fresh snapshot on request.
        for ws, q in zip(sockets, queues):
            await asyncio.wait_for(fresh_snapshot(ws, q, closed), 120)
    finally:
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for ws in sockets:
            await ws.close()
    return answers, wrong, closed


def test_400_connections_at_once_are_each_answered_json_and_no_websocket_drops(tmp_path):
    env = migrated_env(tmp_path)
    token_maker = manage_py("createtoken", "flood", env=env)
    token = token_maker.communicate(timeout=60)[0].strip().splitlines()[-1]
    port = free_port()
    lab, browser = start_lab(port, env)
    try:
        wait_for_three(lab, browser, port, timeout=30, message="the scenario")
        # Room for all of them in the accept queue at once (Twisted's default is 50).
        assert listen_backlog(port) >= READS + CHANGES + SOCKETS
        answers, wrong, closed = asyncio.run(asyncio.wait_for(run(port, token), 300))
        print(dict(answers))
        assert not wrong, f"{len(wrong)} of 400 not answered as they should be: {wrong[:8]}"
        assert sum(answers.values()) == READS + CHANGES
        assert not closed, f"websockets closed during the flood: {closed}"
    finally:
        assert lab.stop() == 0, "".join(lab.lines)
