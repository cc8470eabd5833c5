"""The process kubelet's own rules, checked without a cluster: the log query kubelet's API
answers, and how images and fields are resolved."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kubelet  # noqa: E402


def test_log_query_filters_by_time_and_strips_the_cri_prefix(tmp_path):
    log = tmp_path / "c.log"
    log.write_bytes(b"2026-12-07T10:00:00.100000000Z stdout F first\n"
                    b"2026-12-07T10:00:05.000000000Z stdout F second line\n"
                    b"2026-12-07T10:00:09.999999999Z stdout F third\n")
    assert kubelet.log_lines(log, {}) == b"first\nsecond line\nthird\n"
    assert kubelet.log_lines(log, {"sinceTime": ["2026-12-07T10:00:05Z"]}) == b"second line\nthird\n"
    assert kubelet.log_lines(log, {"tailLines": ["1"]}) == b"third\n"
    assert kubelet.log_lines(log, {"tailLines": ["1"], "timestamps": ["true"]}) == \
        b"2026-12-07T10:00:09.999999999Z third\n"
    assert kubelet.log_lines(log, {"limitBytes": ["3"]}) == b"fir"
    assert kubelet.log_lines(tmp_path / "absent.log", {}) == b""


def test_images_map_to_local_binaries_by_repository_whatever_the_tag(tmp_path):
    binary, extra = kubelet.image_binary("registry.k8s.io/gateway-api/echo-basic:v1.5.1", tmp_path)
    assert binary == tmp_path / "echo-basic" and extra == {}
    binary, extra = kubelet.image_binary("registry.k8s.io/coredns/coredns:v1.12.2", tmp_path)
    assert binary == tmp_path / "echo-basic" and extra["UDP_ECHO_SERVER"] == "1"
    assert kubelet.image_binary("docker.io/library/nginx:1.27", tmp_path) is None
    assert kubelet.image_binary("localhost:5000/gateway-api/echo-basic", tmp_path) is None


def test_field_references_resolve_as_kubelet_resolves_them():
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "a"}},
           "spec": {"nodeName": "haptic-env-9"}}
    run = kubelet.PodRun(uid="u", namespace="ns", name="p", index=12, directory=Path("/nonexistent"),
                         containers={}, ip="198.19.9.12")
    assert kubelet.field_value(pod, "metadata.name", run, 9) == "p"
    assert kubelet.field_value(pod, "status.podIP", run, 9) == "198.19.9.12"
    assert kubelet.field_value(pod, "status.hostIP", run, 9) == "127.9.4.1"
    assert kubelet.field_value(pod, "metadata.labels['app']", run, 9) == "a"
    with pytest.raises(LookupError):
        kubelet.field_value(pod, "status.unknown", run, 9)
    assert kubelet.expand("$(A)-x", {"A": "1"}) == "1-x"


def test_a_crashing_container_that_restarts_keeps_its_pod_running():
    def run_with(policy, code):
        container = kubelet.ContainerRun(spec={"name": "c"}, log_path=Path("/nonexistent"),
                                         terminated={"exitCode": code})
        return kubelet.PodRun(uid="u", namespace="ns", name="p", index=10, directory=Path("/nonexistent"),
                              containers={"c": container}, ip="198.19.9.10", restart_policy=policy)
    assert kubelet.pod_phase(run_with("Always", 127)) == "Running"
    assert kubelet.pod_phase(run_with("OnFailure", 1)) == "Running"
    assert kubelet.pod_phase(run_with("OnFailure", 0)) == "Succeeded"
    assert kubelet.pod_phase(run_with("Never", 2)) == "Failed"
