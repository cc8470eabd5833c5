#!/usr/bin/env python3
"""Small HTTP backends that answer with their own name, so a test can tell which one served it.

Usage: backend.py NAME=IP:PORT[=CERT.pem] ...   (one process serves them all; with a PEM file
holding a certificate and its key, that backend serves HTTPS with it)

  GET /anything      -> 200 "backend=NAME path=/anything host=HOST", header X-Backend: NAME,
                        then one line "header NAME: VALUE" per request header (any method)
  GET /stream?seconds=N -> a chunked answer with one line every 200 ms for N seconds
                           (a long-lived connection that must survive runtime changes)
  GET /slow?seconds=N   -> waits N seconds, then answers as /anything (for server timeouts)
  GET /healthz          -> 200 "ok", or 503 while a file NAME.sick exists in the directory
                           $HAPTIC_BACKEND_STATE names (a health check a test can fail)
  GET /status/NNN       -> as /anything, with status NNN (an application's error answer)
  any request with X-Code: NNN -> as /anything, with status NNN (an error-page service, as
                           ingress-nginx's default backend is asked for custom-http-errors)
"""

import os

import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def handler_for(name: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "haptic-env-backend"

        def do_GET(self):  # noqa: N802 - the stdlib's naming
            url = urlparse(self.path)
            if url.path == "/stream":
                return self.stream(float(parse_qs(url.query).get("seconds", ["10"])[0]))
            if url.path == "/healthz":
                state = os.environ.get("HAPTIC_BACKEND_STATE", "")
                sick = bool(state) and os.path.exists(os.path.join(state, f"{name}.sick"))
                body = b"sick\n" if sick else b"ok\n"
                self.send_response(503 if sick else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return None
            if url.path == "/slow":
                time.sleep(float(parse_qs(url.query).get("seconds", ["1"])[0]))
            lines = [f"backend={name} path={url.path} host={self.headers.get('Host', '')}"]
            lines += [f"header {key.lower()}: {value}" for key, value in self.headers.items()]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(self.status_asked(url.path))
            self.send_header("Content-Type", "text/plain")
            self.send_header("X-Backend", name)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def status_asked(self, path: str) -> int:
            asked = self.headers.get("X-Code", "")
            if path.startswith("/status/"):
                asked = path[len("/status/"):]
            return int(asked) if asked.isdigit() and 200 <= int(asked) <= 599 else 200

        def do_POST(self):  # noqa: N802 - the stdlib's naming
            # The body is read (and counted) so the connection stays usable.
            length = int(self.headers.get("Content-Length", "0") or "0")
            if length:
                self.rfile.read(length)
            return self.do_GET()

        def do_OPTIONS(self):  # noqa: N802 - the stdlib's naming
            return self.do_GET()

        do_PUT = do_GET  # noqa: N815
        do_DELETE = do_GET  # noqa: N815

        def stream(self, seconds: float):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("X-Backend", name)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            deadline = time.monotonic() + seconds
            tick = 0
            while time.monotonic() < deadline:
                line = f"backend={name} tick={tick}\n".encode()
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
                tick += 1
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
            sys.stderr.write(f"{name}: {format % args}\n")

    return Handler


def main() -> int:
    servers = []
    for spec in sys.argv[1:]:
        name, address = spec.split("=", 1)
        address, _, certificate = address.partition("=")
        host, port = address.rsplit(":", 1)
        server = ThreadingHTTPServer((host, int(port)), handler_for(name))
        if certificate:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certificate)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        servers.append(server)
        print(f"{name} listening on {host}:{port}", flush=True)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
