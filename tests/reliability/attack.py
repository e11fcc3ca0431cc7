#!/usr/bin/python3
"""A hostile client's classes of attack against `troupe serve`, each payload sent for real.

For every class: what was tried, how each try ended (status codes, error events), the
slowest answer, whether a canary (a small greedy stream every 0.3 s) was served within
CANARY_BOUND_S seconds throughout, and whether the server was alive after. Prints a
Markdown table (RELIABILITY.md, "Hardening II") and exits non-zero when an expectation
broke: a 5xx, a dropped connection, a try answered slower than its bound, a canary late or
failed, the server dead, or KV/running requests left behind.

Usage: attack.py URL [--troupe BINARY] [--cluster-port PORT] [--classes a,b,...]
Debian's python3 with python3-websockets.
"""
import argparse
import asyncio
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

CANARY_BOUND_S = float(os.environ.get("CANARY_BOUND_S", "3"))


class Server:
    def __init__(self, url):
        parsed = urllib.parse.urlparse(url)
        self.host, self.port = parsed.hostname, parsed.port

    def request(self, method, path, body=None, timeout=120, raw=None):
        """(status, body text) or (0, why) when the connection failed."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            data = raw if raw is not None else (json.dumps(body) if body is not None else None)
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode("utf-8", "replace")
        except Exception as e:  # noqa: BLE001: every failure is an outcome to record
            return 0, f"{type(e).__name__}: {e}"
        finally:
            conn.close()

    def post(self, path, body, timeout=120):
        return self.request("POST", path, body, timeout)

    def metric(self, name):
        status, text = self.request("GET", "/metrics", timeout=10)
        if status != 200:
            return None
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


class Canary(threading.Thread):
    """A small greedy stream every 0.3 s: the time each takes, and its failures."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.server, self.stop, self.slowest, self.failures, self.count = server, False, 0.0, 0, 0
        self.lock = threading.Lock()

    def reset(self):
        with self.lock:
            self.slowest, self.failures, self.count = 0.0, 0, 0

    def run(self):
        body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": True}
        while not self.stop:
            start = time.monotonic()
            status, text = self.server.post("/v1/completions", body, timeout=30)
            took = time.monotonic() - start
            with self.lock:
                self.count += 1
                self.slowest = max(self.slowest, took)
                if status != 200 or "[DONE]" not in text:
                    self.failures += 1
            time.sleep(0.3)


class Attack:
    """One class's tries and how they ended."""

    def __init__(self, name):
        self.name, self.tried, self.outcomes, self.slowest, self.broken = name, [], {}, 0.0, []

    def record(self, what, outcome, took, ok, bound_s=10.0):
        self.tried.append(what)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.slowest = max(self.slowest, took)
        if not ok:
            self.broken.append(f"{what}: {outcome}")
        elif took > bound_s:
            self.broken.append(f"{what}: answered in {took:.1f} s (bound {bound_s} s)")


def outcome_of(status, text):
    if status == 0:
        return "no answer (" + text.split(":")[0] + ")"
    if status == 200 and '"finish_reason":"error"' in text.replace(" ", ""):
        return "200, ended with an error"
    return str(status)


def send(server, attack, what, path, body, expect=(400,), bound_s=10.0, raw=None):
    start = time.monotonic()
    if raw is not None:
        status, text = server.request("POST", path, raw=raw)
    else:
        status, text = server.post(path, body)
    took = time.monotonic() - start
    outcome = outcome_of(status, text)
    attack.record(what, outcome, took, status in expect, bound_s)
    return status, text


# --- the classes ------------------------------------------------------------------------


