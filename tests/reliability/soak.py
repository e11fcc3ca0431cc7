#!/usr/bin/python3
"""Soak test of a running `troupe serve`: mixed load for a bounded time, then checks.

Run with Debian's /usr/bin/python3 (python3-websockets 10.4; the rest is the standard
library). soak_test.sh starts the server and runs this; by hand:
    /usr/bin/python3 tests/reliability/soak.py --url http://127.0.0.1:8000 --pid PID \
        --seconds 1200 --csv /tmp/soak.csv [--api-key KEY]

1. Solo: the greedy output (temperature 0, --max-tokens) of each of a few completion
   prompts and chat conversations, one request at a time.
2. Load, --seconds long, --workers at once, each picking one of:
   streaming and non-streaming /v1/completions and /v1/chat/completions (sampled, n=2
   too); greedy requests of the solo prompts over HTTP (streaming or not) and over the
   WebSocket, whose text and finish reason must equal the solo ones exactly; WebSocket
   sessions of several generates, some cancelled, some sockets dropped mid-stream, a
   malformed frame and bad generates (must get error frames); HTTP clients that drop
   the connection mid-stream, before the response, or mid-body; bad requests that must
   get their 4xx (malformed JSON, wrong types, a prompt too long, n out of range, an
   unknown route, a wrong method, no API key, a body over the limit); a few plain GETs.
3. Every --interval seconds a sample: the server's RSS, descriptors and threads
   (/proc/PID), and from /metrics the KV usage, running and waiting requests, and
   (when the server has them) open connections, requests in flight and live actors.
   Written to --csv and printed as a table.
4. After the load stops and the server has drained (up to --drain seconds), the checks:
   KV usage, running, waiting and requests in flight 0; descriptors within --fd-slack
   of the start; threads and live actors equal to the start; RSS flat after warm-up
   (below); no greedy mismatch; no 5xx; no unexpected error (a wrong status, a stall
   past --request-timeout, an error frame for a good request, ...); every kind of
   traffic ran at least once.

RSS criterion: warm-up is the first max(10 s, 20 %) of the load. The reference is the
highest RSS sampled during warm-up; every RSS sampled in the second half of the load
must stay below reference + max(--rss-slack-mib MiB, --rss-slack-frac of reference).
The least-squares slope after warm-up is printed too (MiB per minute), not checked.
The start values (descriptors, threads, actors) are taken idle, after the solo phase
and one WebSocket and one streaming request, so lazily created threads count as start.
Exit 0 when every check passes, 1 otherwise.
"""
import argparse
import asyncio
import collections
import csv
import json
import os
import random
import socket
import struct
import sys
import time
from urllib.parse import urlparse

import websockets

COMPLETION_PROMPTS = [
    "Once upon a time",
    "Lily and Ben",
    "The cat sat on the mat and",
    "One day, a little girl named Sue",
    "Tom had a big red ball.",
    "The sun was hot, so the dog",
    "Mom said, \"Let's go to the park!\"",
    "In a small house near the woods there lived",
]
CHAT_CONVERSATIONS = [
    [{"role": "user", "content": "Tell me about a frog."}],
    [{"role": "user", "content": "Hi! Who are you?"}],
]
WORDS = ("the a little big happy sad dog cat girl boy ran saw played ball tree park sun "
         "mom dad friend said one day jumped red blue box toy fun and with to").split()


def random_text(rng: random.Random, lo: int = 2, hi: int = 20) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


class Unexpected(Exception):
    """Something the server should not have done: counted and reported."""


