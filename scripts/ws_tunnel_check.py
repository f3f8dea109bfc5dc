#!/usr/bin/env python3
"""A WebSocket server and client with Python's `websockets`, to hold a tunnel to account.

`serve PORT` runs a server on 127.0.0.1:PORT. For each connection it answers the subprotocol
`chat`, records every message it gets, and, when the client sends "script", sends a text, a
1 MiB binary message, a message in three fragments and a ping; on "bye" it sends a digest of
all it received and closes with 4001 "server done".

`client URL [--deflate]` runs the client's side: a text, a 1 MiB binary message, a message in
three fragments, a ping (and its pong), "script", then "bye"; it prints its transcript as JSON:
the negotiated extension and subprotocol, every message it received (text as is, binary by
length and SHA-256), and the close code and reason. Run it directly against the server and
through a proxy: the transcripts must be identical.
"""

import asyncio
import hashlib
import json
import sys

import websockets

BIG = bytes((i * 2654435761 >> 13) & 0xFF for i in range(1024 * 1024))


def describe(message):
    if isinstance(message, str):
        return ["text", message]
    return ["binary", len(message), hashlib.sha256(message).hexdigest()]


async def handler(ws):
    received = []
    async for message in ws:
        if message == "script":
            await ws.send("from the server")
            await ws.send(BIG[::-1])
            await ws.send(iter(["frag", "ment", "ed"]))
            pong = await ws.ping(b"server ping")
            await asyncio.wait_for(pong, 10)
            await ws.send("pong received")
        elif message == "bye":
            await ws.send(json.dumps(received))
            await ws.close(4001, "server done")
            return
        else:
            received.append(describe(message))


async def serve(port):
    async with websockets.serve(
        handler, "127.0.0.1", port, subprotocols=["chat"], max_size=None, compression="deflate"
    ):
        await asyncio.Future()


async def client(url, deflate):
    transcript = {}
    async with websockets.connect(
        url,
        subprotocols=["chat"],
        compression="deflate" if deflate else None,
        max_size=None,
    ) as ws:
        transcript["extensions"] = ws.response.headers.get("sec-websocket-extensions")
        transcript["subprotocol"] = ws.subprotocol
        await ws.send("hello")
        await ws.send(BIG)
        await ws.send(iter(["cli", "ent frag", "ments"]))
        pong = await ws.ping(b"client ping")
        await asyncio.wait_for(pong, 10)
        await ws.send("script")
        got = []
        for _ in range(4):
            got.append(describe(await asyncio.wait_for(ws.recv(), 30)))
        await ws.send("bye")
        got.append(describe(await asyncio.wait_for(ws.recv(), 30)))
        try:
            await asyncio.wait_for(ws.recv(), 30)
        except websockets.ConnectionClosed as closed:
            rcvd = closed.rcvd
            transcript["close"] = [rcvd.code, rcvd.reason] if rcvd else None
        transcript["received"] = got
    print(json.dumps(transcript, sort_keys=True))


def main():
    if sys.argv[1] == "serve":
        asyncio.run(serve(int(sys.argv[2])))
    else:
        asyncio.run(client(sys.argv[2], "--deflate" in sys.argv[3:]))


if __name__ == "__main__":
    main()
