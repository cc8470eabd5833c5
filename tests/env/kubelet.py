#!/usr/bin/env python3
"""The environment's process kubelet: a node agent that runs Pods as local processes.

The cluster mode of the environment (`envctl.py up --cluster`) runs a real scheduler and
controller manager, so Deployments become ReplicaSets and Pods bound to a Node. Something must
then do what kubelet does for those Pods, and this does it, on one Node:

  * registers the Node (InternalIP 127.N.4.1, kubelet port 10250) and renews its Lease;
  * gives each Pod a network namespace of its own, `hpt<N>p<k>`, with one address from
    198.19.N.0/24 on a bridge, `hptpod<N>`, that routes nowhere else (no forwarding, no
    default route in the Pod);
  * materialises its secret, configMap, emptyDir and downwardAPI volumes, retrying a Secret or
    ConfigMap that does not exist yet, as kubelet does, and bind-mounts them in a mount
    namespace of the Pod's own;
  * resolves the containers' environment (values, fieldRef, secretKeyRef, configMapKeyRef);
  * maps each image to a local binary (IMAGES); an image it cannot run is `ErrImagePull`;
  * starts each container's process, restarts it with back-off as its restartPolicy says,
    runs readiness probes (prober.py's), and writes the Pod's status: phase, IPs, conditions
    and container statuses;
  * finishes deletions: SIGTERM, SIGKILL after the grace period, the sandbox removed, then the
    Pod deleted with a UID precondition;
  * serves container logs on https://127.N.4.1:10250/containerLogs/... , which the API server
    proxies for `pods/<name>/log`.

    kubelet.py KUBECONFIG CA_FILE --net N --state-dir DIR --binaries DIR

Only the Python standard library is used, as for the rest of the environment.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.server
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prober import ProbeState, probe_once, read_kubeconfig  # noqa: E402

TICK = 0.2
KUBELET_PORT = 10250
LEASE_SECONDS = 40
LEASE_RENEW = 10.0
FIRST_POD_ADDRESS, LAST_POD_ADDRESS = 10, 250
BACKOFF_START, BACKOFF_MAX = 10.0, 300.0
# Images of the Gateway API conformance suite, as binaries built from their Go modules
# (`envctl.py conformance-build`), with the environment each needs on top of the Pod's.
# CoreDNS is stood in for by echo-basic's UDP echo on :53: the suite only needs its Pod
# Ready, haptic serves no UDP, and its Corefile forwards to public resolvers.
IMAGES = {
    "registry.k8s.io/gateway-api/echo-basic": ("echo-basic", {}),
    "gcr.io/k8s-staging-gateway-api/echo-basic": ("echo-basic", {}),
    "registry.k8s.io/coredns/coredns": ("echo-basic", {"UDP_ECHO_SERVER": "1", "UDP_PORT": "53"}),
}


def node_name(net: int) -> str:
    return f"haptic-env-{net}"


def node_address(net: int) -> str:
    return f"127.{net}.4.1"


def bridge_name(net: int) -> str:
    return f"hptpod{net}"


def now_rfc3339(nanos: bool = False) -> str:
    moment = datetime.datetime.now(datetime.timezone.utc)
    if nanos:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """An RFC 3339 time (seconds, with or without fractions) as a Unix time."""
    text = text.strip().replace("Z", "+00:00")
    if "." in text:
        head, rest = text.split(".", 1)
        digits = "".join(ch for ch in rest if ch.isdigit())
        zone = rest[len(digits):]
        text = f"{head}.{digits[:6].ljust(6, '0')}{zone}"
    return datetime.datetime.fromisoformat(text).timestamp()


def image_binary(image: str, binaries: Path) -> tuple[Path, dict[str, str]] | None:
    """The local binary standing in for `image` (repository without tag or digest)."""
    repository = image.split("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    mapped = IMAGES.get(repository)
    if mapped is None:
        return None
    return binaries / mapped[0], dict(mapped[1])


class ApiError(Exception):
    def __init__(self, code: int, text: str):
        super().__init__(f"{code} {text}")
        self.code = code


class Api:
    """The API server, as the environment's admin (envctl.py's `KubeAPI` is this too)."""

    def __init__(self, server: str, token: str, ca_file: str):
        self.server, self.token = server, token
        self.context = ssl.create_default_context(cafile=str(ca_file))

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str, ca_file: str) -> "Api":
        return cls(*read_kubeconfig(kubeconfig), ca_file)

    def call(self, method: str, path: str, body: dict | None = None,
             content_type: str = "application/json") -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=10) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            raise ApiError(error.code, error.read().decode(errors="replace")) from None


# --------------------------------------------------------------------------- pod network


def run_ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def must_ip(*args: str) -> None:
    done = run_ip(*args)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` said: {done.stderr.strip()}")


def pod_netns(net: int, index: int) -> str:
    return f"hpt{net}p{index}"


def pod_veth(net: int, index: int) -> str:
    return f"hpv{net}p{index}"


def make_bridge(net: int) -> None:
    remove_network(net)
    name = bridge_name(net)
    must_ip("link", "add", name, "type", "bridge")
    must_ip("addr", "add", f"198.19.{net}.1/24", "dev", name)
    must_ip("link", "set", name, "up")


def remove_network(net: int) -> list[str]:
    """Removes every Pod sandbox and the bridge of environment `net`; returns what is left."""
    for namespace in run_ip("netns", "list").stdout.split():
        if namespace.startswith(f"hpt{net}p"):
            run_ip("netns", "del", namespace)
    for line in run_ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(f"hpv{net}p"):
            run_ip("link", "del", name)
    run_ip("link", "del", bridge_name(net))
    left = [n for n in run_ip("netns", "list").stdout.split() if n.startswith(f"hpt{net}p")]
    if run_ip("link", "show", bridge_name(net)).returncode == 0:
        left.append(f"link {bridge_name(net)}")
    return left


def make_sandbox(net: int, index: int) -> str:
    """A network namespace for one Pod with 198.19.N.<index> on the bridge; returns the IP."""
    namespace, veth, ip = pod_netns(net, index), pod_veth(net, index), f"198.19.{net}.{index}"
    remove_sandbox(net, index)
    must_ip("netns", "add", namespace)
    must_ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
    must_ip("link", "set", veth, "master", bridge_name(net))
    must_ip("link", "set", veth, "up")
    must_ip("-n", namespace, "addr", "add", f"{ip}/24", "dev", "eth0")
    must_ip("-n", namespace, "link", "set", "eth0", "up")
    must_ip("-n", namespace, "link", "set", "lo", "up")
    return ip


def remove_sandbox(net: int, index: int) -> None:
    run_ip("netns", "del", pod_netns(net, index))
    run_ip("link", "del", pod_veth(net, index))


# --------------------------------------------------------------------------- pods


@dataclass
class ContainerRun:
    spec: dict
    log_path: Path
    process: subprocess.Popen | None = None
    started_at: str = ""
    restarts: int = 0
    last_terminated: dict | None = None
    terminated: dict | None = None
    next_start: float = 0.0
    backoff: float = BACKOFF_START
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    probe: ProbeState = field(default_factory=ProbeState)
    probe_from: float = 0.0


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    index: int
    directory: Path
    containers: dict[str, ContainerRun]
    ip: str = ""
    start_time: str = ""
    waiting_for: str = ""
    terminating_until: float | None = None
    last_status: str = ""
    deleted: bool = False
    mounts: dict[str, Path] = field(default_factory=dict)
    restart_policy: str = "Always"


class Kubelet:
    def __init__(self, api: Api, net: int, state_dir: Path, binaries: Path):
        self.api, self.net = api, net
        self.node = node_name(net)
        self.state_dir = state_dir
        self.binaries = binaries
        self.pods: dict[str, PodRun] = {}
        self.lock = threading.Lock()
        self.next_index = FIRST_POD_ADDRESS
        self.last_lease = 0.0

    # ----------------------------------------------------------------- node

    def register_node(self) -> None:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node,
                                                           "kubernetes.io/os": "linux",
                                                           "kubernetes.io/arch": "amd64"}}}
        try:
            self.api.call("POST", "/api/v1/nodes", node)
        except ApiError as error:
            if error.code != 409:
                raise
        self.post_node_status()
        # TaintNodesByCondition put `not-ready` on the new Node; it is ready now.
        current = self.api.call("GET", f"/api/v1/nodes/{self.node}")
        taints = [t for t in current.get("spec", {}).get("taints") or []
                  if not t.get("key", "").startswith("node.kubernetes.io/")]
        self.api.call("PATCH", f"/api/v1/nodes/{self.node}", {"spec": {"taints": taints or None}},
                      "application/merge-patch+json")
        self.renew_lease()

    def post_node_status(self) -> None:
        heartbeat = now_rfc3339()
        conditions = [{"type": kind, "status": "False", "reason": f"KubeletHas{reason}",
                       "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat}
                      for kind, reason in (("MemoryPressure", "SufficientMemory"),
                                           ("DiskPressure", "NoDiskPressure"),
                                           ("PIDPressure", "SufficientPID"))]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "process kubelet is posting ready status",
                           "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat})
        resources = {"cpu": "8", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        status = {"addresses": [{"type": "InternalIP", "address": node_address(self.net)},
                                {"type": "Hostname", "address": self.node}],
                  "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
                  "capacity": resources, "allocatable": resources, "conditions": conditions,
                  "nodeInfo": {"kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "operatingSystem": "linux",
                               "architecture": "amd64", "containerRuntimeVersion": "process://haptic-env",
                               "osImage": "haptic-env", "kernelVersion": os.uname().release,
                               "machineID": "", "systemUUID": "", "bootID": ""}}
        self.api.call("PATCH", f"/api/v1/nodes/{self.node}/status", {"status": status},
                      "application/merge-patch+json")

    def renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node}"
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now_rfc3339(nanos=True)[:-4] + "Z"}
        try:
            self.api.call("PATCH", path, {"spec": spec}, "application/merge-patch+json")
        except ApiError as error:
            if error.code != 404:
                raise
            self.api.call("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                          {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "metadata": {"name": self.node, "namespace": "kube-node-lease"}, "spec": spec})
        self.last_lease = time.monotonic()

    # ----------------------------------------------------------------- loop

    def tick(self) -> None:
        if time.monotonic() - self.last_lease > LEASE_RENEW:
            self.renew_lease()
            self.post_node_status()
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self.node}"})
        pods = self.api.call("GET", f"/api/v1/pods?{query}").get("items", [])
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            run = self.pods.get(uid)
            if run is None:
                if pod["metadata"].get("deletionTimestamp"):
                    self.delete_pod_object(pod["metadata"])
                    continue
                run = self.admit(pod)
            try:
                self.sync(run, pod)
            except (OSError, ApiError, RuntimeError, ValueError) as error:
                # One Pod's trouble is its own: the others go on.
                print(f"kubelet: pod {run.namespace}/{run.name}: {error}", flush=True)
        for uid in [uid for uid in self.pods if uid not in seen]:
            # Deleted at once (grace period 0, or by someone else): just clean up.
            self.tear_down(self.pods.pop(uid))

    def admit(self, pod: dict) -> PodRun:
        meta = pod["metadata"]
        index = self.allocate_index()
        directory = self.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        directory.mkdir(parents=True, exist_ok=True)
        containers = {c["name"]: ContainerRun(spec=c, log_path=directory / f"{c['name']}.log")
                      for c in pod["spec"].get("containers", [])}
        run = PodRun(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"], index=index,
                     directory=directory, containers=containers, start_time=now_rfc3339(),
                     restart_policy=pod["spec"].get("restartPolicy", "Always"))
        with self.lock:
            self.pods[run.uid] = run
        return run

    def allocate_index(self) -> int:
        """The next free address, round-robin, so an address is not handed out again at once
        while a controller may still hold a stale endpoint for it."""
        taken = {run.index for run in self.pods.values()}
        for _ in range(LAST_POD_ADDRESS - FIRST_POD_ADDRESS + 1):
            index = self.next_index
            self.next_index = index + 1 if index < LAST_POD_ADDRESS else FIRST_POD_ADDRESS
            if index not in taken:
                return index
        raise RuntimeError("no free Pod address left on this node")

    def sync(self, run: PodRun, pod: dict) -> None:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            if self.terminate(run, pod):
                self.tear_down(run)
                self.pods.pop(run.uid, None)
                self.delete_pod_object(meta)
            return
        if not run.ip:
            if not self.prepare(run, pod):
                self.write_status(run, pod)
                return
        self.supervise(run, pod)
        self.write_status(run, pod)

    # ----------------------------------------------------------------- start

    def prepare(self, run: PodRun, pod: dict) -> bool:
        """Volumes, then the sandbox; False (with the reason kept) while a volume's source is missing."""
        try:
            mounts_by_volume = self.materialise_volumes(run, pod)
        except LookupError as missing:
            run.waiting_for = str(missing)
            return False
        run.waiting_for = ""
        run.mounts = mounts_by_volume
        run.ip = make_sandbox(self.net, run.index)
        return True

    def materialise_volumes(self, run: PodRun, pod: dict) -> dict[str, Path]:
        volumes = {}
        for volume in pod["spec"].get("volumes") or []:
            target = run.directory / "volumes" / volume["name"]
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            if "secret" in volume:
                source = volume["secret"]
                data = self.read_source("secrets", run.namespace, source["secretName"], source.get("optional"))
                self.write_items(target, {k: base64.b64decode(v) for k, v in data.get("data", {}).items()},
                                 source)
            elif "configMap" in volume:
                source = volume["configMap"]
                data = self.read_source("configmaps", run.namespace, source["name"], source.get("optional"))
                files = {k: v.encode() for k, v in data.get("data", {}).items()}
                files.update({k: base64.b64decode(v) for k, v in data.get("binaryData", {}).items()})
                self.write_items(target, files, source)
            elif "downwardAPI" in volume:
                for item in volume["downwardAPI"].get("items", []):
                    value = field_value(pod, item.get("fieldRef", {}).get("fieldPath", ""), run, self.net)
                    (target / item["path"]).write_text(value)
            elif "emptyDir" not in volume:
                raise LookupError(f"volume {volume['name']}: a kind this kubelet does not mount")
            volumes[volume["name"]] = target
        return volumes

    def read_source(self, kind: str, namespace: str, name: str, optional: bool | None) -> dict:
        try:
            return self.api.call("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except ApiError as error:
            if error.code == 404 and not optional:
                raise LookupError(f"{kind[:-1]} \"{name}\" not found") from None
            if error.code == 404:
                return {}
            raise

    @staticmethod
    def write_items(target: Path, files: dict[str, bytes], source: dict) -> None:
        mode = int(source.get("defaultMode", 0o644))
        items = source.get("items")
        chosen = {item["path"]: files[item["key"]] for item in items if item["key"] in files} if items else files
        for path, content in chosen.items():
            destination = target / path
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(content)
            destination.chmod(mode)

    def start_container(self, run: PodRun, pod: dict, container: ContainerRun) -> None:
        spec = container.spec
        mapped = image_binary(spec.get("image", ""), self.binaries)
        if mapped is None or not mapped[0].exists():
            container.waiting = ("ErrImagePull", f"image {spec.get('image')!r} has no local binary in this "
                                 f"environment (known: {', '.join(IMAGES)})")
            container.next_start = time.monotonic() + BACKOFF_START
            return
        binary, extra = mapped
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOSTNAME": run.name,
               "KUBERNETES_SERVICE_HOST": "", **extra}
        try:
            env.update(self.container_env(run, pod, spec))
        except LookupError as missing:
            container.waiting = ("CreateContainerConfigError", str(missing))
            container.next_start = time.monotonic() + 1
            return
        mounts: list[str] = []
        for mount in spec.get("volumeMounts") or []:
            source = run.mounts.get(mount["name"])
            if source is None:
                continue
            source = source / mount.get("subPath", "")
            Path(mount["mountPath"]).mkdir(parents=True, exist_ok=True)
            mounts += [str(source), mount["mountPath"]]
        # The binary is opened before the mounts, which may hide its directory (CoreDNS mounts /root).
        # A host name of the pod's own (its name), as a kubelet gives every container of a pod.
        script = ('hostname "$1"; shift; exec 3< "$1"; shift; '
                  'while [ "$1" != "--" ]; do mount --bind "$1" "$2"; shift 2; done; exec /proc/self/fd/3')
        command = ["nsenter", f"--net=/run/netns/{pod_netns(self.net, run.index)}",
                   "unshare", "--mount", "--uts", "--propagation", "private", "--",
                   "sh", "-ec", script, "sh", run.name[:63], str(binary), *mounts, "--"]
        container.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        container.started_at = now_rfc3339()
        container.waiting = None
        container.terminated = None
        container.probe = ProbeState()
        container.probe_from = time.monotonic() + float(
            (spec.get("readinessProbe") or {}).get("initialDelaySeconds", 0))
        threading.Thread(target=copy_log, args=(container.process, container.log_path), daemon=True).start()

    def container_env(self, run: PodRun, pod: dict, spec: dict) -> dict[str, str]:
        env = {}
        for entry in spec.get("env") or []:
            source = entry.get("valueFrom")
            if source is None:
                env[entry["name"]] = expand(entry.get("value", ""), env)
            elif "fieldRef" in source:
                env[entry["name"]] = field_value(pod, source["fieldRef"]["fieldPath"], run, self.net)
            elif "secretKeyRef" in source or "configMapKeyRef" in source:
                kind = "secrets" if "secretKeyRef" in source else "configmaps"
                ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
                data = self.read_source(kind, run.namespace, ref["name"], ref.get("optional")).get("data", {})
                if ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise LookupError(f"key {ref['key']} not in {kind[:-1]} {ref['name']}")
                value = data[ref["key"]]
                env[entry["name"]] = base64.b64decode(value).decode() if kind == "secrets" else value
        return env

    # ----------------------------------------------------------------- running

    def supervise(self, run: PodRun, pod: dict) -> None:
        policy = pod["spec"].get("restartPolicy", "Always")
        now = time.monotonic()
        for container in run.containers.values():
            process = container.process
            if process is not None and process.poll() is not None:
                container.terminated = {"exitCode": process.returncode if process.returncode >= 0 else
                                        128 - process.returncode,
                                        "reason": "Completed" if process.returncode == 0 else "Error",
                                        "startedAt": container.started_at, "finishedAt": now_rfc3339()}
                container.process = None
                restart = policy == "Always" or (policy == "OnFailure" and process.returncode != 0)
                if restart:
                    container.next_start = now + container.backoff
                    container.backoff = min(container.backoff * 2, BACKOFF_MAX)
            if container.process is None and (container.terminated is None or self.restarts(container, policy)):
                if now >= container.next_start:
                    if container.terminated is not None:
                        container.last_terminated = container.terminated
                        container.restarts += 1
                    self.start_container(run, pod, container)
            if container.process is not None:
                self.probe(run, container, now)

    @staticmethod
    def restarts(container: ContainerRun, policy: str) -> bool:
        code = (container.terminated or {}).get("exitCode", 0)
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    @staticmethod
    def probe(run: PodRun, container: ContainerRun, now: float) -> None:
        probe = container.spec.get("readinessProbe")
        state = container.probe
        if probe is None:
            state.ready = True
            return
        if now >= max(state.next_due, container.probe_from):
            probe_once(state, probe, container.spec, run.ip, now)

    # ----------------------------------------------------------------- status

    def write_status(self, run: PodRun, pod: dict) -> None:
        status = self.pod_status(run)
        text = json.dumps(status, sort_keys=True)
        if text == run.last_status:
            return
        try:
            self.api.call("PATCH", f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status",
                          {"status": status}, "application/strategic-merge-patch+json")
            run.last_status = text
        except ApiError as error:
            if error.code != 404:
                raise

    def pod_status(self, run: PodRun) -> dict:
        statuses = []
        for name, container in run.containers.items():
            state: dict
            if container.process is not None:
                state = {"running": {"startedAt": container.started_at}}
            elif container.waiting is not None or run.waiting_for:
                reason, message = container.waiting or ("ContainerCreating", "")
                state = {"waiting": {"reason": reason, "message": run.waiting_for or message}}
            elif container.terminated is not None:
                state = {"terminated": container.terminated}
            else:
                state = {"waiting": {"reason": "CrashLoopBackOff"}}
            entry = {"name": name, "image": container.spec.get("image", ""), "imageID": "",
                     "ready": container.process is not None and container.probe.ready,
                     "started": container.process is not None, "restartCount": container.restarts,
                     "state": state}
            if container.process is not None:
                entry["containerID"] = f"process://{container.process.pid}"
            if container.last_terminated is not None:
                entry["lastState"] = {"terminated": container.last_terminated}
            statuses.append(entry)
        ready = bool(statuses) and all(s["ready"] for s in statuses)
        phase = pod_phase(run)

        def condition(kind: str, value: bool) -> dict:
            return {"type": kind, "status": "True" if value else "False"}

        host = node_address(self.net)
        status = {"phase": phase, "hostIP": host, "hostIPs": [{"ip": host}], "startTime": run.start_time,
                  "conditions": [condition("PodReadyToStartContainers", bool(run.ip)),
                                 condition("Initialized", True), condition("ContainersReady", ready),
                                 condition("Ready", ready)],
                  "containerStatuses": statuses}
        if run.ip:
            status.update({"podIP": run.ip, "podIPs": [{"ip": run.ip}]})
        return status

    # ----------------------------------------------------------------- stop

    def terminate(self, run: PodRun, pod: dict) -> bool:
        """SIGTERM once, SIGKILL after the grace period; True when every process is gone."""
        now = time.monotonic()
        if run.terminating_until is None:
            grace = pod["metadata"].get("deletionGracePeriodSeconds",
                                        pod["spec"].get("terminationGracePeriodSeconds", 30))
            run.terminating_until = now + float(grace or 0)
            for container in run.containers.values():
                signal_group(container.process, signal.SIGTERM)
        alive = [c for c in run.containers.values() if c.process is not None and c.process.poll() is None]
        if alive and now < run.terminating_until:
            return False
        for container in alive:
            signal_group(container.process, signal.SIGKILL)
            container.process.wait(timeout=5)
        return True

    def tear_down(self, run: PodRun) -> None:
        for container in run.containers.values():
            if container.process is not None and container.process.poll() is None:
                signal_group(container.process, signal.SIGKILL)
                container.process.wait(timeout=5)
        remove_sandbox(self.net, run.index)
        shutil.rmtree(run.directory / "volumes", ignore_errors=True)
        run.deleted = True

    def delete_pod_object(self, meta: dict) -> None:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                   "preconditions": {"uid": meta["uid"]}}
        try:
            self.api.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", options)
        except ApiError as error:
            if error.code not in (404, 409):
                raise

    def stop_all(self) -> None:
        for run in list(self.pods.values()):
            self.tear_down(run)
        self.pods.clear()

    def find(self, namespace: str, name: str) -> PodRun | None:
        with self.lock:
            matches = [run for run in self.pods.values() if run.namespace == namespace and run.name == name]
        return matches[-1] if matches else None


