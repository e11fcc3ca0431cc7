#!/usr/bin/python3
"""Streams two requests over one WebSocket to `troupe serve` and cancels one.

Needs Debian's python3-websockets (scripts/setup.sh installs it); run it with
/usr/bin/python3, not a pyenv python. Usage:
    /usr/bin/python3 examples/websocket_client.py [ws://127.0.0.1:8000/v1/ws]
"""
import asyncio
import json
import sys

import websockets


async def main(url: str) -> None:
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "generate", "id": "story", "prompt": "Once upon a time",
                                  "max_tokens": 200, "ignore_eos": True}))
        await ws.send(json.dumps({"type": "generate", "id": "chat", "max_tokens": 12,
                                  "messages": [{"role": "user", "content": "Hello!"}]}))
        texts = {"story": "", "chat": ""}
        done = {}
        while len(done) < 2:
            frame = json.loads(await ws.recv())
            if frame["type"] == "error":
                raise SystemExit(f"error: {frame['error']['message']}")
            texts[frame["id"]] += frame.get("text", "")
            if frame["type"] == "done":
                done[frame["id"]] = frame["finish_reason"]
                print(f"[{frame['id']}] done: {frame['finish_reason']}, usage {frame['usage']}")
                if frame["id"] == "chat":  # the story is likely still running: stop it
                    await ws.send(json.dumps({"type": "cancel", "id": "story"}))
        for request_id, text in texts.items():
            print(f"[{request_id}] {text!r}")
        # The story stops with "abort" when the cancel arrives first; a very fast model may
        # have finished it ("length") before this client read the chat's end.
        assert done["chat"] in ("length", "stop") and done["story"] in ("abort", "length"), done


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8000/v1/ws"))
