#!/usr/bin/env python3
"""Writes tests/fixtures/websocket/: real WebSocket frames from Python's `websockets` library, an
implementation independent of metronome's, for the frame reader's fixture test
(src/websocket/python_fixtures.rs).

Each scenario runs a client and a server of websockets' sans-I/O protocol against each other in
memory: the opening handshake (with or without permessage-deflate, as the scenario offers and
accepts), then each side sends what a Responses-API or Realtime session sends, with
fragmentation, control frames between fragments, 16- and 64-bit lengths, and a closing
handshake. It writes, per scenario:

  NAME.c2s, NAME.s2c  the bytes each side wrote after the handshake, exactly;
  NAME.json           the response's Sec-WebSocket-Extensions and, per direction, what was
                      sent: messages (inline up to 1 KiB, else length, FNV-1a 64 and the first
                      32 bytes), pings, pongs and the close.

Before writing, the peer's own parser reads every byte back, so a fixture is valid WebSocket.
The client masks with random keys, so each run writes different bytes; the fixtures are
committed and regenerated only by hand:

  pip install websockets && python3 scripts/gen-websocket-fixtures.py
"""
import json
import pathlib
import random

from websockets.client import ClientProtocol
from websockets.extensions.permessage_deflate import (
    ClientPerMessageDeflateFactory,
    ServerPerMessageDeflateFactory,
)
from websockets.frames import Opcode
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "websocket"
INLINE = 1024


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def handshake(client_ext, server_ext):
    client = ClientProtocol(parse_uri("ws://127.0.0.1/v1/realtime"), extensions=client_ext, max_size=None)
    server = ServerProtocol(extensions=server_ext, max_size=None)
    client.send_request(client.connect())
    server.receive_data(b"".join(client.data_to_send()))
    [request] = server.events_received()
    response = server.accept(request)
    server.send_response(response)
    client.receive_data(b"".join(server.data_to_send()))
    client.events_received()
    return client, server, response.headers.get("Sec-WebSocket-Extensions", "")


class Side:
    """One sender: its protocol object and the record of what it sent."""

    def __init__(self, protocol, compressed):
        self.protocol = protocol
        self.compressed = compressed
        self.events = []

    def message(self, kind, parts, between=None):
        """Sends one message in `parts` fragments, with a ping after the first when asked."""
        data = b"".join(parts)
        for i, part in enumerate(parts):
            fin = i + 1 == len(parts)
            if i == 0:
                send = self.protocol.send_text if kind == "text" else self.protocol.send_binary
                send(part, fin=fin)
            else:
                self.protocol.send_continuation(part, fin=fin)
            if i == 0 and between is not None and not fin:
                self.ping(between)
        event = {"kind": kind, "len": len(data), "fnv1a64": fnv1a64(data), "frames": len(parts),
                 "compressed": self.compressed}
        if len(data) <= INLINE:
            event["data_hex"] = data.hex()
        else:
            event["head_hex"] = data[:32].hex()
        self.events.append(event)

    def ping(self, data):
        self.protocol.send_ping(data)
        self.events.append({"ping_hex": data.hex()})

    def pong(self, data):
        self.protocol.send_pong(data)
        self.events.append({"pong_hex": data.hex()})

    def close(self, code, reason):
        self.protocol.send_close(code, reason)
        self.events.append({"close": [code, reason]})

    def wire(self):
        return b"".join(self.protocol.data_to_send())


def delta(i, word):
    return json.dumps({"type": "response.output_text.delta", "sequence_number": i,
                       "item_id": "msg_0a1b2c3d4e5f", "output_index": 0, "content_index": 0,
                       "delta": word, "logprobs": []}, separators=(",", ":")).encode()