def pod_phase(run: PodRun) -> str:
    """Kubelet's phase: a Pod whose containers restart stays Running while they crash; it
    ends (Succeeded, Failed) only when no container will start again."""
    containers = list(run.containers.values())
    if any(c.process is not None for c in containers):
        return "Running"
    if not run.ip or any(c.terminated is None for c in containers):
        return "Pending"
    codes = [c.terminated.get("exitCode", 0) for c in containers if c.terminated]
    if run.restart_policy == "Always" or (run.restart_policy == "OnFailure" and any(codes)):
        return "Running"
    return "Failed" if any(codes) else "Succeeded"


def field_value(pod: dict, path: str, run: PodRun, net: int) -> str:
    meta = pod["metadata"]
    values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
              "metadata.uid": meta["uid"], "spec.nodeName": pod["spec"].get("nodeName", ""),
              "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
              "status.podIP": run.ip or f"198.19.{net}.{run.index}", "status.hostIP": node_address(net)}
    if path in values:
        return values[path]
    for prefix, source in (("metadata.labels['", "labels"), ("metadata.annotations['", "annotations")):
        if path.startswith(prefix) and path.endswith("']"):
            return (meta.get(source) or {}).get(path[len(prefix):-2], "")
    raise LookupError(f"fieldRef {path!r} is not one this kubelet resolves")


