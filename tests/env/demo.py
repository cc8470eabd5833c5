#!/usr/bin/env python3
"""The first half of `make demo`: the environment's own plumbing, before the controller runs
(tests/demo.rs is the second half): a raw HAProxy configuration is pushed through one pod's
Dataplane API, the reload it queues is followed until it succeeds, and a request through that
pod's HAProxy is answered by a backend.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

ROUTING_TEMPLATE = Path(__file__).resolve().parent / "templates" / "route-to-backend.cfg"


def routing_config(backend: dict) -> str:
    text = ROUTING_TEMPLATE.read_text()
    for key, value in (("BACKEND_NAME", backend["name"]), ("BACKEND_IP", backend["ip"]), ("BACKEND_PORT", str(backend["port"]))):
        text = text.replace("{{" + key + "}}", value)
    return text


def call(url: str, auth: str, method: str = "GET", body: bytes | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={"Authorization": auth, "Content-Type": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def push_through_dataplane(api: str, auth: str, config: str, backend: str) -> bool:
    _, _, version = call(f"{api}/services/haproxy/configuration/version", auth)
    status, headers, body = call(f"{api}/services/haproxy/configuration/raw?version={int(version)}", auth, "POST",
                                 config.encode())
    if status not in (201, 202):
        print(f"demo: push to {api} failed: {status} {body.decode(errors='replace')}", file=sys.stderr)
        return False
    # Header names are case-insensitive; v3.2.7 sends `Reload-Id`.
    reload_id = headers.get("reload-id")
    print(f"demo: pushed a configuration routing to {backend} through {api} (HTTP {status}, reload {reload_id})")
    deadline = time.monotonic() + 30
    while reload_id and time.monotonic() < deadline:
        _, _, answer = call(f"{api}/services/haproxy/reloads/{reload_id}", auth)
        state = json.loads(answer).get("status")
        if state == "succeeded":
            print(f"demo: reload {reload_id} succeeded")
            return True
        if state == "failed":
            print(f"demo: reload {reload_id} failed: {answer.decode()}", file=sys.stderr)
            return False
        time.sleep(0.2)
    if reload_id:
        print(f"demo: reload {reload_id} did not finish within 30s", file=sys.stderr)
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()
    env = json.loads((Path(args.state_dir) / "env.json").read_text())
    pod, backend = env["pods"][0], env["backends"][0]
    creds = env["dataplane"]
    auth = "Basic " + b64encode(f"{creds['username']}:{creds['password']}".encode()).decode()

    config = routing_config(backend)
    if not push_through_dataplane(pod["dataplane_url"], auth, config, backend["name"]):
        return 1

    url = f"http://{pod['http_address']}/hello"
    for _ in range(50):
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                answer = response.read().decode().strip()
                if f"backend={backend['name']}" in answer:
                    print(f"demo: GET {url} -> {response.status} {answer!r}")
                    return 0
        except urllib.error.URLError:
            pass
        time.sleep(0.2)
    print(f"demo: {url} was not answered by {backend['name']}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
