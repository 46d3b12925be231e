#!/usr/bin/env python3
"""A fault-injecting HTTP proxy for the S3 tests (tests/s3/s3_harness.h: FaultProxy).

Listens on a free 127.0.0.1 port (written to --port-file) and forwards every request unchanged,
Host header and body included, to 127.0.0.1:--upstream-port, so SigV4 signatures still verify.
Requests to /__fault?... are its control: mode=none|500|503|slowdown|reset|delay, count=N (the
next N matching requests), fraction=F (then each with probability F), match=S (only requests
whose "METHOD /path?query" contains S), delay_ms=D; /__fault?conditional=501 answers every PUT
carrying If-None-Match with 501 NotImplemented, as stores without conditional writes do
(conditional=pass forwards them again), independently of the other faults; /__fault?stats=1
answers the number of faults injected so far. With --tls-cert and --tls-key it speaks HTTPS
(control requests too): a TLS-terminating proxy in front of a plain-HTTP store. It only ever
connects to loopback.
"""

import argparse
import http.client
import http.server
import os
import random
import socket
import ssl
import struct
import threading
import time
import urllib.parse

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te"}
SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
ERROR_500 = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
ERROR_503 = b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
NOT_IMPLEMENTED = (
    b"<Error><Code>NotImplemented</Code><Message>A header you provided implies functionality "
    b"that is not implemented (If-None-Match)</Message></Error>"
)


class Faults:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.mode = "none"
        self.count = 0
        self.fraction = 0.0
        self.match = ""
        self.delay_ms = 0
        self.injected = 0
        self.conditional_501 = False

    def pick(self, what: str) -> tuple[str, int]:
        """The fault for this request ("none" to forward it) and the delay."""
        with self.lock:
            if self.mode == "none" or self.match not in what:
                return "none", 0
            if self.count > 0:
                self.count -= 1
            elif self.fraction <= 0 or random.random() >= self.fraction:
                return "none", 0
            self.injected += 1
            return self.mode, self.delay_ms

    def refuse_conditional(self) -> bool:
        """Whether to answer this conditional PUT 501 (counted as a fault)."""
        with self.lock:
            if self.conditional_501:
                self.injected += 1
            return self.conditional_501


FAULTS = Faults()
UPSTREAM_PORT = 0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def control(self) -> None:
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query, keep_blank_values=True)
        if "stats" in q:
            with FAULTS.lock:
                body = str(FAULTS.injected).encode()
        elif "conditional" in q:
            with FAULTS.lock:
                FAULTS.conditional_501 = q["conditional"][0] == "501"
            body = b"ok"
        else:
            with FAULTS.lock:
                FAULTS.mode = q.get("mode", ["none"])[0]
                FAULTS.count = int(q.get("count", ["0"])[0])
                FAULTS.fraction = float(q.get("fraction", ["0"])[0])
                FAULTS.match = q.get("match", [""])[0]
                FAULTS.delay_ms = int(q.get("delay_ms", ["0"])[0])
            body = b"ok"
        self.send_response_only(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def reply(self, status: int, body: bytes) -> None:
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def reset(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def handle_one(self) -> None:
        if self.path.startswith("/__fault"):
            self.control()
            return
        length = int(self.headers.get("Content-Length", "0") or "0")
        body = self.rfile.read(length) if length > 0 else b""
        conditional = self.command == "PUT" and self.headers.get("If-None-Match") is not None
        if conditional and FAULTS.refuse_conditional():
            self.reply(501, NOT_IMPLEMENTED)
            return
        mode, delay_ms = FAULTS.pick(f"{self.command} {self.path}")
        if mode == "reset":
            self.reset()
            return
        if mode == "500":
            self.reply(500, ERROR_500)
            return
        if mode == "503":
            self.reply(503, ERROR_503)
            return
        if mode == "slowdown":
            self.reply(503, SLOWDOWN)
            return
        if mode == "delay":
            time.sleep(delay_ms / 1000.0)
        self.forward(body)

    def forward(self, body: bytes) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", UPSTREAM_PORT, timeout=120)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    conn.putheader(name, value)
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            data = resp.read()
        except OSError:
            self.reply(502, b"<Error><Code>BadGateway</Code><Message>upstream</Message></Error>")
            return
        finally:
            conn.close()
        self.send_response_only(resp.status, resp.reason)
        upstream_length = None
        for name, value in resp.getheaders():
            low = name.lower()
            if low == "content-length":
                upstream_length = value
            elif low not in HOP_BY_HOP:
                self.send_header(name, value)
        # HEAD: the object's size, as the store said; otherwise what is sent.
        length = upstream_length if self.command == "HEAD" and upstream_length else str(len(data))
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def setup(self) -> None:
        # TLS: the handshake runs here, on the connection's own thread (a client that refuses
        # the certificate ends only its connection).
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one


class TlsServer(http.server.ThreadingHTTPServer):
    """Accepts TLS connections with `context` (the handshake happens in Handler.setup)."""

    context: ssl.SSLContext

    def get_request(self) -> tuple[socket.socket, object]:
        sock, addr = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr


def main() -> None:
    global UPSTREAM_PORT
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="the certificate's private key (PEM)")
    args = parser.parse_args()
    UPSTREAM_PORT = args.upstream_port
    server: http.server.ThreadingHTTPServer
    if args.tls_cert:
        server = TlsServer(("127.0.0.1", 0), Handler)
        server.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.context.load_cert_chain(args.tls_cert, args.tls_key)
    else:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