def ref_chain(hops):
    defs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(hops)}
    defs[f"a{hops}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


def nested_text(depth, key):
    """A schema nested `depth` deep through `key`, as JSON text (too deep for json.dumps)."""
    if key == "items":
        return '{"type":"array","items":' * depth + '{"type":"integer"}' + "}" * depth
    return '{"anyOf":[' * depth + '{"type":"integer"}' + "]}" * depth


def schemas(server):
    a = Attack("schemas")
    completion = lambda schema: {"prompt": "x", "max_tokens": 4, "guided_json": schema}
    for hops in (100, 10_000, 100_000):
        send(server, a, f"$ref chain of {hops} (guided_json)", "/v1/completions",
             completion(ref_chain(hops)))
        send(server, a, f"$ref chain of {hops} (response_format)", "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
              "response_format": {"type": "json_schema",
                                  "json_schema": {"name": "x", "schema": ref_chain(hops)}}})
    for depth in (30, 70, 5000):
        for key in ("items", "anyOf"):
            raw = ('{"prompt":"x","max_tokens":4,"guided_json":' + nested_text(depth, key) +
                   "}").encode()
            # JSON nested past 32 is refused by the parser; within it, the schema is fine.
            send(server, a, f"{key} nested {depth}", "/v1/completions", None, raw=raw,
                 expect=(200, 400) if depth <= 30 else (400,))
    send(server, a, "a $ref cycle", "/v1/completions",
         completion({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                     "$ref": "#/$defs/a"}))
    send(server, a, "an enum of 100 000 values", "/v1/completions",
         completion({"enum": [f"v{i}" for i in range(100_000)]}))
    send(server, a, "anyOf of 10 000 objects", "/v1/completions",
         completion({"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                                "required": [f"k{i}"]} for i in range(10_000)]}))
    send(server, a, "10 000 properties", "/v1/completions",
         completion({"type": "object",
                     "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}))
    send(server, a, "a pattern of 200 '.*'", "/v1/completions",
         completion({"type": "string", "pattern": ".*" * 200 + "z"}))
    send(server, a, "maxLength 10^12", "/v1/completions",
         completion({"type": "string", "maxLength": 10**12}))
    send(server, a, "integer bounds of 10^30", "/v1/completions",
         completion({"type": "integer", "minimum": -10**30, "maximum": 10**30}))
    send(server, a, "minItems 4096 of 4096-item arrays", "/v1/completions",
         completion({"type": "array", "minItems": 4096,
                     "items": {"type": "array", "minItems": 4096, "items": {"type": "integer"}}}),
         expect=(200, 400))
    send(server, a, "a schema that is a string of junk", "/v1/completions",
         completion("{{{{"))
    return a


def regexes(server):
    a = Attack("regexes")
    completion = lambda regex: {"prompt": "x", "max_tokens": 8, "guided_regex": regex}
    for k in (80, 200, 1000):
        send(server, a, f"'.*' * {k} + 'z'", "/v1/completions", completion(".*" * k + "z"))
    # Refused at admission where a token can run past the literal into the stars, else
    # ended with an error when its mask passes the budget: either way within seconds.
    send(server, a, "'abcdefgh' + '.*' * 200 + 'z' (costly after its start)", "/v1/completions",
         completion("abcdefgh" + ".*" * 200 + "z"), expect=(200, 400), bound_s=30)
    send(server, a, "(a|a)* 64 times", "/v1/completions", completion("(a|a)*" * 64 + "b"),
         expect=(200, 400), bound_s=30)
    send(server, a, "(a*)*b", "/v1/completions", completion("(a*)*b"), expect=(200, 400))
    send(server, a, "quantifiers nested 3 deep {0,100}", "/v1/completions",
         completion("((a{0,100}){0,100}){0,100}"), expect=(200, 400), bound_s=30)
    send(server, a, "groups nested 100 000 deep", "/v1/completions",
         completion("(" * 100_000 + "a" + ")" * 100_000))
    send(server, a, "a lookahead", "/v1/completions", completion("a(?=b)"))
    send(server, a, "a backreference", "/v1/completions", completion("(a)\\1"))
    send(server, a, "[^z]{4096} * 8", "/v1/completions", completion("[^z]{4096}" * 8),
         expect=(200, 400), bound_s=30)
    send(server, a, "a lone surrogate escape", "/v1/completions", completion("\\uD800"))
    return a


def gbnfs(server):
    a = Attack("gbnf")
    completion = lambda g: {"prompt": "x", "max_tokens": 8, "guided_grammar": g}
    send(server, a, "left recursion", "/v1/completions", completion('root ::= root "a" | "b"'))
    send(server, a, "parentheses 100 000 deep", "/v1/completions",
         completion("root ::= " + "(" * 100_000 + '"a"' + ")" * 100_000))
    send(server, a, "a rule chain of 19 000", "/v1/completions",
         completion("root ::= r0\n" + "".join(f"r{i} ::= r{i + 1} | \"x\"\n" for i in range(19_000))
                    + 'r19000 ::= "y"\n'), expect=(200, 400), bound_s=30)
    send(server, a, "20 001 rules", "/v1/completions",
         completion("root ::= r0\n" + "".join(f'r{i} ::= "x"\n' for i in range(20_001))))
    send(server, a, "repetitions of 4096 x 4096", "/v1/completions",
         completion('root ::= ("' + "a" * 300 + '"{4000}){4000}'))
    send(server, a, '("a"?){0,4096} "b"', "/v1/completions",
         completion('root ::= ("a"?){0,4096} "b"'))
    send(server, a, '("a"?){0,60} "b" (branches multiply)', "/v1/completions",
         completion('root ::= ("a"?){0,60} "b"'), expect=(200, 400), bound_s=30)
    send(server, a, "a lone surrogate \\uD800", "/v1/completions",
         completion('root ::= "\\uD800"'))
    send(server, a, "a surrogate range", "/v1/completions", completion("root ::= [\\uD800-\\uDFFF]"))
    send(server, a, "a surrogate in raw UTF-8", "/v1/completions",
         None, raw=b'{"prompt":"x","max_tokens":4,"guided_grammar":"root ::= \\"\xed\xa0\x80\\""}')
    send(server, a, "a grammar with no root", "/v1/completions", completion('start ::= "a"'))
    return a


def tools(server):
    a = Attack("tools")
    chat = lambda **extra: dict({"messages": [{"role": "user", "content": "x"}],
                                 "max_tokens": 4}, **extra)
    fn = lambda name, params: {"type": "function", "function": {"name": name, "parameters": params}}
    send(server, a, "1000 tools, auto", "/v1/chat/completions",
         chat(tools=[fn(f"f{i}", {"type": "object", "properties": {"a": {"type": "string"}}})
                     for i in range(1000)]), expect=(200, 400), bound_s=30)
    send(server, a, "1000 tools, required", "/v1/chat/completions",
         chat(tools=[fn(f"f{i}", {"type": "object", "properties": {"a": {"type": "string"}}})
                     for i in range(1000)], tool_choice="required"), expect=(200, 400), bound_s=30)
    for hops in (10_000, 100_000):
        for choice in ("required", {"type": "function", "function": {"name": "f"}}):
            send(server, a, f"parameters a $ref chain of {hops}, tool_choice {choice}",
                 "/v1/chat/completions", chat(tools=[fn("f", ref_chain(hops))], tool_choice=choice))
    send(server, a, "parameters with a pattern of 200 '.*'", "/v1/chat/completions",
         chat(tools=[fn("f", {"type": "object", "properties": {
             "s": {"type": "string", "pattern": ".*" * 200}}, "required": ["s"]})],
             tool_choice="required"), expect=(200, 400), bound_s=30)
    send(server, a, "a named function that is not a tool", "/v1/chat/completions",
         chat(tools=[fn("f", {"type": "object"})],
              tool_choice={"type": "function", "function": {"name": "g"}}))
    send(server, a, "tools that are not a list", "/v1/chat/completions", chat(tools={"a": 1}))
    return a


def chats(server):
    a = Attack("chat")
    msg = lambda content, role="user": {"role": role, "content": content}
    send(server, a, "10 000 messages", "/v1/chat/completions",
         {"messages": [msg("hi")] * 10_000, "max_tokens": 4}, expect=(200, 400), bound_s=30)
    send(server, a, "a 3 MB message", "/v1/chat/completions",
         {"messages": [msg("a " * 1_500_000)], "max_tokens": 4})
    send(server, a, "a role that is not one", "/v1/chat/completions",
         {"messages": [msg("x", "wizard")], "max_tokens": 4})
    send(server, a, "content parts nested", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": [{"type": "text", "text": [{"a": 1}]}]}],
          "max_tokens": 4})
    send(server, a, "top_logprobs 21", "/v1/chat/completions",
         {"messages": [msg("x")], "max_tokens": 4, "logprobs": True, "top_logprobs": 21})
    send(server, a, "top_logprobs without logprobs", "/v1/chat/completions",
         {"messages": [msg("x")], "max_tokens": 4, "top_logprobs": 3})
    status, text = send(server, a, "logprobs over byte tokens: valid UTF-8", "/v1/chat/completions",
                        {"messages": [msg("x")], "max_tokens": 64, "logprobs": True,
                         "top_logprobs": 5, "temperature": 1.5, "seed": 3}, expect=(200,))
    try:
        text.encode("utf-8")
        json.loads(text)
    except Exception as e:  # noqa: BLE001
        a.broken.append(f"logprobs answer is not valid JSON/UTF-8: {e}")
    send(server, a, "a JSON body nested 100 000 deep", "/v1/chat/completions", None,
         raw=("[" * 100_000 + "]" * 100_000).encode())
    return a


def completions(server):
    a = Attack("completions")
    send(server, a, "max_tokens 10^18", "/v1/completions", {"prompt": "x", "max_tokens": 10**18})
    send(server, a, "max_tokens -1", "/v1/completions", {"prompt": "x", "max_tokens": -1})
    send(server, a, "n 1000", "/v1/completions", {"prompt": "x", "max_tokens": 2, "n": 1000})
    send(server, a, "logprobs 21", "/v1/completions", {"prompt": "x", "max_tokens": 2, "logprobs": 21})
    send(server, a, "prompt ids outside the vocabulary", "/v1/completions",
         {"prompt": [10**9, -5], "max_tokens": 2})
    send(server, a, "a prompt longer than the context", "/v1/completions",
         {"prompt": "a " * 200_000, "max_tokens": 2})
    send(server, a, "invalid UTF-8 in the body", "/v1/completions", None,
         raw=b'{"prompt":"\xff\xfe","max_tokens":2}')
    send(server, a, "a temperature of NaN spelled as a string", "/v1/completions",
         {"prompt": "x", "max_tokens": 2, "temperature": "NaN"})
    send(server, a, "stop strings x 10 000", "/v1/completions",
         {"prompt": "x", "max_tokens": 2, "stop": ["a"] * 10_000}, expect=(200, 400))
    # The server answers 413 from the Content-Length and closes: a client still sending
    # sees its pipe break instead of the answer.
    send(server, a, "a 5 MB body", "/v1/completions", None,
         raw=json.dumps({"prompt": "a" * (5 << 20)}).encode(), expect=(413, 0))
    send(server, a, "a body that is not JSON", "/v1/completions", None, raw=b"{not json")
    return a


def websockets_class(server):
    a = Attack("websocket")
    try:
        import websockets  # noqa: PLC0415
    except ImportError:
        a.broken.append("python3-websockets is not installed")
        return a
    uri = f"ws://{server.host}:{server.port}/v1/ws"

    async def one(what, messages, expect_error=True, binary=False):
        start = time.monotonic()
        try:
            async with websockets.connect(uri, max_size=None, open_timeout=10) as ws:
                for m in messages:
                    await ws.send(m if not binary else m.encode())
                answer = await asyncio.wait_for(ws.recv(), 30)
                kind = json.loads(answer).get("type", "?") if isinstance(answer, str) else "binary"
                outcome = f"frame '{kind}'"
                ok = (kind == "error") if expect_error else kind != "error"
        except websockets.exceptions.ConnectionClosed as e:
            outcome, ok = f"closed {e.code}", e.code in (1003, 1007, 1008, 1009)
        except Exception as e:  # noqa: BLE001
            outcome, ok = f"failed ({type(e).__name__})", False
        a.record(what, outcome, time.monotonic() - start, ok)

    async def run():
        await one("a message that is not JSON", ["{{{"])
        await one("a generate with a $ref chain of 10 000", [json.dumps(
            {"type": "generate", "id": "1", "prompt": "x", "max_tokens": 4,
             "guided_json": ref_chain(10_000)})])
        await one("a generate with '.*' * 200", [json.dumps(
            {"type": "generate", "id": "1", "prompt": "x", "max_tokens": 4,
             "guided_regex": ".*" * 200 + "z"})])
        await one("a binary frame", ["\x00\x01"], binary=True)
        await one("an unknown message type", [json.dumps({"type": "launch", "id": "1"})])
        await one("a 5 MB message", [json.dumps({"type": "generate", "id": "1",
                                                 "prompt": "a" * (5 << 20)})])
        await one("chat logprobs over byte tokens", [json.dumps(
            {"type": "generate", "id": "1", "messages": [{"role": "user", "content": "x"}],
             "max_tokens": 16, "logprobs": True, "top_logprobs": 5, "temperature": 1.5})],
            expect_error=False)

    asyncio.run(run())
    return a


def configs(server, troupe):
    a = Attack("config files")
    if troupe is None:
        a.broken.append("no --troupe binary to start")
        return a
    with tempfile.TemporaryDirectory() as d:
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo)
        junk = os.path.join(d, "junk.yaml")
        with open(junk, "wb") as f:
            f.write(os.urandom(4096))
        deep = os.path.join(d, "deep.json")
        with open(deep, "w") as f:
            f.write("[" * 100_000 + "]" * 100_000)
        cases = [("--config a FIFO", ["--config", fifo]),
                 ("--config a directory", ["--config", d]),
                 ("--config random bytes", ["--config", junk]),
                 ("--config JSON nested 100 000 deep", ["--config", deep]),
                 ("--model a FIFO", ["--model", fifo]),
                 ("--model a directory", ["--model", d]),
                 ("--model /dev/zero", ["--model", "/dev/zero"]),
                 ("--kv-cache-gb -1", ["--kv-cache-gb", "-1"]),
                 ("--served-model-name of 50 MB", ["--served-model-name", "n" * (50 << 20)])]
        for what, args in cases:
            start = time.monotonic()
            try:
                done = subprocess.run([troupe, "serve", "--port", "0", *args], timeout=20,
                                      capture_output=True, text=True, errors="replace")
                outcome = f"exit {done.returncode}"
                ok = done.returncode not in (0,) and done.returncode > 0
                if ok and not done.stderr.strip():
                    ok, outcome = False, outcome + " without a message"
            except subprocess.TimeoutExpired:
                outcome, ok = "still running after 20 s", False
            except OSError as e:  # an argument past the system's limit
                outcome, ok = f"not started ({e.errno})", True
            a.record(what, outcome, time.monotonic() - start, ok)
    return a


def cluster(server, cluster_port):
    a = Attack("cluster port")
    if cluster_port is None:
        a.broken.append("no --cluster-port given")
        return a
    start = time.monotonic()
    idle = []
    for _ in range(300):
        try:
            idle.append(socket.create_connection((server.host, cluster_port), timeout=5))
        except OSError:
            break
    status, _ = server.request("GET", "/health", timeout=10)
    a.record(f"{len(idle)} idle connections, then GET /health", str(status),
             time.monotonic() - start, status == 200)
    for _ in range(20):
        try:
            s = socket.create_connection((server.host, cluster_port), timeout=5)
            s.sendall(os.urandom(4096))
            s.close()
        except OSError:
            pass
    status, _ = server.post("/v1/completions", {"prompt": "x", "max_tokens": 4})
    a.record("random bytes x 20, then a completion", str(status), time.monotonic() - start,
             status == 200)
    for s in idle:
        s.close()
    return a


CLASSES = {"schemas": schemas, "regexes": regexes, "gbnf": gbnfs, "tools": tools,
           "chat": chats, "completions": completions, "websocket": websockets_class}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--troupe")
    parser.add_argument("--cluster-port", type=int)
    parser.add_argument("--classes", default=",".join(list(CLASSES) + ["config", "cluster"]))
    args = parser.parse_args()
    server = Server(args.url)
    canary = Canary(server)
    canary.start()
    rows, failed = [], []
    for name in args.classes.split(","):
        canary.reset()
        if name == "config":
            attack = configs(server, args.troupe)
        elif name == "cluster":
            attack = cluster(server, args.cluster_port)
        else:
            attack = CLASSES[name](server)
        time.sleep(0.5)
        with canary.lock:
            canary_slowest, canary_failures, canary_count = (canary.slowest, canary.failures,
                                                             canary.count)
        status, _ = server.request("GET", "/health", timeout=10)
        alive = status == 200
        if canary_failures or canary_slowest > CANARY_BOUND_S:
            attack.broken.append(f"canary: {canary_failures} of {canary_count} failed, "
                                 f"slowest {canary_slowest:.2f} s")
        if not alive:
            attack.broken.append("the server did not answer /health after")
        outcomes = ", ".join(f"{k} x{v}" for k, v in sorted(attack.outcomes.items()))
        rows.append(f"| {attack.name} | {len(attack.tried)} | {outcomes} | "
                    f"{attack.slowest:.2f} s | {canary_count - canary_failures}/{canary_count}, "
                    f"slowest {canary_slowest:.2f} s | {'yes' if alive else 'NO'} |")
        failed += [f"{attack.name}: {b}" for b in attack.broken]
        print(rows[-1], flush=True)
    canary.stop = True
    # Nothing left behind.
    for _ in range(100):
        running, kv = server.metric("troupe_num_requests_running"), server.metric("troupe_kv_cache_usage_ratio")
        if running == 0 and kv == 0:
            break
        time.sleep(0.1)
    else:
        failed.append(f"after the attacks: {running} running, KV usage {kv}")
    print()
    print("| class | tries | outcomes | slowest answer | canary served | alive after |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    if failed:
        print("\nBROKEN:\n  " + "\n  ".join(failed))
        return 1
    print("\nevery class held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