def expand(value: str, env: dict[str, str]) -> str:
    """`$(NAME)` references to earlier variables, as kubelet expands them."""
    for name, known in env.items():
        value = value.replace(f"$({name})", known)
    return value


def signal_group(process: subprocess.Popen | None, number: int) -> None:
    if process is None:
        return
    try:
        os.killpg(process.pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def copy_log(process: subprocess.Popen, path: Path) -> None:
    """The container's output in CRI's log format, one timestamped line each."""
    with path.open("ab", buffering=0) as out:
        for line in iter(process.stdout.readline, b""):
            stamp = now_rfc3339(nanos=True).encode()
            out.write(stamp + b" stdout F " + line.rstrip(b"\n") + b"\n")


# --------------------------------------------------------------------------- kubelet API


def log_lines(path: Path, query: dict[str, list[str]]) -> bytes:
    """What `GET /containerLogs` answers for one log file and kubelet's query parameters."""
    since = None
    if "sinceTime" in query:
        since = parse_time(query["sinceTime"][0])
    elif "sinceSeconds" in query:
        since = time.time() - float(query["sinceSeconds"][0])
    timestamps = query.get("timestamps", ["false"])[0] == "true"
    kept = []
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(b" ", 3)
        if len(parts) < 4:
            continue
        if since is not None and parse_time(parts[0].decode()) < since:
            continue
        kept.append((parts[0] + b" " + parts[3]) if timestamps else parts[3])
    if "tailLines" in query:
        kept = kept[-int(query["tailLines"][0]):] if int(query["tailLines"][0]) > 0 else []
    body = b"".join(line + b"\n" for line in kept)
    if "limitBytes" in query:
        body = body[:int(query["limitBytes"][0])]
    return body


def serve_api(kubelet: Kubelet, certificate: Path, key: Path) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if url.path == "/healthz":
                return self.answer(200, b"ok")
            if len(parts) == 4 and parts[0] == "containerLogs":
                _, namespace, name, container = parts
                run = kubelet.find(namespace, name)
                if run is None or container not in run.containers:
                    return self.answer(404, f"no container {container} in pod {namespace}/{name}".encode())
                query = urllib.parse.parse_qs(url.query)
                return self.answer(200, log_lines(run.containers[container].log_path, query))
            return self.answer(404, b"not served by the process kubelet")

        def answer(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer((node_address(kubelet.net), KUBELET_PORT), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certificate), str(key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serving_certificate(directory: Path, address: str) -> tuple[Path, Path]:
    """A self-signed certificate for the kubelet API (the API server's kubelet client is given
    no CA here, so it does not verify it)."""
    directory.mkdir(parents=True, exist_ok=True)
    certificate, key = directory / "kubelet.crt", directory / "kubelet.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(certificate), "-days", "30", "-subj", "/CN=haptic-env kubelet",
                    "-addext", f"subjectAltName=IP:{address}"], check=True, capture_output=True)
    return certificate, key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kubeconfig")
    parser.add_argument("ca_file")
    parser.add_argument("--net", type=int, required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--binaries", required=True)
    args = parser.parse_args(argv)
    state_dir = Path(args.state_dir)
    kubelet = Kubelet(Api.from_kubeconfig(args.kubeconfig, args.ca_file), args.net, state_dir, Path(args.binaries))
    make_bridge(args.net)
    certificate, key = serving_certificate(state_dir / "pki", node_address(args.net))
    serve_api(kubelet, certificate, key)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    print(f"kubelet: node {kubelet.node}, pods on {bridge_name(args.net)} 198.19.{args.net}.0/24, "
          f"API on https://{node_address(args.net)}:{KUBELET_PORT}", flush=True)
    registered = False
    while not stopping.is_set():
        try:
            if not registered:
                kubelet.register_node()
                registered = True
                print("kubelet: node registered and ready", flush=True)
            kubelet.tick()
        except (OSError, ApiError, RuntimeError, ValueError) as error:
            # The API server may restart; kubelet keeps going too.
            print(f"kubelet: {error}", flush=True)
            stopping.wait(1)
        stopping.wait(TICK)
    kubelet.stop_all()
    left = remove_network(args.net)
    print(f"kubelet: stopped{'; left behind: ' + ', '.join(left) if left else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
