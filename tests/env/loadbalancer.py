#!/usr/bin/env python3
"""The environment's load balancer for Services of type LoadBalancer (cluster mode).

A cloud gives each LoadBalancer Service an address and sends what arrives there to the
Service's Pods; this does the same on the environment's own addresses, in the spirit of
cloud-provider-kind:

  * every Service of `type: LoadBalancer` gets an address from 127.N.7.0/24, kept for the
    Service's life, written to `status.loadBalancer.ingress`;
  * on that address it listens on each of the Service's TCP ports and passes each connection
    on, unchanged, to a Ready Pod the Service selects, at the port's targetPort (a number or
    a container port's name), round-robin, as an NLB in IP-target mode does.

Pods are picked from their own `status.podIP` rather than from EndpointSlices: the
environment's simulated HAProxy pods have loopback addresses, which EndpointSlices refuse.

    loadbalancer.py KUBECONFIG CA_FILE --net N

Only the Python standard library is used, as for the rest of the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kubelet import Api, ApiError  # noqa: E402

POLL = 0.3
FIRST_ADDRESS, LAST_ADDRESS = 1, 250


@dataclass
class Listener:
    server: asyncio.AbstractServer
    service: tuple[str, str]
    target: int | str


@dataclass
class Balancer:
    api: Api
    net: int
    addresses: dict[str, str] = field(default_factory=dict)  # Service UID → address
    listeners: dict[tuple[str, int], Listener] = field(default_factory=dict)
    services: dict[tuple[str, str], dict] = field(default_factory=dict)
    pods: list[dict] = field(default_factory=list)
    turn: itertools.count = field(default_factory=itertools.count)

    def allocate(self, uid: str) -> str:
        if uid not in self.addresses:
            taken = set(self.addresses.values())
            free = next(a for a in (f"127.{self.net}.7.{i}" for i in range(FIRST_ADDRESS, LAST_ADDRESS + 1))
                        if a not in taken)
            self.addresses[uid] = free
        return self.addresses[uid]

    def endpoints(self, service: tuple[str, str], target: int | str) -> list[tuple[str, int]]:
        spec = self.services.get(service, {}).get("spec", {})
        selector = spec.get("selector") or {}
        if not selector:
            return []
        found = []
        for pod in self.pods:
            meta, status = pod["metadata"], pod.get("status", {})
            labels = meta.get("labels") or {}
            if meta["namespace"] != service[0] or any(labels.get(k) != v for k, v in selector.items()):
                continue
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
            if not ready or not status.get("podIP") or meta.get("deletionTimestamp"):
                continue
            port = resolve(target, pod)
            if port is not None:
                found.append((status["podIP"], port))
        return sorted(found)

    async def handle(self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        listener = self.listeners.get(key)
        choices = self.endpoints(listener.service, listener.target) if listener else []
        if not choices:
            writer.close()
            return
        host, port = choices[next(self.turn) % len(choices)]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        for end in (writer, upstream_writer):
            end.close()

    async def reconcile(self) -> None:
        loop = asyncio.get_running_loop()
        services = (await loop.run_in_executor(None, self.api.call, "GET", "/api/v1/services")).get("items", [])
        self.pods = (await loop.run_in_executor(None, self.api.call, "GET", "/api/v1/pods")).get("items", [])
        wanted: dict[tuple[str, int], tuple[tuple[str, str], int | str]] = {}
        self.services = {}
        for service in services:
            meta, spec = service["metadata"], service.get("spec", {})
            if spec.get("type") != "LoadBalancer":
                continue
            key = (meta["namespace"], meta["name"])
            self.services[key] = service
            address = self.allocate(meta["uid"])
            for port in spec.get("ports", []):
                if port.get("protocol", "TCP") == "TCP":
                    wanted[(address, port["port"])] = (key, port.get("targetPort", port["port"]))
            ingress = [{"ip": address, "ipMode": "VIP"}]
            if service.get("status", {}).get("loadBalancer", {}).get("ingress") != ingress:
                path = f"/api/v1/namespaces/{meta['namespace']}/services/{meta['name']}/status"
                try:
                    await loop.run_in_executor(None, self.api.call, "PATCH", path,
                                               {"status": {"loadBalancer": {"ingress": ingress}}},
                                               "application/merge-patch+json")
                    print(f"loadbalancer: {key[0]}/{key[1]} at {address}", flush=True)
                except ApiError as error:
                    print(f"loadbalancer: {key[0]}/{key[1]}: {error}", flush=True)
        live_uids = {s["metadata"]["uid"] for s in services}
        self.addresses = {uid: a for uid, a in self.addresses.items() if uid in live_uids}
        for key in [k for k in self.listeners if k not in wanted]:
            self.listeners.pop(key).server.close()
        for key, (service, target) in wanted.items():
            if key in self.listeners:
                self.listeners[key].service, self.listeners[key].target = service, target
                continue
            try:
                server = await asyncio.start_server(lambda r, w, k=key: self.handle(k, r, w), key[0], key[1])
            except OSError as error:
                print(f"loadbalancer: cannot listen on {key[0]}:{key[1]}: {error}", flush=True)
                continue
            self.listeners[key] = Listener(server=server, service=service, target=target)


def resolve(target: int | str, pod: dict) -> int | None:
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for container in pod.get("spec", {}).get("containers", []):
        for port in container.get("ports") or []:
            if port.get("name") == target:
                return port.get("containerPort")
    return None


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies one direction until its end closes, then half-closes the other side."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, asyncio.IncompleteReadError):
        writer.close()


async def run(balancer: Balancer) -> None:
    print(f"loadbalancer: Services of type LoadBalancer get addresses from 127.{balancer.net}.7.0/24", flush=True)
    while True:
        try:
            await balancer.reconcile()
        except (OSError, ApiError, ValueError) as error:
            print(f"loadbalancer: {error}", flush=True)
            await asyncio.sleep(1)
        await asyncio.sleep(POLL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kubeconfig")
    parser.add_argument("ca_file")
    parser.add_argument("--net", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        asyncio.run(run(Balancer(Api.from_kubeconfig(args.kubeconfig, args.ca_file), args.net)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
