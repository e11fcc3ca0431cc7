#!/usr/bin/env python3
"""Unfinished TLS handshakes against `troupe serve --ssl-*` (RELIABILITY.md, "HTTPS").

Opens N connections to the TLS port that never finish a handshake (every third stops
inside a TLS record header), and for 14 s asks /health over HTTPS every 0.5 s with curl;
then says how many of the N the server closed, and how /health fared.

Usage: tls_handshake_flood.py PORT N CA_CERT
"""
import select
import socket
import subprocess
import sys
import time


def main() -> None:
    port, n, ca = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sockets = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        if i % 3 == 1:
            s.send(b"\x16\x03\x01\x02\x00\x01")  # a TLS record header, and nothing after it
        sockets.append(s)
    start = time.time()
    ok = failed = 0
    slowest = 0.0
    closed = set()
    while time.time() - start < 14:
        asked = time.time()
        code = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2",
             "--cacert", ca, f"https://127.0.0.1:{port}/health"],
            capture_output=True, text=True).stdout
        slowest = max(slowest, time.time() - asked)
        ok, failed = (ok + 1, failed) if code == "200" else (ok, failed + 1)
        readable, _, _ = select.select([s for s in sockets if s not in closed], [], [], 0.5)
        for s in readable:
            try:
                if s.recv(1) == b"":
                    closed.add(s)
            except OSError:
                closed.add(s)
    print(f"held {n}; closed by the server within 14 s: {len(closed)}; "
          f"/health ok {ok}, failed {failed}; slowest {slowest * 1000:.0f} ms")


if __name__ == "__main__":
    main()