def loads(body: bytes, what: str):
    """JSON from the server, which must be UTF-8 (RFC 8259) with no exception."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Unexpected(f"{what}: the server sent invalid UTF-8: "
                         f"{body[max(0, e.start - 40):e.end + 10]!r}") from e
    return json.loads(text)


# --------------------------------------------------------------------------- HTTP/1.1
class Conn:
    """One HTTP/1.1 connection (keep-alive; Content-Length and chunked bodies)."""

    def __init__(self, host: str, port: int, registry: set):
        self.host, self.port = host, port
        self.registry = registry  # the open connections of one worker: none outlives its operation
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = 0

    async def open(self) -> "Conn":
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        self.registry.add(self)
        return self

    async def send(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
                   content_length: int | None = None) -> None:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        await self.writer.drain()
        self.used += 1

    async def head(self) -> tuple[int, dict[str, str]]:
        line = await self.reader.readline()
        if not line:
            raise EOFError("the server closed the connection before answering")
        parts = line.split()
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise Unexpected(f"not an HTTP status line: {line[:80]!r}")
        status = int(parts[1])
        headers = {}
        while True:
            h = await self.reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers

    async def chunks(self, headers: dict[str, str]):
        """The body, piece by piece (chunked or Content-Length)."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await self.reader.readline()
                if not size_line:
                    raise Unexpected("the chunked body ended without its last chunk")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                data = await self.reader.readexactly(size)
                await self.reader.readexactly(2)
                yield data
        else:
            n = int(headers.get("content-length", "0"))
            if n:
                yield await self.reader.readexactly(n)

    async def body(self, headers: dict[str, str]) -> bytes:
        out = bytearray()
        async for c in self.chunks(headers):
            out += c
        return bytes(out)

    def abort(self, rst: bool) -> None:
        """Drops the connection at once: a reset (SO_LINGER 0) or a plain close."""
        if self.writer is None:
            return
        if rst:
            sock = self.writer.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
        self.writer.transport.abort()
        self.writer = None
        self.registry.discard(self)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.registry.discard(self)


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        # Unlabelled but for model_name (every troupe_ series has it).
        name, _, labels = series.partition("{")
        if labels and (not labels.startswith("model_name=") or labels.count('="') != 1):
            continue
        try:
            values[name] = float(value.split()[0])
        except (ValueError, IndexError):
            pass
    return values


