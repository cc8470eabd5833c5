"""A wrong input to the environment scripts gets a clear message: these check each one."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import envctl  # noqa: E402


def test_port_in_use_names_the_address_and_the_component_before_anything_starts(tmp_path, capsys):
    holder = socket.socket()
    holder.bind(("127.9.0.2", envctl.DATAPLANE_PORT))
    holder.listen()
    try:
        code = envctl.main(["up", "--state-dir", str(tmp_path), "--net", "9", "--pods", "1", "--no-install"])
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert code == 2
    assert "port in use: 127.9.0.2:5555 (wanted by pod haproxy-0 Dataplane API)" in err
    assert "make env-down" in err
    assert not (tmp_path / "processes.json").exists(), "nothing may start when a port is taken"


def test_missing_toolchain_is_named_with_what_it_is_for(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no go here
    module = tmp_path / "module"
    module.mkdir()
    (module / "go.mod").write_text("module example.com/x\n")
    with pytest.raises(envctl.EnvError) as error:
        envctl.go_build("API server launcher", module, ".", tmp_path / "bin" / "x")
    assert "missing toolchain: `go` is not on PATH" in str(error.value)
    assert "API server launcher" in str(error.value)


def test_failed_build_points_at_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(envctl, "CACHE_DIR", tmp_path / "cache")
    module = tmp_path / "broken"
    module.mkdir()
    (module / "go.mod").write_text("module example.com/broken\n\ngo 1.21\n")
    (module / "main.go").write_text("package main\n\nfunc main() { this does not compile }\n")
    with pytest.raises(envctl.EnvError) as error:
        envctl.go_build("broken tool", module, ".", tmp_path / "bin" / "broken")
    message = str(error.value)
    assert message.startswith("build failed: the broken tool did not build")
    log_path = tmp_path / "cache" / "logs" / "build-broken.log"
    assert f"log: {log_path}" in message
    assert "main.go" in message, "the log's last lines are shown"


def test_dataplaneapi_build_is_judged_by_the_binary_not_the_tools_version_pipe(tmp_path):
    binary = tmp_path / "dataplaneapi"
    binary.write_text(f"#!/bin/sh\necho 'HAProxy Data Plane API {envctl.DATAPLANEAPI_TAG} 3f1e3ef3'\necho more\n")
    binary.chmod(0o755)
    sigpipe = 128 + 13
    assert envctl.dataplaneapi_built(0, binary)
    assert envctl.dataplaneapi_built(sigpipe, binary), "head closing the version pipe is not a failed build"
    assert not envctl.dataplaneapi_built(3, binary), "the tool's own failure stands"
    assert not envctl.dataplaneapi_built(sigpipe, tmp_path / "absent")
    binary.write_text("#!/bin/sh\necho 'HAProxy Data Plane API v0.0.1'\n")
    assert not envctl.dataplaneapi_built(sigpipe, binary), "a binary of another version is not the one wanted"


def test_haproxy_build_is_judged_by_the_binary_not_the_builders_version_pipe(tmp_path):
    binary = tmp_path / "haproxy"
    binary.write_text("#!/bin/sh\necho 'HAProxy version 3.4.0'\necho more\n")
    binary.chmod(0o755)
    sigpipe = 128 + 13
    assert envctl.built_but_not_shown(sigpipe, binary), "head closing the version pipe is not a failed build"
    assert not envctl.built_but_not_shown(3, binary), "the builder's own failure stands"
    assert not envctl.built_but_not_shown(sigpipe, tmp_path / "absent")
    binary.write_text("#!/bin/sh\nexit 1\n")
    assert not envctl.built_but_not_shown(sigpipe, binary), "a binary that does not run is no build"


def test_component_not_ready_in_time_is_named_with_its_log(tmp_path):
    log_path = tmp_path / "slow.log"
    log_path.write_text("still warming up\n")
    slow = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(envctl.EnvError) as error:
            envctl.wait_until("Dataplane API of pod haproxy-1 (http://127.0.0.3:5555/v3)", log_path,
                              lambda: False, timeout=0.3, process=slow)
    finally:
        slow.kill()
    message = str(error.value)
    assert "Dataplane API of pod haproxy-1 (http://127.0.0.3:5555/v3) did not become ready within 0s" in message
    assert f"log: {log_path}" in message
    assert "still warming up" in message


def test_component_that_exits_early_reports_its_status_and_log(tmp_path):
    log_path = tmp_path / "crash.log"
    log_path.write_text("[ALERT] parsing [haproxy.cfg:3]: unknown keyword\n")
    crashed = subprocess.Popen(["false"])
    crashed.wait()
    with pytest.raises(envctl.EnvError) as error:
        envctl.wait_until("HAProxy 2.8 of pod haproxy-0", log_path, lambda: False, timeout=5, process=crashed)
    message = str(error.value)
    assert "HAProxy 2.8 of pod haproxy-0 exited with status 1 before becoming ready" in message
    assert "unknown keyword" in message


def test_unknown_haproxy_version_is_refused():
    with pytest.raises(envctl.EnvError) as error:
        components = envctl.Components(apiserver=Path("a"), otelcol=Path("o"), helm=Path("h"), haproxy={"2.8": Path("h")}, dataplaneapi=None,
                                        gateway_api_crds=[])
        envctl.check_versions(["2.8", "3.4"], components)
    assert "unknown HAProxy version '3.4'" in str(error.value)


def test_a_pods_processes_carry_its_peer_variable_empty_at_every_start(tmp_path):
    # The rate-limit peers' line of the pod itself must read as no address, in HAProxy and in
    # the Dataplane API's checks, also after the sidecar is restarted (credentials rotation).
    env = envctl.pod_env("haproxy-0", "127.1.0.2", tmp_path)
    assert env["HAPTIC_PEER_SELF_686170726f78792d30"] == ""
    assert env["POD_IP"] == "127.1.0.2"
