#!/usr/bin/env python3
"""A deterministic streaming upstream for the end-to-end script: answers every POST with the same
SSE body (read from a file), written in chunks with small pauses, as HTTP/1.1 chunked encoding.
Usage: fixture_upstream.py PORT FILE"""
import http.server
import sys
import time

PORT = int(sys.argv[1])
BODY = open(sys.argv[2], "rb").read()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        # Uneven chunks, cut anywhere (inside events and line ends), a few ms apart.
        sizes = [1, 7, 64, 3, 200, 2, 512]
        pos, i = 0, 0
        while pos < len(BODY):
            piece = BODY[pos:pos + sizes[i % len(sizes)]]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            pos += len(piece)
            i += 1
            time.sleep(0.002)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
