//! OpenTelemetry traces from the real binary to the real OpenTelemetry Collector (built from
//! its Go modules by the test environment): a change to an Ingress gives one trace holding the
//! reconciliation, its render and one span per pod with that pod's Dataplane calls, and each
//! pod's journal transition names that trace. The pods are Ready in Kubernetes with no
//! Dataplane API behind them (it cannot be built here, docs/environment.md), so their spans
//! end in errors; validation spans need a reachable pod and are covered in tests/pods/dataplane.rs.

use crate::env;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use env::controller::{ControllerProcess, Launch, create_test_config, ensure_haptic_crd};
use env::otlp::{ReceivedSpan, received_spans};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use serde_json::json;

const PASSWORD: &str = "trace-secret-7f3a91";

#[tokio::test]
async fn an_ingress_change_is_one_trace_through_render_and_every_pod_and_the_journal_names_it() -> Result<()> {
    let env = env::environment();
    let client = env.kube_client().await?;
    ensure_haptic_crd(&client).await?;
    let namespace = env.fresh_namespace(&client, "traces").await?;
    env::fixtures::dataplane_secret(&client, &namespace, "admin", PASSWORD).await?;
    // Nothing listens on these addresses.
    env::fixtures::ghost_pod(&client, &namespace, "ghost-0", "127.1.9.21", "traced").await?;
    env::fixtures::ghost_pod(&client, &namespace, "ghost-1", "127.1.9.22", "traced").await?;
    create_test_config(
        &client,
        &namespace,
        json!({
            "podSelector": {"matchLabels": {"haptic.dev/test": "traced"}},
            "watchedResources": {"ingresses": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                                               "namespaces": [namespace]}},
            "dataplane": {"credentialsSecretRef": {"name": "dataplane"}},
            "templates": {"haproxyConfig": "global\n    maxconn 100\n{% for i in resources.ingresses.list() %}# ingress {{ i.metadata.name | bare_word }}\n{% endfor %}"}
        }),
    )
    .await?;

    let service = format!("haptic-{namespace}");
    let launch = Launch::traced(env, &service);
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let mut controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &launch)?;
    controller.wait_for_config("the first render", Duration::from_secs(60), |cfg| cfg.contains("maxconn 100")).await?;

    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let ingress = serde_json::from_value(json!({
        "metadata": {"name": "traced"},
        "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}
    }))?;
    ingresses.create(&PostParams::default(), &ingress).await?;
    controller.wait_for_config("the Ingress", Duration::from_secs(30), |cfg| cfg.contains("# ingress traced")).await?;

    // The reconciliation the Ingress triggered, and every span of its trace.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (root, trace) = loop {
        let spans: Vec<ReceivedSpan> =
            received_spans(&env.otlp.traces_file).into_iter().filter(|s| s.service == service).collect();
        let root = spans.iter().find(|s| {
            s.name == "reconcile"
                && s.attribute("k8s.resource.kind") == "Ingress"
                && s.attribute("k8s.resource.name") == "traced"
        });
        if let Some(root) = root {
            let trace: Vec<ReceivedSpan> = spans.iter().filter(|s| s.trace_id == root.trace_id).cloned().collect();
            let pods: BTreeSet<&str> =
                trace.iter().filter(|s| s.name == "pod").map(|s| s.attribute("k8s.pod.name")).collect();
            if pods.len() == 2 && trace.iter().any(|s| s.name == "dataplane request") {
                break (root.clone(), trace);
            }
        }
        if Instant::now() > deadline {
            let names: Vec<String> =
                spans.iter().map(|s| format!("{} {} {:?}", s.trace_id, s.name, s.attributes)).collect();
            bail!(
                "no complete trace of the Ingress change; spans received:\n{}\n--- log ---\n{}",
                names.join("\n"),
                controller.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(root.parent_span_id.is_empty(), "the reconciliation is the trace's root: {root:?}");
    ensure!(root.attribute("k8s.namespace.name") == namespace, "{root:?}");
    let render =
        trace.iter().find(|s| s.name == "render").ok_or_else(|| anyhow::anyhow!("no render span: {trace:?}"))?;
    ensure!(render.parent_span_id == root.span_id && render.attribute("haptic.files") == "1", "{render:?}");
    let pods: Vec<&ReceivedSpan> = trace.iter().filter(|s| s.name == "pod").collect();
    let pod_names: BTreeSet<&str> = pods.iter().map(|s| s.attribute("k8s.pod.name")).collect();
    ensure!(pod_names == BTreeSet::from(["ghost-0", "ghost-1"]), "one span per pod: {pods:?}");
    for pod in &pods {
        ensure!(pod.parent_span_id == root.span_id, "a pod's span hangs under the reconciliation: {pod:?}");
        ensure!(pod.status_code == 2, "an unreachable pod's span is an error: {pod:?}");
        ensure!(!pod.attribute("haptic.desired.checksum").is_empty(), "{pod:?}");
    }
    let requests: Vec<&ReceivedSpan> = trace.iter().filter(|s| s.name == "dataplane request").collect();
    ensure!(
        requests.iter().all(|r| r.status_code == 2 && r.attribute("url.full").contains(":5555/v3/services/haproxy/")),
        "Dataplane calls carry their path and failure: {requests:?}"
    );

    // Each pod's journal names the trace, and the API shows it.
    let api = controller.api_url().await?;
    for pod in ["ghost-0", "ghost-1"] {
        let answer: serde_json::Value =
            reqwest::get(format!("{api}/api/v1/pods/{namespace}/{pod}?limit=1000")).await?.json().await?;
        let traced = answer["transitions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["traceId"].as_str() == Some(root.trace_id.as_str()));
        ensure!(traced, "no transition of {pod} holds trace {}: {answer}", root.trace_id);
    }

    // Secrets never reach the traces, the log, the metrics or any API answer.
    for path in [
        "/metrics",
        "/api/v1/pods",
        "/api/v1/config",
        "/api/v1/config/files/haproxy.cfg",
        &format!("/api/v1/pods/{namespace}/ghost-0?limit=1000"),
    ] {
        let answer = reqwest::get(format!("{api}{path}")).await?.text().await?;
        ensure!(!answer.contains(PASSWORD), "the Dataplane password appeared in {path}");
    }
    // The traces and the log are read once the controller has exited, which flushes every
    // span it still held, and the collector has written them all: no span is read too early.
    ensure!(controller.terminate(Duration::from_secs(15)).await, "the controller did not exit cleanly");
    let exported = settled_file(&env.otlp.traces_file, Duration::from_secs(20)).await?;
    ensure!(!exported.contains(PASSWORD), "the Dataplane password was exported in a trace");
    ensure!(!controller.log_text().contains(PASSWORD), "the Dataplane password was logged");
    Ok(())
}

/// A file's text once it has not grown for a second.
async fn settled_file(path: &std::path::Path, within: Duration) -> Result<String> {
    let deadline = Instant::now() + within;
    let mut last = std::fs::metadata(path)?.len();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = std::fs::metadata(path)?.len();
        if now == last {
            return Ok(std::fs::read_to_string(path)?);
        }
        ensure!(Instant::now() < deadline, "{} kept growing for {within:?}", path.display());
        last = now;
    }
}
