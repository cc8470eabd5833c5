#!/usr/bin/env python3
"""The environment's stand-in for kubelet's readiness probing.

No kubelet runs here, so something must do what it does for a Pod: run each container's
readiness probe as the Pod declares it (httpGet, tcpSocket; periodSeconds, timeoutSeconds,
successThreshold, failureThreshold), and write the results to the Pod's status:
`containerStatuses[].ready` and the `ContainersReady` and `Ready` conditions. Pods start
NotReady and become Ready from their real probes against the real HAProxy and Dataplane API.

    prober.py KUBECONFIG CA_FILE LABEL_SELECTOR

It watches every Pod matching LABEL_SELECTOR in every namespace (tests register the same
simulated pods in namespaces of their own), probing each address once per period however
many Pod objects share it. Only the Python standard library is used.
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

TICK = 0.25


@dataclass
class ProbeState:
    """Kubelet's view of one container's probe: the result and the streak behind it."""

    ready: bool = False
    successes: int = 0
    failures: int = 0
    next_due: float = 0.0
    # What the probe checked last, for messages.
    detail: str = ""
    seen: float = field(default_factory=time.monotonic)


def read_kubeconfig(path: str) -> tuple[str, str]:
    server = token = ""
    for line in open(path, encoding="utf-8").read().splitlines():
        stripped = line.strip()
        if stripped.startswith("server:"):
            server = stripped.split(":", 1)[1].strip()
        elif stripped.startswith("token:"):
            token = stripped.split(":", 1)[1].strip()
    return server, token


def resolve_port(port, container: dict) -> int | None:
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return declared.get("containerPort")
    return None


def run_probe(probe: dict, container: dict, ip: str) -> tuple[bool, str]:
    """One readiness probe, as kubelet runs it: HTTP 200-399, or a TCP connection accepted."""
    timeout = float(probe.get("timeoutSeconds", 1))
    if "httpGet" in probe:
        action = probe["httpGet"]
        port = resolve_port(action.get("port"), container)
        url = f"http://{ip}:{port}{action.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return 200 <= response.status < 400, f"GET {url}: {response.status}"
        except urllib.error.HTTPError as error:
            return 200 <= error.code < 400, f"GET {url}: {error.code}"
        except (OSError, ValueError) as error:
            return False, f"GET {url}: {error}"
    if "tcpSocket" in probe:
        port = resolve_port(probe["tcpSocket"].get("port"), container)
        try:
            with socket.create_connection((ip, port), timeout=timeout):
                return True, f"TCP {ip}:{port}: connected"
        except OSError as error:
            return False, f"TCP {ip}:{port}: {error}"
    return True, "no probe action this stand-in knows: ready"


def probe_once(state: ProbeState, probe: dict, container: dict, ip: str, now: float) -> None:
    """Runs a due probe and moves its state as kubelet does: Ready after successThreshold
    successes in a row, not Ready after failureThreshold failures; next due a period later."""
    ok, state.detail = run_probe(probe, container, ip)
    if ok:
        state.successes, state.failures = state.successes + 1, 0
        if state.successes >= int(probe.get("successThreshold", 1)):
            state.ready = True
    else:
        state.successes, state.failures = 0, state.failures + 1
        if state.failures >= int(probe.get("failureThreshold", 3)):
            state.ready = False
    state.next_due = now + float(probe.get("periodSeconds", 10))


class Prober:
    def __init__(self, kubeconfig: str, ca_file: str, selector: str):
        self.server, self.token = read_kubeconfig(kubeconfig)
        self.context = ssl.create_default_context(cafile=ca_file)
        self.selector = selector
        # One state per (address, container name, probe): pods sharing an address share it.
        self.states: dict[tuple[str, str, str], ProbeState] = {}

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/merge-patch+json")
        with urllib.request.urlopen(request, context=self.context, timeout=10) as response:
            return json.loads(response.read() or b"{}")

    def probe_due(self, now: float, ip: str, container: dict) -> ProbeState:
        probe = container.get("readinessProbe")
        key = (ip, container["name"], json.dumps(probe, sort_keys=True))
        state = self.states.setdefault(key, ProbeState())
        state.seen = now
        if probe is None:
            state.ready = True
            return state
        if now >= state.next_due:
            probe_once(state, probe, container, ip, now)
        return state

    def desired_status(self, pod: dict, now: float) -> dict | None:
        status = pod.get("status", {})
        ip = status.get("podIP")
        if not ip or status.get("phase") != "Running":
            return None
        started = status.get("startTime") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        containers = []
        for container in pod["spec"]["containers"]:
            state = self.probe_due(now, ip, container)
            containers.append({"name": container["name"], "ready": state.ready, "started": True,
                               "restartCount": 0, "image": container.get("image", ""), "imageID": "",
                               "state": {"running": {"startedAt": started}}})
        all_ready = all(c["ready"] for c in containers)
        flag = "True" if all_ready else "False"
        conditions = [{"type": "Initialized", "status": "True"},
                      {"type": "ContainersReady", "status": flag},
                      {"type": "Ready", "status": flag},
                      {"type": "PodScheduled", "status": "True"}]
        return {"containerStatuses": containers, "conditions": conditions, "startTime": started}

    @staticmethod
    def differs(current: dict, wanted: dict) -> bool:
        def ready_of(status):
            return ({c["name"]: c.get("ready") for c in status.get("containerStatuses") or []},
                    {c["type"]: c.get("status") for c in status.get("conditions") or []})
        return ready_of(current) != ready_of(wanted)

    def tick(self) -> None:
        now = time.monotonic()
        query = urllib.parse.urlencode({"labelSelector": self.selector})
        pods = self.call("GET", f"/api/v1/pods?{query}").get("items", [])
        for pod in pods:
            wanted = self.desired_status(pod, now)
            if wanted is None or not self.differs(pod.get("status", {}), wanted):
                continue
            meta = pod["metadata"]
            try:
                self.call("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                          {"status": wanted})
            except urllib.error.HTTPError as error:
                if error.code != 404:  # deleted meanwhile
                    raise
        # Forget addresses nobody asked about for a while.
        self.states = {k: v for k, v in self.states.items() if now - v.seen < 60}


def main() -> int:
    kubeconfig, ca_file, selector = sys.argv[1:4]
    prober = Prober(kubeconfig, ca_file, selector)
    print(f"prober: probing pods matching {selector}", flush=True)
    while True:
        try:
            prober.tick()
        except (OSError, urllib.error.URLError, ValueError) as error:
            # The API server restarts in some tests; kubelet keeps going too.
            print(f"prober: {error}", flush=True)
            time.sleep(1)
        time.sleep(TICK)


if __name__ == "__main__":
    sys.exit(main())
