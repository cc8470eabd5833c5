//! Issue #15, live: HAProxy's own observability as the chart configures it. Every environment
//! pod (HAProxy 2.8 and 2.6, deployed through the real Dataplane API by the real `haptic`
//! binary) writes an access-log line for a test request to its container's stdout, and
//! answers its Prometheus exporter on the chart's metrics port with the test's backend in it.

use crate::env;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use env::controller::ControllerProcess;
use env::standalone::{
    apply_library_config_for_pods, backend_host_address, ingress_to, library_namespace, service_with_endpoints,
    start_backends,
};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};

const WITHIN: Duration = Duration::from_secs(60);
const BACKEND_PORT: u16 = 18530;
/// The chart's default `haproxy.ports.metrics`.
const METRICS_PORT: u16 = 8405;

#[tokio::test]
async fn every_pod_logs_each_request_and_serves_its_metrics_on_the_charts_port() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let client = env.kube_client().await?;
    let namespace = library_namespace(env, &client, "observability").await?;
    let work = tempfile::tempdir()?;
    let address = backend_host_address()?;
    let _backends = start_backends(work.path(), &address, &[("logged".into(), BACKEND_PORT)])?;
    service_with_endpoints(&client, &namespace, "logged", &address, BACKEND_PORT).await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    ingresses.create(&PostParams::default(), &ingress_to("logged", "logged.example", "logged")?).await?;
    apply_library_config_for_pods(&client, &namespace, "observability").await?;
    let controller = ControllerProcess::launch_library(env, &namespace, &work.path().join("journal"))?;
    controller.wait_all_in_sync(env.pods.len(), WITHIN).await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;

    for pod in &env.pods {
        // The request, once the pod serves the Ingress.
        let probe = format!("/access-log-probe-{}-{}", pod.name, std::process::id());
        let deadline = Instant::now() + WITHIN;
        loop {
            let answer =
                http.get(format!("http://{}:8080{probe}", pod.ip)).header("Host", "logged.example").send().await;
            if answer.as_ref().is_ok_and(|a| a.status() == 200) {
                break;
            }
            ensure!(Instant::now() < deadline, "{} did not serve logged.example: {answer:?}", pod.name);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Its line on HAProxy's stdout: HAProxy's HTTP log format, naming the frontend, the
        // backend and server, the status and the request line.
        let log = pod.dir.join("haproxy.log");
        let deadline = Instant::now() + Duration::from_secs(10);
        let line = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text.lines().find(|line| line.contains(&probe)) {
                break line.to_owned();
            }
            ensure!(Instant::now() < deadline, "no access-log line for {probe} in {}", log.display());
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let backend = format!("be_{namespace}_logged_80/srv1");
        ensure!(
            line.contains(" http ")
                && line.contains(&backend)
                && line.contains(" 200 ")
                && line.contains(&format!("\"GET {probe} HTTP/1.1\"")),
            "{} ({}): the access-log line is not HAProxy's HTTP log format for the probe: {line}",
            pod.name,
            pod.haproxy_version
        );
        println!("{} (HAProxy {}): {line}", pod.name, pod.haproxy_version);

        // The exporter, on the chart's metrics port: the process, and the test's backend.
        let metrics = http.get(format!("http://{}:{METRICS_PORT}/metrics", pod.ip)).send().await?;
        ensure!(metrics.status() == 200, "{}: /metrics answered {}", pod.name, metrics.status());
        let text = metrics.text().await?;
        let responses =
            format!("haproxy_backend_http_responses_total{{proxy=\"be_{namespace}_logged_80\",code=\"2xx\"}}");
        ensure!(
            text.contains("haproxy_process_uptime_seconds")
                && text.lines().any(|l| l.starts_with(&responses) && !l.ends_with(" 0")),
            "{}: the exporter shows no 2xx answer of the test's backend ({responses})",
            pod.name
        );
        let other = http.get(format!("http://{}:{METRICS_PORT}/other", pod.ip)).send().await?;
        ensure!(other.status() == 404, "{}: only /metrics is served on the metrics port", pod.name);
    }
    Ok(())
}