def session(client, server, rng, big_binary):
    """What a Responses-over-WebSocket or Realtime session sends each way; the server's binary
    message has `big_binary` random bytes."""
    instructions = " ".join(rng.choice(["Answer", "briefly,", "cite", "sources", "and", "be",
                                        "kind."]) for _ in range(11000))
    client.message("text", [json.dumps({"type": "session.update",
                                        "session": {"instructions": instructions}}).encode()])
    create = json.dumps({"type": "response.create", "response": {"model": "gpt-test",
                         "input": [{"role": "user", "content": "Say hello"}]}}).encode()
    client.message("text", [create[:20], create[20:50], create[50:]], between=b"keepalive")
    client.message("binary", [bytes(rng.randrange(256) for _ in range(300))])
    client.message("text", [create])
    client.message("text", [create])

    server.message("text", [b'{"type":"response.created","response":{"id":"resp_1"}}'])
    for i, word in enumerate(["Hello", ",", " world", "!", " How", " are", " you", "?"]):
        server.message("text", [delta(i, word)])
    server.ping(b"srv-ping")
    client.pong(b"srv-ping")
    done = b'{"type":"response.completed","response":{"usage":{"output_tokens":8}}}'
    server.message("text", [done[:30], done[30:]], between=b"mid")
    server.message("binary", [bytes(rng.randrange(256) for _ in range(big_binary))])
    server.message("text", [b""])
    server.close(4000, "bye \u2713")
    client.close(1000, "done")


def read_back(receiver, wire):
    """Feeds `wire` to the peer's parser and returns the frames it decoded."""
    receiver.receive_data(wire)
    return [e for e in receiver.events_received()]


def check(sent, frames):
    got = []
    message = None
    for f in frames:
        if f.opcode in (Opcode.TEXT, Opcode.BINARY):
            message = bytearray(f.data)
        elif f.opcode is Opcode.CONT:
            message += f.data
        elif f.opcode is Opcode.PING:
            got.append({"ping_hex": bytes(f.data).hex()})
        elif f.opcode is Opcode.PONG:
            got.append({"pong_hex": bytes(f.data).hex()})
        if f.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT) and f.fin:
            got.append(fnv1a64(message))
    expected = [e["fnv1a64"] if "fnv1a64" in e else e for e in sent if "close" not in e]
    assert got == expected, (got, expected)


# name: (description, client's offer, server's acceptance, the server's random binary message's
# length: past 64 KiB for a 64-bit length once, shorter where it would only take room).
SCENARIOS = {
    "plain": ("no extension", None, None, 66000),
    "deflate": ("permessage-deflate, context takeover both ways, 32 KiB windows",
                ClientPerMessageDeflateFactory(),
                ServerPerMessageDeflateFactory(), 3000),
    "deflate_no_takeover": (
        "permessage-deflate without context takeover, windows of 2^10 (server) and 2^9 (client)",
        ClientPerMessageDeflateFactory(client_max_window_bits=True),
        ServerPerMessageDeflateFactory(server_no_context_takeover=True,
                                       client_no_context_takeover=True,
                                       server_max_window_bits=10, client_max_window_bits=9),
        3000),
}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (description, client_ext, server_ext, big_binary) in SCENARIOS.items():
        client, server, extensions = handshake(
            [client_ext] if client_ext else None, [server_ext] if server_ext else None)
        compressed = bool(extensions)
        c, s = Side(client, compressed), Side(server, compressed)
        session(c, s, random.Random(name), big_binary)
        c2s, s2c = c.wire(), s.wire()
        check(c.events, read_back(server, c2s))
        check(s.events, read_back(client, s2c))
        (OUT / f"{name}.c2s").write_bytes(c2s)
        (OUT / f"{name}.s2c").write_bytes(s2c)
        manifest = {"description": description, "extensions": extensions,
                    "client_to_server": c.events, "server_to_client": s.events}
        (OUT / f"{name}.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {extensions or '(none)'}; {len(c2s)} bytes client to server, "
              f"{len(s2c)} server to client")


if __name__ == "__main__":
    main()
