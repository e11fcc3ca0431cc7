#!/usr/bin/python3
"""WebSocket clients that ask for a lot of output and never read it.

slowhttptest's slow-read mode can only GET, so it cannot hold a token stream open;
this client can. Each socket (a small receive buffer, no reading after the
handshake) sends GENERATES requests whose token frames, with 20 top logprobs each,
add up to several MiB. The right server ends such a client (WebSocket close 1008,
or a plain close) and cancels its requests once it has fallen a bounded amount
behind; a server that keeps queueing frames for it holds memory for as long as the
client cares to stay.

Usage: never_reader.py WS_URL SOCKETS GENERATES HOLD_SECONDS [API_KEY]
Prints one line per socket and a last line "closed_by_server=N of M"; exits 0.
Standard library only.
"""
import base64
import errno
import json
import os
import socket
import struct
import sys
import time
from urllib.parse import urlparse


def frame(text: str) -> bytes:
    """A masked text frame, as a client must send."""
    payload = text.encode()
    mask = os.urandom(4)
    head = bytes([0x81])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def open_socket(host: str, port: int, path: str, api_key: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connect: a small window
    s.settimeout(10)
    s.connect((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               f"Sec-WebSocket-Version: 13\r\n{auth}\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:  # the handshake answer is the only thing this client reads
        chunk = s.recv(1)
        if not chunk:
            raise SystemExit("never_reader: the server closed the socket during the handshake")
        head += chunk
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise SystemExit(f"never_reader: no upgrade: {head.decode(errors='replace')!r}")
    return s


class Frames:
    """Parses the server's (unmasked) frames as they are drained; notes a close frame."""

    def __init__(self) -> None:
        self.buffer = b""
        self.close_code: int | None = None

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 2:
            opcode, n, at = self.buffer[0] & 0x0F, self.buffer[1] & 0x7F, 2
            if n == 126:
                if len(self.buffer) < 4:
                    return
                n, at = struct.unpack("!H", self.buffer[2:4])[0], 4
            elif n == 127:
                if len(self.buffer) < 10:
                    return
                n, at = struct.unpack("!Q", self.buffer[2:10])[0], 10
            if len(self.buffer) < at + n:
                return
            if opcode == 0x8 and self.close_code is None:
                payload = self.buffer[at:at + n]
                self.close_code = struct.unpack("!H", payload[:2])[0] if n >= 2 else 1005
            self.buffer = self.buffer[at + n:]


def closed_by_server(s: socket.socket) -> tuple[bool, int, int | None]:
    """Drains what is waiting: closed when the stream ends (FIN or reset) or carries a
    close frame within a few seconds. Returns (closed, bytes drained, close code).

    A server that closed the socket may still have frames in its send buffer: they
    arrive first, then the close frame or the end. A server that keeps the socket open
    keeps sending while the client drains, then goes quiet: quiet for 1 s with the
    socket open and no close frame is "open".
    """
    s.setblocking(False)
    frames = Frames()
    drained = 0
    deadline = time.monotonic() + 5.0
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(1 << 16)
        except BlockingIOError:
            if frames.close_code is not None:
                return True, drained, frames.close_code
            if time.monotonic() - quiet_since > 1.0:
                return False, drained, None
            time.sleep(0.02)
            continue
        except OSError as e:
            if e.errno in (errno.ECONNRESET, errno.EPIPE):
                return True, drained, frames.close_code
            raise
        if not chunk:
            return True, drained, frames.close_code
        drained += len(chunk)
        frames.feed(chunk)
        quiet_since = time.monotonic()
    return frames.close_code is not None, drained, frames.close_code


def main() -> None:
    url, sockets, generates, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    api_key = sys.argv[5] if len(sys.argv) > 5 else ""
    u = urlparse(url)
    opened = []
    for i in range(sockets):
        s = open_socket(u.hostname, u.port, u.path or "/v1/ws", api_key)
        for j in range(generates):
            command = {"type": "generate", "id": f"r{i}-{j}", "prompt": "Once upon a time",
                       "max_tokens": 96, "temperature": 0.8, "ignore_eos": True, "logprobs": 20}
            try:
                s.sendall(frame(json.dumps(command)))
            except OSError:
                break  # already closed by the server: counted below
        opened.append(s)
    time.sleep(hold)
    num_closed = 0
    for i, s in enumerate(opened):
        closed, drained, code = closed_by_server(s)
        num_closed += closed
        how = "closed by the server" + (f" (close frame {code})" if code else "") if closed else "still open"
        print(f"never_reader: socket {i}: {how}, {drained} bytes waiting for it on this side")
        s.close()
    print(f"closed_by_server={num_closed} of {len(opened)}")


if __name__ == "__main__":
    main()
