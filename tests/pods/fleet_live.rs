//! The fleet deploying to live pods through their real Dataplane APIs, with traces, metrics
//! and leader election: the acceptance of issues #4 and #6 on the real Dataplane API.

use crate::env;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use env::controller::{ControllerProcess, Launch};
use env::otlp::received_spans;
use haptic::dataplane::PushMode;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, PostParams};
use serde_json::json;

/// A metric's sum over its series; an error when the controller does not declare it, so a
/// renamed metric never reads as 0 reloads.
async fn metric(api: &str, line_start: &str) -> Result<f64> {
    let text = reqwest::get(format!("{api}/metrics")).await?.error_for_status()?.text().await?;
    env::measure::declared_metric_sum(&text, line_start)
}

async fn setup(test: &str) -> Result<(kube::Client, String)> {
    let env = env::environment();
    let tag = format!("{test}-{}", std::process::id());
    env::controller::deployment_test_namespace(env, test, &env::controller::own_template(env, &tag, ""), "3s").await
}

#[tokio::test]
async fn a_change_is_traced_through_validation_to_every_pod_and_metrics_follow_sync_drift_and_failure() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let (client, namespace) = setup("fleet-live").await?;
    let service = format!("haptic-{namespace}");
    let launch = Launch::traced(env, &service);
    let dir = tempfile::tempdir()?;
    let journal = dir.path().join("journal");
    let controller = ControllerProcess::launch(env, &namespace, "test", dir, &journal, &launch)?;
    let api = controller.api_url().await?;
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    let full_before = metric(&api, "haptic_deployments_total{kind=\"full\",result=\"ok\"}").await?;
    let reloads_before = metric(&api, "haptic_reloads_total").await?;
    ensure!(full_before >= env.pods.len() as f64, "one full sync per pod at least: {full_before}");

    // A real Ingress change: one trace, with validation and a push under each pod's span.
    // The deployed configuration answers the readiness probe: wait until the prober (kubelet's
    // part) has said so, or that pod change and the Ingress would be rendered as one change,
    // traced under whichever came first.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &namespace);
    let ready = |pod: &k8s_openapi::api::core::v1::Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pods.list(&Default::default()).await?.iter().all(ready) {
        ensure!(Instant::now() < deadline, "the configured pods did not turn Ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let the render of that readiness change settle before the change this test traces.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
    let ingress = serde_json::from_value(json!({
        "metadata": {"name": "traced"},
        "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}
    }))?;
    ingresses.create(&PostParams::default(), &ingress).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let trace = loop {
        let spans: Vec<_> =
            received_spans(&env.otlp.traces_file).into_iter().filter(|s| s.service == service).collect();
        if let Some(root) = spans.iter().find(|s| s.name == "reconcile" && s.attribute("k8s.resource.name") == "traced")
        {
            let trace: Vec<_> = spans.iter().filter(|s| s.trace_id == root.trace_id).cloned().collect();
            let pushed: BTreeSet<&str> = trace
                .iter()
                .filter(|s| {
                    s.name == "pod"
                        && s.attribute("haptic.decision") == "full"
                        && s.attribute("haptic.state") == "InSync"
                })
                .map(|s| s.attribute("k8s.pod.name"))
                .collect();
            if pushed.len() == env.pods.len() {
                break trace;
            }
        }
        if Instant::now() > deadline {
            bail!("no complete trace of the Ingress change\n{}", controller.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(trace.iter().any(|s| s.name == "render"), "no render span");
    let validations = trace.iter().filter(|s| s.name == "validate").count();
    let pushes = trace.iter().filter(|s| s.name == "push").count();
    ensure!(validations == env.pods.len() && pushes == env.pods.len(), "{validations} validations, {pushes} pushes");
    ensure!(metric(&api, "haptic_reloads_total").await? >= reloads_before + env.pods.len() as f64);

    // Drift: a configuration pushed behind the controller's back is undone within an interval.
    let pod = &env.pods[0];
    let dataplane = env.dataplane(pod);
    // Counted before the hand push: a drift check right after it would otherwise be missed.
    let drifts_before = metric(&api, "haptic_drift_detections_total").await?;
    env::push_raw_at_current_version(&dataplane, &env::config_routing_to(&env.backends[1]), PushMode::Reload).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&api, "haptic_drift_detections_total").await? <= drifts_before {
        ensure!(Instant::now() < deadline, "the drift was not detected\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    controller.wait_all_in_sync(env.pods.len(), Duration::from_secs(30)).await?;
    let raw = dataplane.raw_configuration().await?.text;
    ensure!(raw.contains("backend ingress_traced"), "the drifted pod got the desired configuration back");

    // Failure: a configuration HAProxy refuses is validated on every pod, pushed to none,
    // reported on the configuration, and the pods keep serving the last good one.
    let configs: Api<haptic::config::HAProxyTemplateConfig> = Api::namespaced(client.clone(), &namespace);
    let refused =
        kube::api::Patch::Merge(json!({"spec": {"templates": {"haproxyConfig": "global\n    bogus-keyword\n"}}}));
    configs.patch("test", &kube::api::PatchParams::default(), &refused).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = configs.get_status("test").await?.status.unwrap_or_default();
        let rejected = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Validated" && c.status == "False" && c.message.contains("bogus-keyword"));
        if rejected && metric(&api, "haptic_pods{state=\"Validating\"}").await? == env.pods.len() as f64 {
            break;
        }
        ensure!(Instant::now() < deadline, "the refusal was not reported: {status:?}\n{}", controller.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let raw = dataplane.raw_configuration().await?.text;
    ensure!(
        raw.contains("backend ingress_traced") && !raw.contains("bogus-keyword"),
        "a refused configuration was pushed"
    );
    Ok(())
}

#[tokio::test]
async fn a_new_leader_adopts_pods_in_sync_without_a_single_reload() -> Result<()> {
    let env = env::environment();
    let _pods = env::exclusive_pods().await;
    let (_client, namespace) = setup("fleet-live-leader").await?;
    let election = |identity: &str| Launch::elected("live", identity);
    let dir_a = tempfile::tempdir()?;
    let journal_a = dir_a.path().join("journal");
    let a = ControllerProcess::launch(env, &namespace, "test", dir_a, &journal_a, &election("a"))?;
    a.wait_all_in_sync(env.pods.len(), Duration::from_secs(60)).await?;
    let dir_b = tempfile::tempdir()?;
    let journal_b = dir_b.path().join("journal");
    let b = ControllerProcess::launch(env, &namespace, "test", dir_b, &journal_b, &election("b"))?;
    let api_b = b.api_url().await?;
    b.wait_for_config("B's render", Duration::from_secs(30), |cfg| cfg.contains("backend")).await?;
    let mut writes = Vec::new();
    for pod in &env.pods {
        writes.push(env.writes(pod).await?);
    }
    let a_log = a.log_tail();
    drop(a.kill());
    b.wait_all_in_sync(env.pods.len(), Duration::from_secs(30)).await?;
    for (pod, before) in env.pods.iter().zip(writes) {
        let after = env.writes(pod).await?;
        ensure!(
            after == before,
            "{}: the new leader wrote to a pod that was in sync ({before:?} → {after:?})\nA: {}\nB: {}",
            pod.name,
            a_log,
            b.log_tail()
        );
    }
    ensure!(metric(&api_b, "haptic_reloads_total").await? == 0.0, "the new leader caused reloads");
    Ok(())
}
