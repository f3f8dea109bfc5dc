#!/usr/bin/env python3
"""Drive metronome sim's WebSocket endpoints with clients that are not metronome's own.

Python's `websockets` client (its own framing, permessage-deflate and fragment reassembly)
runs two responses on one Responses socket and a text and a spoken response on one Realtime
socket, and checks the message sequences against what the sim's flags promise. When the
`openai` SDK is installed, its Realtime client (`client.realtime.connect`) and its Responses
WebSocket client (`client.responses.connect`) drive the same sim through a base URL, offline.

Usage: ws_crosscheck.py BASE_URL TOKENS [--deflate] [--fragment N] [--close CODE:REASON]
  BASE_URL  the sim, http://127.0.0.1:PORT
  TOKENS    the sim's --tokens (each response has exactly that many answer tokens)
Prints one line per check and `N passed, N failed` at the end; exits 1 on any failure.
"""

import argparse
import asyncio
import base64
import json
import sys

import websockets

RESULTS = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    RESULTS["passed" if ok else "failed"] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + detail}")


async def read_until(ws, last_types):
    """Messages (parsed) up to and including the first whose type is in `last_types`."""
    events = []
    while True:
        message = await asyncio.wait_for(ws.recv(), timeout=30)
        assert isinstance(message, str), "every sim message is text"
        event = json.loads(message)
        events.append(event)
        if event["type"] in last_types:
            return events


async def responses_raw(ws_base, tokens, args):
    compression = "deflate" if args.deflate else None
    async with websockets.connect(
        ws_base + "/v1/responses", compression=compression, max_size=None
    ) as ws:
        extensions = ws.response.headers.get("sec-websocket-extensions") or ""
        check(
            "responses: permessage-deflate as offered",
            ("permessage-deflate" in extensions) == args.deflate,
            extensions,
        )
        for k in range(2):
            create = {"type": "response.create", "model": "m", "input": "hi"}
            await ws.send(json.dumps(create))
            events = await read_until(ws, {"response.completed", "response.incomplete", "error"})
            kinds = [e["type"] for e in events]
            deltas = [e for e in events if e["type"] == "response.output_text.delta"]
            check(f"responses #{k + 1}: {tokens} text deltas", len(deltas) == tokens, str(kinds))
            check(
                f"responses #{k + 1}: sequence numbers from 0",
                [e["sequence_number"] for e in events] == list(range(len(events))),
            )
            text = "".join(d["delta"] for d in deltas)
            done = events[-1]["response"]
            check(
                f"responses #{k + 1}: the completed output is the deltas",
                done["output"][0]["content"][0]["text"] == text,
            )
            check(
                f"responses #{k + 1}: usage counts every token",
                done["usage"]["output_tokens"] == tokens,
            )
        if args.close:
            code, _, reason = args.close.partition(":")
            try:
                await asyncio.wait_for(ws.recv(), timeout=10)
                check("responses: the server closes", False, "a message came instead")
            except websockets.ConnectionClosed as closed:
                rcvd = closed.rcvd
                check(
                    "responses: the server's close code and reason",
                    rcvd is not None and rcvd.code == int(code) and rcvd.reason == reason,
                    str(rcvd),
                )


async def realtime_raw(ws_base, tokens, args):
    compression = "deflate" if args.deflate else None
    async with websockets.connect(
        ws_base + "/v1/realtime?model=sim-model",
        compression=compression,
        subprotocols=["realtime"],
        max_size=None,
    ) as ws:
        check("realtime: the subprotocol is answered", ws.subprotocol == "realtime", str(ws.subprotocol))
        created = json.loads(await ws.recv())
        check("realtime: session.created first", created["type"] == "session.created")
        update = {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}
        await ws.send(json.dumps(update))
        await read_until(ws, {"session.updated"})
        await ws.send(json.dumps({"type": "response.create"}))
        events = await read_until(ws, {"response.done"})
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        check(f"realtime text: {tokens} text deltas", len(deltas) == tokens)
        spoken = {"type": "response.create", "response": {"output_modalities": ["audio"]}}
        await ws.send(json.dumps(spoken))
        events = await read_until(ws, {"response.done"})
        transcript = [e for e in events if e["type"] == "response.output_audio_transcript.delta"]
        audio = [e for e in events if e["type"] == "response.output_audio.delta"]
        check(f"realtime audio: {tokens} transcript deltas", len(transcript) == tokens)
        check(f"realtime audio: {tokens} audio deltas", len(audio) == tokens)
        pcm = b"".join(base64.b64decode(a["delta"]) for a in audio)
        check("realtime audio: whole 16-bit samples", len(pcm) > 0 and len(pcm) % 2 == 0, str(len(pcm)))
        usage = events[-1]["response"]["usage"]
        check("realtime audio: usage counts the answer as audio", usage["output_token_details"]["audio_tokens"] == tokens)


async def openai_sdk(base, tokens):
    try:
        import openai
    except ImportError:
        print("skip the openai SDK: not installed")
        return
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sim")
    try:
        async with client.realtime.connect(model="sim-model") as connection:
            await connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            await connection.response.create()
            deltas = 0
            async for event in connection:
                if event.type == "response.output_text.delta":
                    deltas += 1
                if event.type == "response.done":
                    check(f"openai SDK realtime: {tokens} text deltas", deltas == tokens, str(deltas))
                    check("openai SDK realtime: usage parsed", event.response.usage.output_tokens == tokens)
                    break
    except Exception as e:  # noqa: BLE001 - any failure of the SDK is the finding
        check("openai SDK realtime client", False, repr(e))
    connect = getattr(client.responses, "connect", None)
    if connect is None:
        print("skip the openai SDK's Responses WebSocket: this SDK version has none")
        return
    try:
        async with connect() as connection:
            for k in range(2):
                await connection.response.create(model="sim-model", input="hi")
                deltas = 0
                async for event in connection:
                    if event.type == "response.output_text.delta":
                        deltas += 1
                    if event.type in ("response.completed", "response.incomplete"):
                        break
                check(f"openai SDK responses #{k + 1}: {tokens} text deltas", deltas == tokens, str(deltas))
    except Exception as e:  # noqa: BLE001
        check("openai SDK responses WebSocket client", False, repr(e))


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("tokens", type=int)
    parser.add_argument("--deflate", action="store_true")
    parser.add_argument("--close")
    parser.add_argument("--sdk", action="store_true", help="also drive the sim with the openai SDK")
    args = parser.parse_args()
    ws_base = args.base.replace("http://", "ws://", 1)
    await responses_raw(ws_base, args.tokens, args)
    if not args.close:
        await realtime_raw(ws_base, args.tokens, args)
    if args.sdk:
        await openai_sdk(args.base, args.tokens)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
