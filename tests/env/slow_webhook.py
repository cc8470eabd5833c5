#!/usr/bin/env python3
"""An admission webhook that allows every review only after a delay: registered for the status
and Event writes of one namespace, it makes the real API server take as long as the delay (or
its webhook timeout) to answer them, as an overloaded API server would.

Usage: slow_webhook.py CERT KEY PORT_FILE DELAY_SECONDS
Serves HTTPS on 127.0.0.1 (a free port, written to PORT_FILE) until killed. Standard library only.
"""

import json
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Handler(BaseHTTPRequestHandler):
    delay = 0.0

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("Content-Length", "0"))
        review = json.loads(self.rfile.read(length) or b"{}")
        time.sleep(self.delay)
        uid = review.get("request", {}).get("uid", "")
        answer = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "response": {"uid": uid, "allowed": True}}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        except OSError:
            pass  # the API server gave up waiting

    def log_message(self, *_args) -> None:
        pass


def main() -> None:
    cert, key, port_file, delay = sys.argv[1:5]
    Handler.delay = float(delay)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
