#!/usr/bin/env python3
"""An external authentication service speaking oauth2-proxy's protocol, for the auth-url tests.

Usage: auth_server.py IP:PORT

  ANY /oauth2/auth      -> 202 with X-Auth-Request-User and X-Auth-Request-Email when the cookie
                           _oauth2_proxy names a user (and Set-Cookie refreshing it); 403 for the
                           user "banned"; 401 without the cookie (oauth2-proxy's /oauth2/auth)
  POST /post-only/auth  -> as /oauth2/auth; any other method 405 (for auth-method)
  GET /oauth2/start     -> 302 to the identity provider (not followed by the tests)

Every answer of /oauth2/auth carries X-Auth-Saw: what the service was told of the request
(X-Original-URL, X-Original-Method, X-Forwarded-Host, X-Forwarded-Uri), so a test can check it.
"""

import sys
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "haptic-env-auth"

    def answer(self, status: int, headers: dict[str, str]):
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def auth(self):
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        user = cookie["_oauth2_proxy"].value if "_oauth2_proxy" in cookie else ""
        saw = " ".join(
            f"{name}={self.headers.get(name, '-')}"
            for name in ("X-Original-URL", "X-Original-Method", "X-Forwarded-Host", "X-Forwarded-Uri")
        )
        headers = {"X-Auth-Saw": saw}
        if not user:
            return self.answer(401, headers)
        if user == "banned":
            return self.answer(403, headers)
        headers["X-Auth-Request-User"] = user
        headers["X-Auth-Request-Email"] = f"{user}@example.com"
        headers["Set-Cookie"] = f"_oauth2_proxy={user}; Path=/; HttpOnly"
        return self.answer(202, headers)

    def route(self, method: str):
        path = urlparse(self.path).path
        if path == "/oauth2/auth":
            return self.auth()
        if path == "/post-only/auth":
            return self.auth() if method == "POST" else self.answer(405, {})
        if path == "/oauth2/start":
            return self.answer(302, {"Location": "https://idp.example/authorize"})
        return self.answer(404, {})

    def do_GET(self):  # noqa: N802 - the stdlib's naming
        self.route("GET")

    def do_POST(self):  # noqa: N802 - the stdlib's naming
        length = int(self.headers.get("Content-Length", "0") or "0")
        if length:
            self.rfile.read(length)
        self.route("POST")

    def do_HEAD(self):  # noqa: N802 - the stdlib's naming
        self.route("HEAD")

    def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
        sys.stderr.write("auth: " + (format % args) + "\n")


def main() -> int:
    host, port = sys.argv[1].rsplit(":", 1)
    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
