#!/usr/bin/env python3
"""The client of scripts/bench-failover.sh: the pause a migrated stream sees.

It streams N greedy completions (ignore_eos) from a troupe head with two replicas, one at
a time so that /v1/cluster tells which replica each one went to, waits until every
stream of the replica holding most of them has streamed at least L tokens, SIGKILLs that
replica's node (its pid given on the command line) and reads every stream to its end.
For each stream, the pause is its longest gap that ends after the kill: for a stream of
the lost node, its move (detection, routing, the recompute of prompt + tokens sent, its
first step there); for a survivor's, the stall that recompute costs the steps it shares.
Its extra latency is that gap less the stream's median inter-token gap (the others).
Prints one JSON object: the streams' records, the kill's wall time and the counts.

  bench-failover-client.py --port P --streams 8 --length 64 --max-tokens 128 \
      --node n0=PID --node n1=PID [--prompt-len 32] [--shared-prefix 0]
  bench-failover-client.py --self-test
"""

import argparse
import http.client
import json
import os
import signal
import statistics
import sys
import threading
import time


def median(values):
    return statistics.median(values) if values else 0.0


def pause_of(times, t_kill):
    """(longest gap that ends after the kill, median of the other gaps, tokens before that
    gap) of a stream: `times` its tokens' arrival times, in order. For a lost node's stream
    that gap is its move (a kill seen late by the client's clock, whose tokens from before
    the kill still arrive after it, moves no boundary); for a survivor's, the stall its
    replica's recompute of the moved streams costs it. None where no gap ends after it."""
    late = [(b - a, k + 1) for k, (a, b) in enumerate(zip(times, times[1:])) if b > t_kill]
    if not late:
        return None
    worst, before = max(late)
    gaps = [b - a for a, b in zip(times, times[1:])]
    gaps.remove(worst)
    return worst, median(gaps), before


def percentile(values, p):
    """Nearest rank, as troupe's benches."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def self_test():
    # A stream at 10 ms a token that loses its node at t=0.505 and resumes at 0.80.
    times = [0.01 * i for i in range(1, 51)] + [0.80 + 0.01 * i for i in range(20)]
    gap, med, n = pause_of(times, 0.505)
    assert abs(gap - 0.30) < 1e-9, gap
    assert abs(med - 0.01) < 1e-9, med
    assert n == 50, n
    # The kill seen before the stream's last tokens from the lost node arrived: the same.
    assert pause_of(times, 0.45)[2] == 50
    assert pause_of(times[:10], 0.505) is None  # ended before the kill: no pause
    assert percentile([3, 1, 2, 4], 50) == 2
    assert percentile([3, 1, 2, 4], 99) == 4
    assert percentile([7], 99) == 7
    assert percentile([], 50) is None
    print("self-test ok")


class Stream(threading.Thread):
    def __init__(self, port, body):
        super().__init__(daemon=True)
        self.port = port
        self.body = body
        self.times = []  # each token's arrival (time.monotonic)
        self.finish = None
        self.error = None
        self.started = threading.Event()

    def run(self):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            conn.request("POST", "/v1/completions", body=self.body,
                         headers={"Content-Type": "application/json", "Connection": "close"})
            self.started.set()
            resp = conn.getresponse()
            if resp.status != 200:
                self.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
                return
            while True:
                line = resp.readline()
                if not line:
                    break
                now = time.monotonic()
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    self.error = json.dumps(event["error"])[:200]
                    continue
                for choice in event.get("choices", []):
                    self.times.append(now)  # troupe: a chunk a token, the last one's too
                    if choice.get("finish_reason"):
                        self.finish = choice["finish_reason"]
        except Exception as e:  # noqa: BLE001: a broken stream is a result, reported
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.started.set()


def get_json(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return json.loads(body) if path != "/metrics" else body.decode()


def loads(port):
    """Each replica's (node, requests the router sent it): a count that only grows."""
    state = get_json(port, "/v1/cluster")
    return {int(r["index"]): (r.get("node", ""), int(r["num_routed"])) for r in state["replicas"]}


def metric(port, name):
    for line in get_json(port, "/metrics").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return -1.0


def prompt(i, length, shared):
    # Ids in [259, 499): plain tokens of both the llama vocabulary and stories260K's 512.
    ids = [259 + (k * 7) % 240 for k in range(shared)]
    ids += [259 + (i * 37 + k * 11 + 101) % 240 for k in range(length - shared)]
    return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--port", type=int)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--shared-prefix", type=int, default=0)
    ap.add_argument("--node", action="append", default=[], help="NAME=PID")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    pids = dict(kv.split("=", 1) for kv in a.node)
    before = {i: load for i, (_, load) in loads(a.port).items()}
    migrations0 = metric(a.port, "troupe_request_migrations_total")

    streams, replica_of = [], []
    for i in range(a.streams):
        body = json.dumps({"prompt": prompt(i, a.prompt_len, a.shared_prefix),
                           "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True,
                           "stream": True})
        s = Stream(a.port, body)
        s.start()
        streams.append(s)
        # Which replica took it: the one the router sent one more.
        deadline = time.monotonic() + 30
        placed = None
        while placed is None and time.monotonic() < deadline:
            now = loads(a.port)
            for r, (_, load) in now.items():
                if load > before.get(r, 0):
                    placed = r
                    before[r] = load
                    break
            if placed is None:
                time.sleep(0.003)
        if placed is None:
            print(f"stream {i}: no replica took it in 30 s", file=sys.stderr)
            return 1
        replica_of.append(placed)

    nodes = {r: node for r, (node, _) in loads(a.port).items()}
    counts = {r: replica_of.count(r) for r in set(replica_of)}
    victim = max(sorted(counts), key=lambda r: counts[r])
    node = nodes[victim]
    lost = [i for i, r in enumerate(replica_of) if r == victim]
    deadline = time.monotonic() + 300
    while min(len(streams[i].times) for i in lost) < a.length:
        if time.monotonic() > deadline or any(streams[i].error for i in lost):
            print("the lost node's streams did not reach the length", file=sys.stderr)
            return 1
        time.sleep(0.002)
    os.kill(int(pids[node]), signal.SIGKILL)
    t_kill = time.monotonic()
    kill_wall = time.time()
    at_kill = {i: len(streams[i].times) for i in range(a.streams)}
    for s in streams:
        s.join(600)

    records = []
    for i, s in enumerate(streams):
        rec = {"stream": i, "replica": replica_of[i], "lost": i in lost,
               "tokens": len(s.times), "at_kill": at_kill[i], "finish": s.finish,
               "error": s.error}
        p = pause_of(s.times, t_kill)
        if p:
            rec.update(gap_ms=p[0] * 1e3, median_itl_ms=p[1] * 1e3, before=p[2],
                       extra_ms=(p[0] - p[1]) * 1e3,
                       kill_to_resume_ms=(s.times[p[2]] - t_kill) * 1e3)
        records.append(rec)
    migrations = metric(a.port, "troupe_request_migrations_total") - migrations0
    print(json.dumps({"node": node, "kill_wall": kill_wall, "lost": len(lost), "migrations": migrations,
                      "complete": sum(1 for s in streams
                                      if s.finish == "length" and not s.error
                                      and len(s.times) == a.max_tokens),
                      "errors": sum(1 for s in streams if s.error or s.finish == "error"),
                      "streams": records}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