# --------------------------------------------------------------------------- the soak
class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        u = urlparse(args.url)
        self.host, self.port = u.hostname, u.port
        self.ws_url = f"ws://{self.host}:{self.port}/v1/ws"
        self.auth = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        self.solo: dict[tuple[str, int], tuple[str, str]] = {}  # (kind, index) -> (text, finish)
        self.done = collections.Counter()     # kind -> operations completed as expected
        self.checked = collections.Counter()  # greedy outputs compared
        self.statuses = collections.Counter()
        self.mismatches: list[str] = []
        self.errors: list[str] = []
        self.num_errors = 0
        self.samples: list[dict] = []
        self.t0 = time.monotonic()
        self.load_start = self.load_end = None
        self.stop = False

    # ---- bookkeeping
    def error(self, kind: str, message: str) -> None:
        self.num_errors += 1
        if len(self.errors) < 50:
            self.errors.append(f"[{time.monotonic() - self.t0:7.1f}s] {kind}: {message}")
            print(f"  unexpected: {self.errors[-1]}", flush=True)

    def status(self, code: int) -> None:
        self.statuses[code] += 1

    def compare(self, kind: str, key: tuple[str, int], text: str, finish: str) -> None:
        self.checked[kind] += 1
        want = self.solo[key]
        if (text, finish) != want:
            if len(self.mismatches) < 20:
                self.mismatches.append(f"{kind} {key}: got {(text, finish)!r}, solo {want!r}")
            else:
                self.mismatches.append("...")

    # ---- HTTP helpers
    async def fresh(self, w: dict) -> Conn:
        return await Conn(self.host, self.port, w.setdefault("open", set())).open()

    async def request(self, w: dict, method: str, path: str, payload=None, *, raw: bytes | None = None,
                      auth: bool = True):
        """Sends one request on the worker's keep-alive connection (a fresh one when it has
        none, or when a reused one turns out closed before any answer). Returns
        (conn, status, headers); the caller reads the body."""
        headers = dict(self.auth) if auth else {}
        body = raw
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        for attempt in range(2):
            conn = w.get("conn")
            reused = conn is not None
            if conn is None:
                conn = await self.fresh(w)
            w["conn"] = None
            try:
                await conn.send(method, path, body, headers)
                status, h = await conn.head()
            except (EOFError, ConnectionResetError, BrokenPipeError) as e:
                conn.abort(rst=False)
                if reused and attempt == 0:
                    self.done["stale_keepalive_retry"] += 1
                    continue
                raise Unexpected(f"{method} {path}: {e!r}") from e
            self.status(status)
            return conn, status, h
        raise AssertionError("unreachable")

    def release(self, w: dict, conn: Conn, headers: dict[str, str], rng: random.Random) -> None:
        """Keeps the connection for the next request, or closes it (now and then, or when
        the server said so)."""
        if headers.get("connection", "").lower() == "close" or rng.random() < 0.3:
            conn.close()
        else:
            w["conn"] = conn

    async def json_call(self, w, rng, path, payload, want=200):
        conn, status, h = await self.request(w, "POST", path, payload)
        body = await conn.body(h)
        self.release(w, conn, h, rng)
        if status != want:
            raise Unexpected(f"POST {path}: status {status} (want {want}): {body[:300]!r}")
        return loads(body, f"POST {path}")

    async def sse_call(self, w, rng, path, payload, chat: bool, abort_after: int | None = None):
        """A streaming request; returns (texts by choice, finish reasons by choice), or None
        when it dropped the connection after abort_after events."""
        conn, status, h = await self.request(w, "POST", path, payload)
        if status != 200:
            body = await conn.body(h)
            conn.close()
            raise Unexpected(f"POST {path} stream: status {status}: {body[:300]!r}")
        if "text/event-stream" not in h.get("content-type", ""):
            conn.close()
            raise Unexpected(f"POST {path} stream: content-type {h.get('content-type')!r}")
        texts, finishes = collections.defaultdict(str), {}
        buffer, events, saw_done = b"", 0, False
        async for chunk in conn.chunks(h):
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    raise Unexpected(f"an SSE event that is not data: {event[:100]!r}")
                data = event[6:]
                if data == b"[DONE]":
                    saw_done = True
                    continue
                obj = loads(data, f"POST {path} stream")
                if "error" in obj:
                    raise Unexpected(f"an error in the stream: {obj['error']}")
                for c in obj.get("choices", []):
                    piece = c.get("delta", {}).get("content") if chat else c.get("text")
                    texts[c["index"]] += piece or ""
                    if c.get("finish_reason"):
                        finishes[c["index"]] = c["finish_reason"]
                events += 1
                if abort_after is not None and events >= abort_after:
                    conn.abort(rst=rng.random() < 0.5)
                    return None
        if not saw_done:
            raise Unexpected(f"POST {path} stream ended without data: [DONE]")
        self.release(w, conn, h, rng)
        return texts, finishes

    # ---- the kinds of traffic
    def sampled(self, rng: random.Random, chat: bool) -> dict:
        payload = {"max_tokens": rng.randint(1, self.args.max_tokens), "temperature": 0.9,
                   "top_p": rng.choice([1.0, 0.9]), "seed": rng.randint(0, 1 << 30)}
        if chat:
            # short: with the chat template, 8 words are at most ~75 of stories260K's 128
            # tokens, which leaves room for --max-tokens 48
            payload["messages"] = [{"role": "user", "content": random_text(rng, 1, 8)}]
        else:
            payload["prompt"] = random_text(rng)
        return payload

    def greedy(self, key: tuple[str, int]) -> dict:
        kind, i = key
        payload = {"max_tokens": self.args.max_tokens, "temperature": 0}
        if kind == "chat":
            payload["messages"] = CHAT_CONVERSATIONS[i]
        else:
            payload["prompt"] = COMPLETION_PROMPTS[i]
        return payload

    def random_key(self, rng: random.Random) -> tuple[str, int]:
        if rng.random() < 0.25:
            return ("chat", rng.randrange(len(CHAT_CONVERSATIONS)))
        return ("completion", rng.randrange(len(COMPLETION_PROMPTS)))

    async def op_sampled(self, w, rng):
        chat = rng.random() < 0.4
        path = "/v1/chat/completions" if chat else "/v1/completions"
        payload = self.sampled(rng, chat)
        if rng.random() < 0.5:
            payload["stream"] = True
            if rng.random() < 0.5:
                payload["stream_options"] = {"include_usage": True}
            await self.sse_call(w, rng, path, payload, chat)
            return "sampled_stream_chat" if chat else "sampled_stream"
        if rng.random() < 0.2:
            payload["n"] = 2
        r = await self.json_call(w, rng, path, payload)
        if len(r["choices"]) != payload.get("n", 1):
            raise Unexpected(f"{len(r['choices'])} choices for n={payload.get('n', 1)}")
        if r["usage"]["completion_tokens"] > payload["max_tokens"] * payload.get("n", 1):
            raise Unexpected(f"more tokens than max_tokens: {r['usage']}")
        return ("sampled_chat" if chat else "sampled") + ("_n2" if "n" in payload else "")

    async def op_greedy_http(self, w, rng):
        key = self.random_key(rng)
        chat = key[0] == "chat"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        payload = self.greedy(key)
        if rng.random() < 0.5:
            payload["stream"] = True
            texts, finishes = await self.sse_call(w, rng, path, payload, chat)
            self.compare("greedy_http_stream", key, texts[0], finishes.get(0, ""))
            return "greedy_http_stream"
        r = await self.json_call(w, rng, path, payload)
        c = r["choices"][0]
        self.compare("greedy_http", key, c["message"]["content"] if chat else c["text"],
                     c["finish_reason"])
        return "greedy_http"

    async def op_websocket(self, w, rng):
        """One socket, 2-5 generates (greedy solo ones among them), maybe a cancel, maybe
        a malformed frame or a bad generate, maybe dropped mid-stream."""
        ws = await websockets.connect(self.ws_url, extra_headers=self.auth, max_size=1 << 24,
                                      ping_interval=None, close_timeout=2)
        dropped = False
        try:
            expected = {}  # id -> ("greedy", key) | ("sampled", None) | ("bad", code)
            for j in range(rng.randint(2, 5)):
                rid = f"w{j}"
                if rng.random() < 0.5:
                    key = self.random_key(rng)
                    expected[rid] = ("greedy", key)
                    command = self.greedy(key)
                else:
                    expected[rid] = ("sampled", None)
                    command = self.sampled(rng, chat=rng.random() < 0.3)
                    command["max_tokens"] = self.args.max_tokens  # long enough to cancel
                    command["ignore_eos"] = True
                command.update({"type": "generate", "id": rid})
                await ws.send(json.dumps(command))
            if rng.random() < 0.2:
                await ws.send("{this is not json")
                expected[""] = ("bad", 400)
            if rng.random() < 0.2:
                expected["bad"] = ("bad", 400)
                await ws.send(json.dumps({"type": "generate", "id": "bad", "prompt": "x", "top_p": 2}))
            sampled = [k for k, v in expected.items() if v[0] == "sampled"]
            cancel = rng.choice(sampled) if sampled and rng.random() < 0.5 else None
            drop_after = rng.randint(1, 40) if rng.random() < 0.2 else None
            texts, finals, frames = collections.defaultdict(str), {}, 0
            while len(finals) < len(expected):
                frame = json.loads(await ws.recv())
                frames += 1
                rid = frame.get("id")
                if rid not in expected:
                    raise Unexpected(f"websocket: a frame for an unknown id: {frame}")
                if frame["type"] == "error":
                    code = frame["error"].get("code")
                    if expected[rid] != ("bad", code):
                        raise Unexpected(f"websocket: an error frame for {expected[rid]}: {frame}")
                    finals[rid] = ("error", code)
                    self.status(code)
                elif frame["type"] in ("token", "done"):
                    if expected[rid][0] == "bad":
                        raise Unexpected(f"websocket: a {frame['type']} frame for a bad request: {frame}")
                    texts[rid] += frame.get("text", "")
                    if frame["type"] == "done":
                        finals[rid] = ("done", frame["finish_reason"])
                    elif rid == cancel:
                        await ws.send(json.dumps({"type": "cancel", "id": cancel}))
                        cancel = "sent:" + cancel
                else:
                    raise Unexpected(f"websocket: a frame of unknown type: {frame}")
                if drop_after is not None and frames >= drop_after:
                    ws.transport.abort()  # no close frame: the socket just goes
                    dropped = True
                    # Its reader may hold a frame nobody will take: end it, then the rest.
                    ws.transfer_data_task.cancel()
                    await asyncio.wait_for(ws.wait_closed(), 5)
                    await asyncio.wait([ws.close_connection_task], timeout=5)
                    return "ws_dropped"
            for rid, (what, key) in expected.items():
                if what == "greedy":
                    self.compare("greedy_ws", key, texts[rid], finals[rid][1])
                elif what == "sampled" and finals[rid][1] not in ("length", "stop", "abort"):
                    raise Unexpected(f"websocket: finish_reason {finals[rid]} for {rid}")
            if cancel and cancel.startswith("sent:"):
                rid = cancel[5:]
                if finals[rid][1] not in ("abort", "length", "stop"):
                    raise Unexpected(f"websocket: a cancelled request ended with {finals[rid]}")
                self.done["ws_cancel_abort" if finals[rid][1] == "abort" else "ws_cancel_too_late"] += 1
            return "ws_session"
        finally:
            if not dropped:
                await ws.close()

    async def op_disconnect(self, w, rng):
        """A client that goes away: mid-stream, before the answer, or mid-body."""
        how = rng.choice(["mid_stream", "mid_stream", "before_answer", "mid_body"])
        chat = rng.random() < 0.3
        path = "/v1/chat/completions" if chat else "/v1/completions"
        payload = self.sampled(rng, chat)
        payload["max_tokens"] = self.args.max_tokens
        payload["ignore_eos"] = True
        if how == "mid_stream":
            payload["stream"] = True
            await self.sse_call(w, rng, path, payload, chat, abort_after=rng.randint(1, 8))
            return "disconnect_mid_stream"
        conn = await self.fresh(w)
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **self.auth}
        if how == "before_answer":
            await conn.send("POST", path, body, headers)
            await asyncio.sleep(rng.choice([0, 0.005, 0.05]))
        else:
            await conn.send("POST", path, body[: len(body) // 2], headers, content_length=len(body))
            await asyncio.sleep(rng.choice([0, 0.05]))
        conn.abort(rst=rng.random() < 0.5)
        return "disconnect_" + how

    async def op_bad(self, w, rng):
        """A bad request: it must get its 4xx, and the server must stay well."""
        too_long = "the " * 2000
        cases = [
            ("malformed_json", "POST", "/v1/completions", None, b'{"prompt": "x", ', 400),
            ("wrong_type", "POST", "/v1/completions", {"prompt": "x", "max_tokens": "ten"}, None, 400),
            ("wrong_type_chat", "POST", "/v1/chat/completions", {"messages": "hi"}, None, 400),
            ("prompt_too_long", "POST", "/v1/completions", {"prompt": too_long, "max_tokens": 4}, None, 400),
            ("n_out_of_range", "POST", "/v1/completions", {"prompt": "x", "n": 17}, None, 400),
            ("bad_temperature", "POST", "/v1/completions", {"prompt": "x", "temperature": "hot"}, None, 400),
            ("unknown_route", "GET", "/v1/no_such_route", None, None, 404),
            ("wrong_method", "GET", "/v1/completions", None, None, 405),
        ]
        if self.auth:
            cases.append(("no_api_key", "POST", "/v1/completions", {"prompt": "x"}, None, 401))
        if rng.random() < 0.1:  # a body over the limit: headers only, the server answers first
            conn = await self.fresh(w)
            await conn.send("POST", "/v1/completions", b"{", {"Content-Type": "application/json", **self.auth},
                            content_length=(4 << 20) + 1)
            status, h = await conn.head()
            await conn.body(h)
            conn.close()
            self.status(status)
            if status != 413:
                raise Unexpected(f"a body over the limit: status {status} (want 413)")
            return "bad_body_too_large"
        name, method, path, payload, raw, want = rng.choice(cases)
        conn, status, h = await self.request(w, method, path, payload, raw=raw, auth=name != "no_api_key")
        body = await conn.body(h)
        self.release(w, conn, h, rng)
        if status != want:
            raise Unexpected(f"bad request {name}: status {status} (want {want}): {body[:200]!r}")
        if "error" not in loads(body or b"{}", f"bad request {name}"):
            raise Unexpected(f"bad request {name}: no OpenAI error object: {body[:200]!r}")
        return "bad_" + name

    async def op_plain(self, w, rng):
        path = rng.choice(["/health", "/v1/models", "/version", "/metrics"])
        conn, status, h = await self.request(w, "GET", path)
        await conn.body(h)
        self.release(w, conn, h, rng)
        if status != 200:
            raise Unexpected(f"GET {path}: status {status}")
        return "plain_get"

    # ---- workers, sampling, phases
    async def worker(self, index: int) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        w: dict = {"conn": None}
        ops = [(self.op_sampled, 30), (self.op_greedy_http, 20), (self.op_websocket, 20),
               (self.op_disconnect, 12), (self.op_bad, 12), (self.op_plain, 6)]
        fns, weights = zip(*ops)
        while not self.stop:
            op = rng.choices(fns, weights)[0]
            try:
                kind = await asyncio.wait_for(op(w, rng), self.args.request_timeout)
                self.done[kind] += 1
            except asyncio.TimeoutError:
                self.error(op.__name__, f"no answer within {self.args.request_timeout} s")
                self.drop(w)
            except (Unexpected, OSError, EOFError, asyncio.IncompleteReadError, ValueError, KeyError,
                    websockets.exceptions.WebSocketException) as e:
                sent = getattr(e, "sent", None)
                if isinstance(e, websockets.exceptions.ConnectionClosedError) and sent and sent.code == 1007:
                    e = Unexpected("websocket: the server sent a text frame that is not valid UTF-8 "
                                   "(the client closed the socket with 1007)")
                self.error(op.__name__, repr(e)[:400])
                self.drop(w)
            for conn in list(w.get("open", ())):  # what a failed operation left open
                if conn is not w["conn"]:
                    conn.close()
        self.drop(w)

    @staticmethod
    def drop(w: dict) -> None:
        if w.get("conn") is not None:
            w["conn"].close()
            w["conn"] = None
        for conn in list(w.get("open", ())):
            conn.close()

    async def scrape(self) -> dict[str, float]:
        conn = await self.fresh({})
        try:
            await conn.send("GET", "/metrics", None, {"Connection": "close"})
            status, h = await asyncio.wait_for(conn.head(), 10)
            body = await asyncio.wait_for(conn.body(h), 10)
        finally:
            conn.close()
        return parse_metrics(body.decode()) if status == 200 else {}

    async def sample(self, phase: str) -> dict:
        pid = self.args.pid
        status = open(f"/proc/{pid}/status").read()
        field = {k: v.strip() for k, _, v in (line.partition(":") for line in status.splitlines())}
        s = {"t_s": round(time.monotonic() - self.t0, 1), "phase": phase,
             "rss_kib": int(field["VmRSS"].split()[0]), "threads": int(field["Threads"]),
             "fds": len(os.listdir(f"/proc/{pid}/fd"))}
        m = await self.scrape()  # after /proc: its own connection is not in the counts above
        for column, name in [("kv_usage", "troupe_kv_cache_usage_ratio"),
                             ("running", "troupe_num_requests_running"),
                             ("waiting", "troupe_num_requests_waiting"),
                             ("connections", "troupe_http_connections"),
                             ("in_flight", "troupe_http_requests_in_flight"),
                             ("actors", "troupe_live_actors")]:
            s[column] = m.get(name, "n/a")
        s["ops_done"] = sum(v for k, v in self.done.items() if k != "stale_keepalive_retry")
        s["errors"] = self.num_errors
        s["mismatches"] = len(self.mismatches)
        self.samples.append(s)
        return s

    async def sampler(self) -> None:
        last_print = time.monotonic()
        while not self.stop:
            try:
                s = await self.sample("load")
            except Exception as e:  # noqa: BLE001 - a failed scrape is itself a finding
                self.error("sampler", repr(e))
            else:
                if time.monotonic() - last_print >= 60:
                    last_print = time.monotonic()
                    print(f"  {s['t_s']:7.1f}s rss {s['rss_kib'] / 1024:6.1f} MiB fds {s['fds']} "
                          f"threads {s['threads']} kv {s['kv_usage']} running {s['running']} "
                          f"waiting {s['waiting']} ops {s['ops_done']} errors {s['errors']} "
                          f"mismatches {s['mismatches']}", flush=True)
            await asyncio.sleep(self.args.interval)

    async def solo_phase(self) -> None:
        w = {"conn": None}
        rng = random.Random(0)
        for i in range(len(COMPLETION_PROMPTS)):
            r = await self.json_call(w, rng, "/v1/completions", self.greedy(("completion", i)))
            c = r["choices"][0]
            self.solo[("completion", i)] = (c["text"], c["finish_reason"])
        for i in range(len(CHAT_CONVERSATIONS)):
            r = await self.json_call(w, rng, "/v1/chat/completions", self.greedy(("chat", i)))
            c = r["choices"][0]
            self.solo[("chat", i)] = (c["message"]["content"], c["finish_reason"])
        self.drop(w)
        distinct = len({v for v in self.solo.values()})
        print(f"solo greedy outputs: {len(self.solo)} ({distinct} distinct), max_tokens {self.args.max_tokens}")
        for key, (text, finish) in sorted(self.solo.items()):
            print(f"  {key[0]:10} {key[1]}: {finish:6} {text[:70]!r}")
        # Warm-up of the other paths, so that lazily started threads count as the start.
        await self.op_websocket(w, random.Random(1))
        payload = dict(self.greedy(("completion", 0)), stream=True)
        texts, finishes = await self.sse_call(w, rng, "/v1/completions", payload, chat=False)
        self.compare("greedy_http_stream", ("completion", 0), texts[0], finishes.get(0, ""))
        self.drop(w)

    async def drained(self, start: dict) -> dict:
        """Samples until the server is idle and back to its start counts, or --drain ends."""
        deadline = time.monotonic() + self.args.drain
        while True:
            s = await self.sample("drain")
            settled = (s["kv_usage"] == 0 and s["running"] == 0 and s["waiting"] == 0
                       and s["in_flight"] in (0, "n/a")
                       and s["fds"] <= start["fds"] + self.args.fd_slack
                       and s["threads"] == start["threads"] and s["actors"] == start["actors"])
            if settled or time.monotonic() > deadline:
                return s
            await asyncio.sleep(0.5)

    async def run(self) -> int:
        await self.solo_phase()
        await asyncio.sleep(1)
        start = await self.sample("start")
        print(f"start: rss {start['rss_kib'] / 1024:.1f} MiB, fds {start['fds']}, threads {start['threads']}, "
              f"actors {start['actors']}, connections {start['connections']}")
        print(f"load: {self.args.seconds:.0f} s, {self.args.workers} workers", flush=True)
        self.load_start = time.monotonic()
        sampler = asyncio.create_task(self.sampler())
        workers = [asyncio.create_task(self.worker(i)) for i in range(self.args.workers)]
        await asyncio.sleep(self.args.seconds)
        self.stop = True
        self.load_end = time.monotonic()
        _, pending = await asyncio.wait(workers, timeout=self.args.request_timeout + 10)
        for t in pending:
            t.cancel()
            self.error("worker", "still busy well after the load ended")
        await sampler
        end = await self.drained(start)
        return self.report(start, end)

    # ---- the verdict
    def report(self, start: dict, end: dict) -> int:
        columns = ["t_s", "phase", "rss_kib", "fds", "threads", "kv_usage", "running", "waiting",
                   "connections", "in_flight", "actors", "ops_done", "errors", "mismatches"]
        with open(self.args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.samples)
        rows = self.samples
        if len(rows) > 40:  # the table shows about 40 of them, the first and the last included
            step = len(rows) / 39
            rows = [rows[round(i * step)] for i in range(39)] + [rows[-1]]
        print()
        print(f"{'t_s':>7} {'phase':6} {'rss_MiB':>8} {'fds':>5} {'thr':>4} {'kv':>7} {'run':>4} {'wait':>4} "
              f"{'conns':>5} {'infl':>5} {'actors':>6} {'ops':>7} {'err':>4} {'mism':>4}")
        for s in rows:
            print(f"{s['t_s']:7.1f} {s['phase']:6} {s['rss_kib'] / 1024:8.1f} {s['fds']:5} {s['threads']:4} "
                  f"{s['kv_usage']!s:>7.7} {s['running']!s:>4} {s['waiting']!s:>4} {s['connections']!s:>5} "
                  f"{s['in_flight']!s:>5} {s['actors']!s:>6} {s['ops_done']:7} {s['errors']:4} {s['mismatches']:4}")
        print(f"samples written to {self.args.csv}")

        print("\noperations done:")
        for kind, n in sorted(self.done.items()):
            print(f"  {kind:28} {n}")
        print("greedy outputs compared: " + ", ".join(f"{k} {n}" for k, n in sorted(self.checked.items()))
              + f"; mismatches {len(self.mismatches)}")
        print("statuses seen: " + ", ".join(f"{k}: {n}" for k, n in sorted(self.statuses.items())))

        failures = []
        # RSS flat after warm-up.
        load = [s for s in self.samples if s["phase"] == "load"]
        length = self.load_end - self.load_start
        warm_end = max(10.0, 0.2 * length)
        t_load = self.load_start - self.t0
        warm = [s["rss_kib"] for s in load if s["t_s"] - t_load <= warm_end]
        late = [s["rss_kib"] for s in load if s["t_s"] - t_load >= length / 2]
        after = [(s["t_s"], s["rss_kib"]) for s in load if s["t_s"] - t_load > warm_end]
        peak = max(s["rss_kib"] for s in self.samples)
        if warm and late:
            reference = max(warm)
            bound = reference + max(self.args.rss_slack_mib * 1024, self.args.rss_slack_frac * reference)
            slope = 0.0
            if len(after) >= 2:
                mt = sum(t for t, _ in after) / len(after)
                mr = sum(r for _, r in after) / len(after)
                den = sum((t - mt) ** 2 for t, _ in after)
                slope = sum((t - mt) * (r - mr) for t, r in after) / den * 60 / 1024 if den else 0.0
            at_warm_end = [s["rss_kib"] for s in load if s["t_s"] - t_load <= warm_end][-1]
            print(f"RSS: start {start['rss_kib'] / 1024:.1f} MiB, at warm-up end ({warm_end:.0f} s) "
                  f"{at_warm_end / 1024:.1f} MiB, warm-up max {reference / 1024:.1f} MiB, max of the second half "
                  f"{max(late) / 1024:.1f} MiB (bound {bound / 1024:.1f}), peak {peak / 1024:.1f} MiB, "
                  f"end {end['rss_kib'] / 1024:.1f} MiB, slope after warm-up {slope:+.3f} MiB/min")
            if max(late) > bound:
                failures.append(f"RSS grew after warm-up: {max(late) / 1024:.1f} MiB in the second half, "
                                f"over the bound {bound / 1024:.1f} MiB (warm-up max {reference / 1024:.1f} MiB)")
        else:
            failures.append("too few samples to judge RSS (run longer or sample more often)")
        print(f"end (after the drain): fds {end['fds']} (start {start['fds']}), threads {end['threads']} "
              f"(start {start['threads']}), actors {end['actors']} (start {start['actors']}), kv {end['kv_usage']}, "
              f"running {end['running']}, waiting {end['waiting']}, in flight {end['in_flight']}, "
              f"connections {end['connections']} (start {start['connections']})")

        for column in ("kv_usage", "running", "waiting", "in_flight"):
            if end[column] not in (0, "n/a"):
                failures.append(f"{column} is {end[column]} after the drain (want 0)")
        if end["fds"] > start["fds"] + self.args.fd_slack:
            failures.append(f"descriptors: {end['fds']} after the drain, {start['fds']} at the start "
                            f"(slack {self.args.fd_slack})")
        if end["threads"] != start["threads"]:
            failures.append(f"threads: {end['threads']} after the drain, {start['threads']} at the start")
        if end["actors"] != start["actors"]:
            failures.append(f"live actors: {end['actors']} after the drain, {start['actors']} at the start")
        if end["connections"] not in ("n/a",) and start["connections"] != "n/a" \
                and end["connections"] > start["connections"]:
            failures.append(f"open connections: {end['connections']} after the drain, {start['connections']} at the start")
        if self.mismatches:
            failures.append(f"{len(self.mismatches)} greedy outputs differ from their solo output:\n    "
                            + "\n    ".join(self.mismatches[:20]))
        fivexx = sum(n for code, n in self.statuses.items() if isinstance(code, int) and code >= 500)
        if fivexx:
            failures.append(f"{fivexx} responses with a 5xx status")
        if self.num_errors:
            failures.append(f"{self.num_errors} unexpected errors, the first ones:\n    " + "\n    ".join(self.errors[:20]))
        wanted = ["sampled", "sampled_stream", "sampled_chat", "sampled_stream_chat", "greedy_http",
                  "greedy_http_stream", "ws_session", "disconnect_mid_stream", "disconnect_before_answer",
                  "disconnect_mid_body"]
        missing = [k for k in wanted if not self.done[k]]
        if not any(k.startswith("bad_") for k in self.done):
            missing.append("bad_*")
        if not self.checked["greedy_ws"]:
            missing.append("greedy_ws")
        if missing:
            failures.append("kinds of traffic that never ran to the end: " + ", ".join(missing))
        if failures:
            print("\nFAILED:")
            for f in failures:
                print("  - " + f)
            return 1
        print("\nPASSED")
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="http://HOST:PORT of the server")
    p.add_argument("--pid", required=True, type=int, help="the server's process id")
    p.add_argument("--seconds", type=float, default=60, help="length of the load")
    p.add_argument("--csv", required=True, help="where the samples go")
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    p.add_argument("--api-key", default="")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--request-timeout", type=float, default=60)
    p.add_argument("--drain", type=float, default=30, help="seconds the server gets to settle")
    p.add_argument("--fd-slack", type=int, default=2)
    p.add_argument("--rss-slack-mib", type=float, default=16)
    p.add_argument("--rss-slack-frac", type=float, default=0.10)
    args = p.parse_args()
    return asyncio.run(Soak(args).run())


if __name__ == "__main__":
    sys.exit(main())
